"""`scaleladder plots`: the figures, drawn from an aggregated ladder file.

Five figures, each as PNG and PDF, each readable without the docs (titles say what was
held fixed, axes carry units, every strategy keeps one colour in every figure):

* ``throughput_by_model``  FLAVA seed, Figure 1: throughput per model size and strategy,
  at a fixed local batch (8 when the ladder has it) and at the max batch.
* ``max_batch``            FLAVA seed, Figure 2: the largest local batch per strategy and size.
* ``fsdp_knobs``           ViT seed, Figure 1: throughput for sharding strategy x backward
  prefetch x limit_all_gathers.
* ``weak_scaling``         ViT seed, Figures 2-3: throughput against nodes with the ideal
  linear line, and peak memory per GPU against nodes, one row per model.
* ``pareto``               none of the seeds: throughput against peak memory per model, with
  the Pareto front, i.e. the strategies worth considering for a given memory budget.

A rung that ran out of memory (status ``oom``) is a result: it is drawn as a red "OOM"
cross where its bar or point would be; a rung the planner predicted would not fit and
that was therefore not run (``predicted-oom``) gets a hollow red circle marked
"pred. OOM", so a prediction is never mistaken for a measurement. A rung the ladder does not
have is simply absent, and a figure whose rungs are all absent says so in its panel
instead of failing, so partial ladders plot.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on cluster nodes and CI; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from scaleladder.results.aggregate import read_ladder  # noqa: E402
from scaleladder.models.flavors import FLAVORS  # noqa: E402

Rung = dict[str, Any]
FIGURES: tuple[str, ...] = ("throughput_by_model", "max_batch", "fsdp_knobs", "weak_scaling", "pareto")
OOM_STATUSES = ("oom", "predicted-oom")
OOM_COLOR = "#c0392b"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ladder", required=True, help="the aggregated HDF5 (results/ladder.h5)")
    parser.add_argument("--out-dir", required=True, help="folder for <figure>.png and <figure>.pdf")
    parser.add_argument("--only", nargs="*", choices=FIGURES, help="draw only these figures")


# -- what a rung says ---------------------------------------------------------------------


def is_ok(r: Rung) -> bool:
    return r.get("status") == "ok" and _num(r.get("items_per_s")) is not None


def is_oom(r: Rung) -> bool:
    return r.get("status") in OOM_STATUSES


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def family(model: str) -> str:
    f = FLAVORS.get(model)
    return f.family if f else "other"


def throughput_label(fam: str) -> str:
    # The FLAVA seed counts items (an image and a text are two); the ViT seed, images.
    # Always the GLOBAL rate, summed over every GPU of the run (docs/metrics.md).
    what = {"flava": "items/s: images + texts", "vit": "images/s"}.get(fam, "items/s")
    return f"global throughput ({what}, all GPUs)"


def model_order(rungs: Iterable[Rung]) -> list[str]:
    """Models by size: parameter count where measured, else the registry's order."""
    names = {r["model"] for r in rungs}
    registry = list(FLAVORS)
    params: dict[str, float] = {}
    for r in rungs:
        p = _num(r.get("params"))
        if p:
            params[r["model"]] = p
    return sorted(names, key=lambda m: (params.get(m, math.inf), registry.index(m) if m in registry else 1e9, m))


def strategy_label(s: str) -> str:
    ac = s.endswith("-ac")
    base = s.removesuffix("-ac")
    if base.startswith("fsdp-hybrid"):
        g = base.removeprefix("fsdp-hybrid")
        text = f"HYBRID {g} GPU{'s' if g != '1' else ''}"
    else:
        text = {
            "single": "single process",
            "ddp": "DDP",
            "fsdp-full": "FSDP FULL_SHARD",
            "fsdp-grad-op": "FSDP SHARD_GRAD_OP",
            "fsdp-no-shard": "FSDP NO_SHARD",
        }.get(base, base)
    return text + (" + AC" if ac else "")


def knobs_label(k: str) -> str:
    parts = k.split("-") + ["lag"]
    prefetch = {"pre": "BACKWARD_PRE", "post": "BACKWARD_POST", "none": "no prefetch"}.get(parts[0], parts[0])
    lag = "limit_all_gathers" if parts[1] == "lag" else "no limit_all_gathers"
    return f"{prefetch}, {lag}" + (", forward prefetch" if "fwd" in parts[2:] else "")


