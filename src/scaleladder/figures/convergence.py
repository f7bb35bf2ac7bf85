"""Accuracy kept: throughput beside time-to-accuracy, per convergence rung.

The Fabric seed's bar chart put each configuration's runtime beside its accuracy, so a
faster configuration that learns less cannot pass unnoticed. Here, from the records of
``scaleladder converge`` (one per rung and seed), three panels share one row per rung
(strategy x precision):

* training throughput (samples/s, all ranks; eval excluded);
* time to the target held-out accuracy (training seconds, eval excluded);
* the held-out accuracy the rung ended with, beside the target line.

A rung that did not reach the target within its step budget is a result, not a gap: a
red cross sits where its time-to-target bar would be, labelled with the best accuracy it
reached, and its accuracy bar is red. Several seeds of one rung: the bar is the median,
each seed a dot.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from matplotlib.figure import Figure

from scaleladder import markdown as md
from scaleladder.figures import registry
from scaleladder.figures.style import OOM_COLOR, strategy_label
from scaleladder.results.record import Build, Convergence, Placement, Read, Record, Settings, Spec, Throughput

MISSED = "did-not-converge"
PRECISION_ORDER = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16-true")


def read_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Each convergence record's attributes, plus its evaluation curve (``eval_step``,
    ``eval_accuracy``, ``eval_train_s``) and ``path``."""
    out = []
    for p in paths:
        with h5py.File(p, "r") as f:
            r: dict[str, Any] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            if r.get(Convergence.kind) != "convergence":
                raise ValueError(f"{p}: not a convergence record (kind={r.get(Convergence.kind)!r}); see `scaleladder converge`")
            r[Read.eval_step] = f["eval/step"][()]
            r[Read.eval_accuracy] = f["eval/test_accuracy"][()]
            r[Read.eval_train_s] = f["eval/train_s"][()]
        r[Read.path] = str(p)
        out.append(r)
    return out


def rung_label(r: dict[str, Any]) -> str:
    return f"{strategy_label(str(r[Spec.strategy]))} · {r[Spec.precision]}"


def _key(r: dict[str, Any]) -> tuple[int, str, int]:
    prec = str(r[Spec.precision])
    return (int(r.get(Build.world_size, 1)), str(r[Spec.strategy]), PRECISION_ORDER.index(prec) if prec in PRECISION_ORDER else 99)