def model_label(m: str, rungs: list[Rung]) -> str:
    p = next((_num(r.get("params")) for r in rungs if r["model"] == m and _num(r.get("params"))), None)
    return f"{m}\n({p / 1e6:,.0f}M)" if p and p >= 1e6 else (f"{m}\n({p:,.0f})" if p else m)


class Palette:
    """One colour per strategy, the same in every figure."""

    def __init__(self, rungs: list[Rung]) -> None:
        order = sorted({r["strategy"] for r in rungs}, key=_strategy_sort_key)
        cmap = plt.get_cmap("tab10" if len(order) <= 10 else "tab20")
        self.colors = {s: cmap(i % cmap.N) for i, s in enumerate(order)}
        self.order = order

    def __call__(self, strategy: str) -> Any:
        return self.colors.get(strategy, "grey")


def _strategy_sort_key(s: str) -> tuple[int, int, str]:
    base = s.removesuffix("-ac")
    rank = ["single", "ddp", "fsdp-no-shard", "fsdp-grad-op", "fsdp-full"]
    if base.startswith("fsdp-hybrid"):
        return (len(rank), int(base.removeprefix("fsdp-hybrid") or 0), s)
    return (rank.index(base) if base in rank else len(rank) + 1, 0, s)


def _most_common(values: Iterable[Any], prefer: Any = None) -> Any:
    c = Counter(values)
    if not c:
        return None
    if prefer is not None and prefer in c:
        return prefer
    return c.most_common(1)[0][0]


def _fixed(r: Rung) -> bool:
    return str(r.get("spec_batch", r.get("batch"))) != "max"


def _is_max(r: Rung) -> bool:
    return not _fixed(r)


def _batch(r: Rung) -> int | None:
    b = str(r.get("spec_batch", r.get("batch")))
    return int(b) if b.isdigit() else None


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=10, color="dimgrey", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _oom_style(r: Rung) -> dict[str, Any]:
    """Measured OOM: a red cross. Predicted (never run): a hollow red circle."""
    if r.get("status") == "predicted-oom":
        return {"marker": "o", "markerfacecolor": "none", "markeredgecolor": OOM_COLOR, "color": OOM_COLOR}
    return {"marker": "x", "color": OOM_COLOR}


def oom_label(r: Rung) -> str:
    return "pred. OOM" if r.get("status") == "predicted-oom" else "OOM"


def _oom_mark(ax: Axes, x: float, r: Rung) -> None:
    """A red 'OOM' (or 'pred. OOM') standing on the axis where a bar would be."""
    ax.plot([x], [0], markersize=8, mew=2, clip_on=False, zorder=5, **_oom_style(r))
    ax.annotate(
        oom_label(r), (x, 0), xytext=(0, 6), textcoords="offset points", rotation=90, ha="center", va="bottom",
        color=OOM_COLOR, fontsize=7, fontweight="bold",
    )


def _oom_handles(rungs: Iterable[Rung]) -> list[Any]:
    """Legend entries for the kinds of OOM this ladder has (a measured one always shows)."""
    from matplotlib.lines import Line2D

    handles: list[Any] = [Line2D([], [], linestyle="", mew=2, label="out of memory (measured)", **_oom_style({}))]
    if any(r.get("status") == "predicted-oom" for r in rungs):
        handles.append(Line2D([], [], linestyle="", mew=2, label="predicted not to fit (not run)",
                              **_oom_style({"status": "predicted-oom"})))
    return handles


def max_batch_label(r: Rung) -> str:
    # a search stopped by its cap (always, on a CPU) found a lower bound, not the max
    mb = r.get("max_batch", r.get("batch", "?"))
    return f"≥{mb} (cap)" if r.get("maxbatch_capped") else f"{mb}"


def _held_fixed(rs: list[Rung], keys: tuple[str, ...]) -> str:
    parts = []
    for k in keys:
        vals = sorted({str(r.get(k)) for r in rs})
        if len(vals) == 1:
            v = vals[0]
            if k == "nodes":
                v = f"{v} node{'s' if v != '1' else ''}"
            elif k == "knobs" and v.count("-") >= 1:
                v = knobs_label(v)
            parts.append(v)
    return ", ".join(parts)


def _slice(rungs: list[Rung], **fixed: Any) -> list[Rung]:
    return [r for r in rungs if all(str(r.get(k)) == str(v) for k, v in fixed.items())]


def _reference(rungs: list[Rung]) -> dict[str, Any]:
    """The values of the dimensions a figure does not plot: the seeds' own defaults
    (BACKWARD_PRE + limit_all_gathers, the smallest node count) where the ladder has them."""
    return {
        "precision": _most_common((r.get("precision") for r in rungs), prefer="bf16-mixed"),
        "knobs": _most_common((r.get("knobs") for r in rungs), prefer="pre-lag"),
        "nodes": min((int(r.get("nodes", 1)) for r in rungs), default=1),
    }


# -- the bar charts (FLAVA seed) ------------------------------------------------------------


def _grouped_bars(
    ax: Axes,
    rs: list[Rung],
    models: list[str],
    strategies: list[str],
    palette: Palette,
    value: Callable[[Rung], float | None],
    annotate: Callable[[Rung], str] | None = None,
) -> None:
    width = 0.8 / max(1, len(strategies))
    for j, s in enumerate(strategies):
        for i, m in enumerate(models):
            x = i - 0.4 + width * (j + 0.5)
            match = [r for r in rs if r["model"] == m and r["strategy"] == s]
            if not match:
                continue
            r = match[0]
            v = value(r)
            if is_oom(r) or (v is not None and v <= 0 and r.get("status") == "ok"):
                _oom_mark(ax, x, r)
            elif v is not None:
                ax.bar(x, v, width * 0.95, color=palette(s), edgecolor="black", linewidth=0.4)
                if annotate:
                    ax.annotate(annotate(r), (x, v), xytext=(0, 2), textcoords="offset points", ha="center",
                                va="bottom", fontsize=6)
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels([model_label(m, rs) for m in models], fontsize=8)
    ax.set_xlim(-0.6, len(models) - 0.4)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def _legend(fig: Figure, palette: Palette, strategies: list[str], rungs: list[Rung]) -> None:
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(facecolor=palette(s), edgecolor="black", label=strategy_label(s)) for s in strategies]
    handles += _oom_handles(rungs)
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)


def _families(rungs: list[Rung]) -> list[str]:
    return sorted({family(r["model"]) for r in rungs}) or ["other"]


def fig_throughput_by_model(rungs: list[Rung], palette: Palette) -> Figure:
    fams = _families(rungs)
    fig, axes = plt.subplots(len(fams), 2, figsize=(12, 4.2 * len(fams) + 0.8), squeeze=False)
    shown: list[Rung] = []
    for row, fam in enumerate(fams):
        rs_fam = [r for r in rungs if family(r["model"]) == fam]
        ref = _reference(rs_fam)
        rs_fam = _slice(rs_fam, precision=ref["precision"], knobs=ref["knobs"], nodes=ref["nodes"])
        fixed_batches = sorted({b for r in rs_fam if (b := _batch(r)) is not None})
        b_ref = 8 if 8 in fixed_batches else (fixed_batches[0] if fixed_batches else None)
        models = model_order(rs_fam)
        strategies = [s for s in palette.order if any(r["strategy"] == s for r in rs_fam)]
        panels = [
            (f"local batch {b_ref}" if b_ref else "fixed local batch", [r for r in rs_fam if _batch(r) == b_ref and b_ref]),
            ("max local batch", [r for r in rs_fam if _is_max(r)]),
        ]
        for col, (what, rs) in enumerate(panels):
            ax = axes[row][col]
            held = _held_fixed(rs or rs_fam, ("precision", "nodes"))
            ax.set_title(f"{fam.upper()}: {what}" + (f"  ({held})" if held else ""), fontsize=10)
            if not rs:
                _note(ax, f"no {fam} rungs at {what} in this ladder")
                continue
            shown += rs
            _grouped_bars(
                ax, rs, models, strategies, palette,
                value=lambda r: _num(r.get("items_per_s")),
                annotate=(lambda r: f"b{'' if r.get('maxbatch_capped') else '='}{max_batch_label(r)}") if _is_max(rs[0]) else None,
            )
            ax.set_ylabel(throughput_label(fam))
    fig.suptitle("Training throughput per model size and strategy", fontsize=12)
    _legend(fig, palette, [s for s in palette.order if any(r["strategy"] == s for r in shown)] or palette.order, shown)
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    return fig