def grouped(records: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Rows of the figure and the report: (label, that rung's records over seeds), in a
    stable order (world, strategy, precision)."""
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(str(r[Spec.model]), str(r[Spec.strategy]), str(r[Spec.precision]), str(r.get(Spec.batch)))].append(r)
    rows = sorted(groups.values(), key=lambda rs: _key(rs[0]))
    return [(rung_label(rs[0]), sorted(rs, key=lambda r: int(r.get(Settings.seed, 0)))) for rs in rows]


def fig_convergence(records: Sequence[dict[str, Any]]) -> Figure:
    rows = grouped(records)
    height = max(2.5, 0.45 * len(rows) + 1.6)
    fig = Figure(figsize=(15, height), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    if not rows:
        for ax in axes:
            ax.text(0.5, 0.5, "no convergence rungs", ha="center", va="center", transform=ax.transAxes)
        return fig
    y = np.arange(len(rows))
    labels = [label for label, _ in rows]
    targets = sorted({float(r[Convergence.target]) for _, rs in rows for r in rs})
    first = rows[0][1][0]
    budget_max = max(int(r[Convergence.step_budget]) for _, rs in rows for r in rs)
    longest_s = 0.0
    for i, (_, rs) in enumerate(rows):
        ok = [r for r in rs if r[Record.status] != MISSED]
        thr = [float(r[Throughput.samples_per_s]) for r in rs]
        axes[0].barh(i, float(np.median(thr)), color="#4c72b0")
        axes[0].plot(thr, [i] * len(thr), "k.", ms=4)
        if ok:
            tt = [float(r[Convergence.time_to_target_s]) for r in ok]
            longest_s = max(longest_s, max(tt))
            axes[1].barh(i, float(np.median(tt)), color="#55a868")
            axes[1].plot(tt, [i] * len(tt), "k.", ms=4)
        acc = [float(r[Convergence.final_test_accuracy]) for r in rs]
        axes[2].barh(i, float(np.median(acc)), color=OOM_COLOR if len(ok) < len(rs) else "#55a868")
        axes[2].plot(acc, [i] * len(acc), "k.", ms=4)
    # Did-not-converge marks go at the right edge of the time axis, once its extent is known.
    edge = longest_s * 1.05 if longest_s > 0 else 1.0
    for i, (_, rs) in enumerate(rows):
        missed = [r for r in rs if r[Record.status] == MISSED]
        if missed:
            best = max(float(r[Convergence.best_test_accuracy]) for r in missed)
            axes[1].plot([edge], [i], "x", color=OOM_COLOR, ms=10, mew=2.5)
            axes[1].annotate(f"did not converge ({len(missed)}/{len(rs)} seeds; best {best:.3f})", (edge, i),
                             xytext=(-6, 0), textcoords="offset points", ha="right", va="center", color=OOM_COLOR, fontsize=8)
    for t in targets:
        axes[2].axvline(t, color="k", ls="--", lw=1)
        axes[2].annotate(f"target {t:g}", (t, len(rows) - 0.5), xytext=(3, 0), textcoords="offset points", fontsize=8)
    axes[0].set_yticks(y, labels)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("training throughput (samples/s, all ranks; eval excluded)")
    axes[1].set_xlabel("time to target accuracy (training s; eval excluded)")
    axes[1].set_xlim(0, edge * 1.02)
    axes[2].set_xlabel("held-out accuracy at the end")
    axes[2].set_xlim(0, 1)
    global_batches = sorted({int(r[Spec.batch]) * int(r.get(Build.world_size, 1)) for _, rs in rows for r in rs})
    fig.suptitle(f"Accuracy kept: {first[Spec.model]}, global batch {', '.join(map(str, global_batches))}, lr {float(first[Settings.lr]):g}, "
                 f"target {', '.join(f'{t:g}' for t in targets)} within {budget_max} steps; "
                 f"{first.get(Placement.device_name, '')} ({len(records)} runs)")
    return fig


def summary_rows(records: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """One table row per rung for the report: its verdict first."""
    out = []
    for label, rs in grouped(records):
        missed = [r for r in rs if r[Record.status] == MISSED]
        tt = [float(r[Convergence.time_to_target_s]) for r in rs if r[Record.status] != MISSED]
        st = [int(r[Convergence.steps_to_target]) for r in rs if r[Record.status] != MISSED]
        out.append({
            "rung": label,
            "ranks": str(int(rs[0].get(Build.world_size, 1))),
            "verdict": "FAILING: did not converge" if missed else "ok",
            "seeds reaching target": f"{len(rs) - len(missed)}/{len(rs)}",
            "target": f"{float(rs[0][Convergence.target]):g}",
            "final held-out accuracy": ", ".join(f"{float(r[Convergence.final_test_accuracy]):.3f}" for r in rs),
            "steps to target (median)": f"{int(np.median(st))}" if st else "—",
            "time to target s (median)": f"{float(np.median(tt)):.1f}" if tt else "—",
            "samples/s (median)": f"{float(np.median([float(r[Throughput.samples_per_s]) for r in rs])):.1f}",
        })
    return out


def failing(records: Sequence[dict[str, Any]]) -> list[str]:
    """The rungs that did not converge, as report lines."""
    return [f"{row['rung']}: did not reach {row['target']} held-out accuracy "
            f"(final {row['final held-out accuracy']}; {row['seeds reaching target']} seeds reached it)"
            for row in summary_rows(records) if row["verdict"] != "ok"]



def add_arguments(parser: Any) -> None:
    parser.add_argument("records", nargs="+", help="convergence records (.h5) from `scaleladder converge`")
    parser.add_argument("--out-dir", required=True, help="folder for convergence.png and convergence.pdf")


def main(args: Any) -> int:
    import os
    import sys

    from scaleladder.figures.style import save_figure

    missing = [p for p in args.records if not os.path.isfile(p)]
    if missing:
        print(f"scaleladder converge-plots: error: no record {missing[0]}", file=sys.stderr)
        return 2
    records = read_records(args.records)
    os.makedirs(args.out_dir, exist_ok=True)
    fig = fig_convergence(records)
    for ext in ("png", "pdf"):
        print(f"scaleladder converge-plots: {save_figure(fig, os.path.join(args.out_dir, f'convergence.{ext}'))}")
    for line in failing(records):
        print(f"FAILING: {line}", file=sys.stderr)
    return 0


# -- the report's section -----------------------------------------------------------------

SECTION_TITLE = registry.title("convergence")  # the figure table's title for it
SECTION_NOTE = ("Each convergence rung trains until its held-out accuracy reaches the target or its step budget "
                "runs out; times exclude evaluation (docs/metrics.md, 'Convergence rungs'). A rung that does not "
                "reach the target is a failing result: a faster rung that stopped learning is not faster.")


def section_markdown(records: Sequence[dict[str, Any]], plot_rel: str) -> str:
    rows = summary_rows(records)
    out = [f"## {SECTION_TITLE}", "", SECTION_NOTE, ""]
    out += [f"- **FAILING** {line}" for line in failing(records)] + ([""] if failing(records) else [])
    out += [f"![{SECTION_TITLE}]({plot_rel}/convergence.png)", f"([PDF]({plot_rel}/convergence.pdf))", ""]
    if rows:
        out += md.dict_table(rows)
    return "\n".join(out) + "\n"


def section_html(records: Sequence[dict[str, Any]], plot_rel: str) -> str:
    import html

    e = html.escape
    rows = summary_rows(records)
    parts = [f"<h2>{e(SECTION_TITLE)}</h2><p>{e(SECTION_NOTE)}</p>"]
    fails = failing(records)
    if fails:
        parts.append("<ul>" + "".join(f"<li style='color:{OOM_COLOR}'><b>FAILING</b> {e(line)}</li>" for line in fails) + "</ul>")
    parts.append(f"<figure><img src='{e(plot_rel)}/convergence.png' alt='{e(SECTION_TITLE)}'>"
                 f"<figcaption><a href='{e(plot_rel)}/convergence.pdf'>PDF</a></figcaption></figure>")
    if rows:
        keys = list(rows[0])
        parts.append("<table><tr>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr>")
        for row in rows:
            cls = " class='oom'" if row["verdict"] != "ok" else ""
            parts.append(f"<tr{cls}>" + "".join(f"<td>{e(row[k])}</td>" for k in keys) + "</tr>")
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def with_section(page: str, records: Sequence[dict[str, Any]], plot_rel: str, html_page: bool) -> str:
    """The report page with the convergence section: in HTML before the closing tags, in
    Markdown at the end."""
    if html_page:
        head, sep, tail = page.rpartition("</body>")
        return (head + section_html(records, plot_rel) + sep + tail) if sep else page + section_html(records, plot_rel)
    return page.rstrip("\n") + "\n\n" + section_markdown(records, plot_rel)