def fig_max_batch(rungs: list[Rung], palette: Palette) -> Figure:
    fams = _families(rungs)
    fig, axes = plt.subplots(len(fams), 1, figsize=(9, 4 * len(fams) + 0.8), squeeze=False)
    for row, fam in enumerate(fams):
        ax = axes[row][0]
        rs_fam = [r for r in rungs if family(r["model"]) == fam and _is_max(r)]
        ref = _reference(rs_fam) if rs_fam else {}
        rs = _slice(rs_fam, **ref) if rs_fam else []
        held = _held_fixed(rs, ("precision", "nodes"))
        ax.set_title(f"{fam.upper()}: largest local batch that trains" + (f"  ({held})" if held else ""), fontsize=10)
        if not rs:
            _note(ax, f"no max-batch rungs for {fam} in this ladder")
            continue
        models = model_order(rs)
        strategies = [s for s in palette.order if any(r["strategy"] == s for r in rs)]

        def mb(r: Rung) -> float | None:
            return _num(r.get("max_batch")) if r.get("status") == "ok" else None

        _grouped_bars(ax, rs, models, strategies, palette, value=mb, annotate=max_batch_label)
        ax.set_ylabel("max local batch (samples per GPU)")
    fig.suptitle("Max local batch per strategy and model size", fontsize=12)
    maxed = [r for r in rungs if _is_max(r)]
    _legend(fig, palette, sorted({r["strategy"] for r in maxed}, key=_strategy_sort_key) or palette.order, maxed)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return fig


# -- FSDP knobs (ViT seed, Figure 1) -------------------------------------------------------


def fig_fsdp_knobs(rungs: list[Rung], palette: Palette) -> Figure:
    fig, ax = plt.subplots(figsize=(12, 5))
    fsdp = [r for r in rungs if str(r.get("strategy", "")).startswith("fsdp") and _fixed(r)]
    # The setting (model, nodes, batch, precision) whose FSDP rungs vary the knobs most.
    groups: dict[tuple[Any, ...], list[Rung]] = defaultdict(list)
    for r in fsdp:
        groups[(r["model"], int(r.get("nodes", 1)), _batch(r), r.get("precision"))].append(r)
    if not groups:
        _note(ax, "no FSDP rungs at a fixed batch in this ladder")
        ax.set_title("Throughput by FSDP sharding strategy and communication knobs", fontsize=11)
        return fig
    key = max(groups, key=lambda k: (len({r["knobs"] for r in groups[k]}), len(groups[k]), k[1]))
    rs = groups[key]
    model, nodes, batch, precision = key
    knob_values = sorted({r["knobs"] for r in rs}, key=lambda k: (k.split("-")[0] != "pre", k))
    strategies = sorted({r["strategy"] for r in rs}, key=_strategy_sort_key)
    cmap = plt.get_cmap("Set2")
    width = 0.8 / max(1, len(knob_values))
    for j, k in enumerate(knob_values):
        for i, s in enumerate(strategies):
            x = i - 0.4 + width * (j + 0.5)
            match = [r for r in rs if r["strategy"] == s and r["knobs"] == k]
            if not match:
                continue
            r = match[0]
            if is_oom(r):
                _oom_mark(ax, x, r)
            elif is_ok(r):
                # hatching tells limit_all_gathers apart even in greyscale print
                ax.bar(x, r["items_per_s"], width * 0.95, color=cmap(j % 8), edgecolor="black", linewidth=0.4,
                       hatch="" if "-lag" in f"-{k}" and "nolag" not in k else "//", label=None)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=cmap(j % 8), edgecolor="black", hatch="" if "nolag" not in k else "//",
                     label=knobs_label(k)) for j, k in enumerate(knob_values)]
    handles += _oom_handles(rs) if any(is_oom(r) for r in rs) else []
    # outside the axes: inside, it covered the tallest (HYBRID) bars
    ax.legend(handles=handles, fontsize=8, title="backward prefetch, all-gathers", title_fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_xticks(range(len(strategies)))
    ax.set_xticklabels([strategy_label(s) for s in strategies], fontsize=9)
    ax.set_ylabel(throughput_label(family(model)))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    note = "" if len(knob_values) > 1 else "  (this ladder varies no knob here)"
    ax.set_title(
        f"{model}, {nodes} node{'s' if nodes != 1 else ''}, local batch {batch}, {precision}: "
        f"throughput by FSDP sharding and knobs{note}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


# -- weak scaling (ViT seed, Figures 2-3) ----------------------------------------------------


def fig_weak_scaling(rungs: list[Rung], palette: Palette) -> Figure:
    fixed = [r for r in rungs if _fixed(r)]
    ref = _reference(fixed) if fixed else {}
    # The batch the scaling study uses: the fixed batch with the most node counts.
    by_batch: dict[int | None, set[int]] = defaultdict(set)
    for r in fixed:
        by_batch[_batch(r)].add(int(r.get("nodes", 1)))
    batch = max(by_batch, key=lambda b: (len(by_batch[b]), b or 0)) if by_batch else None
    rs = [r for r in _slice(fixed, precision=ref.get("precision"), knobs=ref.get("knobs")) if _batch(r) == batch]
    models = model_order(rs)
    fig, axes = plt.subplots(max(1, len(models)), 2, figsize=(12, 3.4 * max(1, len(models)) + 1), squeeze=False)
    if not rs:
        _note(axes[0][0], "no fixed-batch rungs in this ladder")
        _note(axes[0][1], "")
        return fig
    node_counts = sorted({int(r["nodes"]) for r in rs})
    for row, m in enumerate(models):
        ax_t, ax_m = axes[row]
        rm = [r for r in rs if r["model"] == m]
        for s in [s for s in palette.order if any(r["strategy"] == s for r in rm)]:
            pts = sorted((int(r["nodes"]), r) for r in rm if r["strategy"] == s)
            ok = [(n, r) for n, r in pts if is_ok(r)]
            if ok:
                xs = [n for n, _ in ok]
                ax_t.plot(xs, [r["items_per_s"] for _, r in ok], marker="o", color=palette(s), label=strategy_label(s))
                n0, r0 = ok[0]
                ideal = [r0["items_per_s"] * n / n0 for n in node_counts if n >= n0]
                ax_t.plot([n for n in node_counts if n >= n0], ideal, linestyle="--", color=palette(s), alpha=0.6,
                          linewidth=1)
                mem = [(n, _num(r.get("peak_reserved_gib"))) for n, r in ok if _num(r.get("peak_reserved_gib")) is not None]
                if mem:
                    ax_m.plot([n for n, _ in mem], [v for _, v in mem], marker="s", color=palette(s), label=strategy_label(s))
            for n, r in pts:
                if is_oom(r):
                    for ax in (ax_t, ax_m):
                        ax.plot([n], [0], markersize=9, mew=2, clip_on=False, zorder=5, **_oom_style(r))
        for ax in (ax_t, ax_m):
            ax.set_xscale("log", base=2)
            ax.set_xticks(node_counts)
            ax.set_xticklabels([str(n) for n in node_counts])
            ax.set_xlabel("nodes")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        ax_t.set_ylabel(throughput_label(family(m)))
        ax_m.set_ylabel("peak reserved memory per GPU (GiB)")
        ax_t.set_title(f"{m}: weak scaling at local batch {batch} (dashed: ideal linear)", fontsize=10)
        ax_m.set_title(f"{m}: memory per GPU", fontsize=10)
    handles, labels = [], []
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    from matplotlib.lines import Line2D

    handles += [Line2D([], [], color="black", linestyle="--", label="ideal linear scaling"), *_oom_handles(rs)]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=8, frameon=False)
    held = _held_fixed(rs, ("precision", "knobs"))
    fig.suptitle("Weak scaling: throughput and memory per GPU against nodes" + (f" ({held})" if held else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    return fig


# -- Pareto: throughput vs memory (new) ---------------------------------------------------


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, throughput) points no other point beats on both: less memory and more speed."""
    front: list[tuple[float, float]] = []
    for mem, thr in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or thr > front[-1][1]:
            front.append((mem, thr))
    return front


def fig_pareto(rungs: list[Rung], palette: Palette) -> Figure:
    models = model_order(rungs)
    n = max(1, len(models))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows + 1), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    if not models:
        _note(axes[0][0], "no rungs in this ladder")
        return fig
    for ax, m in zip(axes.flat, models):
        # One node count per panel (the model's smallest): memory per GPU and throughput
        # are only comparable between rungs on the same number of GPUs.
        rm = [r for r in rungs if r["model"] == m]
        nodes = min(int(r.get("nodes", 1)) for r in rm)
        rm = _slice(rm, nodes=nodes, precision=_reference(rm)["precision"])
        ok = [r for r in rm if is_ok(r) and _num(r.get("peak_reserved_gib")) is not None]
        for r in ok:
            ax.scatter(r["peak_reserved_gib"], r["items_per_s"], color=palette(r["strategy"]),
                       marker="^" if _is_max(r) else "o", s=40, edgecolor="black", linewidth=0.4, zorder=3)
        front = pareto_front([(r["peak_reserved_gib"], r["items_per_s"]) for r in ok])
        if front:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", linewidth=1, alpha=0.6,
                    zorder=2)
            best = max(ok, key=lambda r: r["items_per_s"])
            ax.text(0.02, 0.97, f"fastest: {strategy_label(best['strategy'])}, batch {best.get('max_batch', best.get('batch'))}",
                    transform=ax.transAxes, ha="left", va="top", fontsize=7,
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
        if ok and max(r["peak_reserved_gib"] for r in ok) <= 0:
            # a CPU run: torch's CUDA allocator saw nothing, so there is no memory axis
            ax.set_xlim(-0.5, 0.5)
            ax.text(0.98, 0.5, "peak memory is not measured\non a CPU (0 GiB)", transform=ax.transAxes, ha="right",
                    va="center", fontsize=8, color="dimgrey")
        ooms = [r for r in rm if is_oom(r)]
        if ooms:
            ax.text(0.02, 0.02, "OOM: " + ", ".join(sorted({f"{strategy_label(r['strategy'])} b{r.get('spec_batch')}"
                                                             + (" (predicted)" if r.get("status") == "predicted-oom" else "")
                                                             for r in ooms}))[:160],
                    transform=ax.transAxes, fontsize=6, color=OOM_COLOR, va="bottom", wrap=True)
        if not ok and not ooms:
            _note(ax, "no measured rungs")
        ax.set_title(f"{m} ({nodes} node{'s' if nodes != 1 else ''})", fontsize=10)
        ax.set_xlabel("peak reserved memory per GPU (GiB)")
        ax.set_ylabel(throughput_label(family(m)))
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D

    strategies = sorted({r["strategy"] for r in rungs if is_ok(r)}, key=_strategy_sort_key)
    handles = [Line2D([], [], color=palette(s), marker="o", linestyle="", label=strategy_label(s)) for s in strategies]
    handles += [
        Line2D([], [], color="grey", marker="o", linestyle="", label="fixed batch"),
        Line2D([], [], color="grey", marker="^", linestyle="", label="max batch"),
        Line2D([], [], color="black", label="Pareto front: nothing is both faster and smaller"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False)
    fig.suptitle("Throughput against peak memory per GPU: which strategy for which memory budget", fontsize=12)
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    return fig


DRAW: dict[str, Callable[[list[Rung], Palette], Figure]] = {
    "throughput_by_model": fig_throughput_by_model,
    "max_batch": fig_max_batch,
    "fsdp_knobs": fig_fsdp_knobs,
    "weak_scaling": fig_weak_scaling,
    "pareto": fig_pareto,
}


def draw_all(rungs: list[Rung], out_dir: str, only: Iterable[str] | None = None) -> list[str]:
    """Write every figure as PNG and PDF; return the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    palette = Palette(rungs)
    written = []
    for name in only or FIGURES:
        fig = DRAW[name](rungs, palette)
        for ext in ("png", "pdf"):
            written.append(save_figure(fig, os.path.join(out_dir, f"{name}.{ext}")))
        plt.close(fig)
    return written


def save_figure(fig: Figure, path: str) -> str:
    """Write through a temporary file and rename, so an interrupted job never leaves a
    half-written figure that Snakemake would take for a finished one."""
    ext = os.path.splitext(path)[1].lstrip(".")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        fig.savefig(tmp, format=ext, dpi=150 if ext in ("png", "jpg") else None)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(args: argparse.Namespace) -> int:
    if not os.path.exists(args.ladder):
        print(f"scaleladder plots: error: no ladder file {args.ladder}", file=sys.stderr)
        return 2
    rungs, _root = read_ladder(args.ladder)
    written = draw_all(rungs, args.out_dir, args.only)
    print(f"scaleladder plots: {len(rungs)} rungs -> {len(written)} files in {args.out_dir}")
    return 0
