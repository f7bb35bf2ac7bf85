"""`scaleladder report`: one page with the figures and the table, as HTML and Markdown.

The page answers, in order: what ran where (site, ladder, provenance), which strategy
wins for each model size, what each figure shows, and every rung's numbers. Figures are
linked by relative path, so the page and its plots/ folder move together (the HTML
embeds nothing; it opens from the results folder in any browser).
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from scaleladder import markdown as md
from scaleladder.figures import registry
from scaleladder.figures.rungs import RungAttrs, batch_of, fixed_batch, interval, is_max, is_ok, is_oom, memory_measured, model_order, num, on_cpu
from scaleladder.figures.style import knobs_label, max_batch_label, strategy_label
from scaleladder.files import atomic_write_text
from scaleladder.results.aggregate import read_ladder
from scaleladder.results.record import (
    Build,
    Compile,
    Corrupt,
    FailedAttempt,
    Host,
    Interval,
    LadderFile,
    Loader,
    MaxBatch,
    Memory,
    Oom,
    Placement,
    Provenance,
    Read,
    Record,
    Repeats,
    Spec,
    Startup,
    Throughput,
)
from scaleladder.results.stats import overlap

NOISE_NOTE = ("Strategies next to each other in throughput whose 95% intervals overlap, or that have none: "
              "their order in the figures is not a result (docs/metrics.md, 'uncertainty').")


def figures_in(plot_dir: str) -> list[str]:
    """The figures the page shows (registry.py's ``report`` rows): the ladder's (``plots``
    draws them), then the others where the plots folder has them (the planner's)."""
    return [r.name for r in registry.rows() if r.report
            and (r.drawn_by == "plots" or os.path.exists(os.path.join(plot_dir, f"{r.name}.png")))]

CI_COLUMN = "items_per_s_ci"  # not an attribute: the interval's two ends in one cell
#: The table of every rung: a record attribute (results/record.py) or CI_COLUMN, and its heading.
COLUMNS: list[tuple[str, str]] = [
    (Spec.spec, "run spec"),
    (Record.status, "status"),
    (Build.world_size, "GPUs"),
    (Spec.batch, "local batch"),
    (Throughput.items_per_s, "items/s"),
    (CI_COLUMN, "items/s 95% interval"),
    (Throughput.samples_per_s, "samples/s"),
    (Throughput.mfu, "MFU"),
    (Memory.peak_reserved_gib, "peak reserved GiB"),
    (Memory.peak_active_gib, "peak active GiB"),
    (Memory.alloc_retries, "alloc retries"),
    # compiled rungs only: the warm-up's excess over steady state (docs/metrics.md), outside the window
    (Compile.compile_s, "compile s"),
    # rank 0's seconds from its process start to its first batch (rung/startup.py; docs/metrics.md, "Start-up")
    (Startup.startup_s, "start-up s"),
    # multi-node rungs: which host (and address) held which ranks, and the rendezvous used
    (Placement.rank_placement, "where ranks ran"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ladder", required=True, help="the aggregated HDF5 (results/ladder.h5)")
    parser.add_argument("--plots", required=True, help="folder holding the figures from `scaleladder plots`")
    parser.add_argument("--html", help="write the HTML page here")
    parser.add_argument("--md", help="write the Markdown page here")
    parser.add_argument("--converge", nargs="*", default=[], metavar="H5",
                        help="convergence records (`scaleladder converge`): adds the 'Accuracy kept' section")


def _fmt(key: str, v: Any) -> str:
    if v is None or v == "":
        return "-"
    x = num(v)
    if x is None:
        return "-" if isinstance(v, float) else str(v)  # NaN: not measured for this rung (compile_s of an eager one)
    if key == Throughput.mfu:
        return f"{100 * x:.1f}%"
    if key in (Build.world_size, Memory.alloc_retries) or float(x).is_integer() and key not in (Throughput.items_per_s,
                                                                                               Throughput.samples_per_s):
        return f"{int(x)}" if float(x).is_integer() else f"{x:.2f}"
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.2f}"


def placement_cell(r: RungAttrs) -> str:
    """``host (addr): ranks a-b; ...; master addr:port`` from a record's ``rank_placement``
    (rung.provenance.rank_placement), nodes in node-index order; "-" where the record has
    none (records written before it existed, predicted-oom rungs)."""
    raw = r.get(Placement.rank_placement)
    try:
        ranks = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return "-"
    if not ranks:
        return "-"
    nodes: dict[tuple[int, str, str], list[int]] = defaultdict(list)
    for p in ranks:
        nodes[(int(p.get("node", 0)), str(p.get("host", "?")), str(p.get("addr", "")))].append(int(p.get("rank", -1)))
    parts = []
    for (_, host, addr), rs in sorted(nodes.items()):
        span = f"rank {rs[0]}" if len(rs) == 1 else (f"ranks {min(rs)}-{max(rs)}" if max(rs) - min(rs) + 1 == len(rs)
                                                      else "ranks " + ",".join(map(str, sorted(rs))))
        parts.append(f"{host} ({addr}): {span}" if addr else f"{host}: {span}")
    master = f"; master {r.get(Placement.master_addr) or r.get(Placement.master_host, '?')}:{r.get(Placement.master_port, '?')}"
    return "; ".join(parts) + master


MEMORY_COLUMNS = (Memory.peak_reserved_gib, Memory.peak_active_gib, Memory.alloc_retries)


def _cell(r: RungAttrs, key: str) -> str:
    if key == Placement.rank_placement:
        return placement_cell(r)
    if key == CI_COLUMN:
        ci = interval(r)
        reps = f" ({r[Repeats.repeats]} runs)" if num(r.get(Repeats.repeats)) and r[Repeats.repeats] > 1 else ""
        if not ci:
            return "-"
        # a step-time interval reaching 0 bounds the rate from below only (results/stats.py)
        hi = f"no upper bound ({r.get(Interval.ci_steps, '?')} steps)" if math.isinf(ci[1]) else _fmt(Throughput.items_per_s, ci[1])
        return f"[{_fmt(Throughput.items_per_s, ci[0])}, {hi}]{reps}"
    if key in MEMORY_COLUMNS and not memory_measured(r):
        return "-"  # a CPU rung records 0 bytes: no allocator statistics, not an empty device
    if key == Spec.batch and str(r.get(Read.spec_batch)) == "max":
        return f"max = {r.get(MaxBatch.max_batch, r.get(Spec.batch, '?'))}"
    if key == Record.status and r.get(Record.status) != "ok":
        return str(r.get(Record.status))
    return _fmt(key, r.get(key))


def distinguishable(a: RungAttrs, b: RungAttrs) -> str:
    """'' when the 95% throughput intervals of ``a`` and ``b`` are apart; else why the
    ranking of the two means nothing: they overlap, or one has no interval."""
    names = f"{strategy_label(a[Spec.strategy])} vs {strategy_label(b[Spec.strategy])}"
    verdict = overlap(interval(a) or (float("nan"),) * 2, interval(b) or (float("nan"),) * 2)
    if verdict is None:
        return f"{names}: no interval to tell them apart (too few steps; run more, or repeats)"
    return f"{names}: not distinguishable at this noise" if verdict else ""


def within_noise(rungs: list[RungAttrs]) -> list[str]:
    """Per model, node count, local batch, precision and knobs: each pair of strategies
    next to each other in throughput order whose intervals overlap (or are unknown)."""
    groups: dict[tuple[str, ...], list[RungAttrs]] = defaultdict(list)
    for r in rungs:
        if is_ok(r):
            key = (r[Spec.model], str(r.get(Spec.nodes, 1)), str(r.get(Read.spec_batch, r.get(Spec.batch))), str(r.get(Spec.precision)),
                   str(r.get(Spec.knobs)))
            groups[key].append(r)
    lines = []
    for (model, nodes, batch, precision, knobs), rs in sorted(groups.items()):
        ranked = sorted(rs, key=lambda r: -r[Throughput.items_per_s])
        for a, b in zip(ranked, ranked[1:]):
            if why := distinguishable(a, b):
                lines.append(f"{model}, {nodes} node(s), batch {batch}, {precision}, {knobs}: {why}")
    return lines


INPUT_NOTE = ("These rungs trained on shards (--data) and their steps waited for the loader's next batch for more than "
              "3% of the timed step time (rung/feed.py): their throughput measures the input pipeline as well as the "
              "model. More loader workers per rank, or --decode gpu, in the site profile's loader block (docs/data.md).")


def _loader_could_help(r: RungAttrs) -> bool:
    """False for a CPU rung with no loader workers: its ranks decode their own batches on the
    cores they train on, so the wait is the decode itself and the advice (more workers, GPU
    decode) has no spare cores or GPU to use; a CPU ladder's every rung would carry the advice."""
    return not on_cpu(r) or bool(num(r.get(Loader.loader_workers)))


def input_note(rungs: list[RungAttrs]) -> str:
    """The advice above the input-bound lines, only where some rung could take it."""
    return INPUT_NOTE if any(_loader_could_help(r) for r in rungs if bool(r.get(Loader.input_bound, False))) else ""


def input_bound(rungs: list[RungAttrs]) -> list[str]:
    """The rungs whose record says ``input_bound`` (loader wait > 3% of the timed step time), one
    line each where a loader could have helped; the CPU rungs with no workers in one line."""
    bound = [r for r in _sorted_rungs(rungs) if is_ok(r) and bool(r.get(Loader.input_bound, False))]
    lines = []
    if cpu := [r for r in bound if not _loader_could_help(r)]:
        waits = [100 * w for r in cpu if (w := num(r.get(Loader.loader_wait_fraction))) is not None]
        span = f" ({min(waits):.0f}-{max(waits):.0f}% of their step time)" if waits else ""
        lines.append(f"{len(cpu)} rung(s) ran on the CPU with no loader workers and waited for batches{span}: expected "
                     "there, since each rank decodes its own batches on the cores it trains on; not listed one by one.")
    for r in bound:
        if not _loader_could_help(r):
            continue
        rate: Any = r.get(Loader.loader_samples_per_s)  # Any: float() only where num() says it is a number
        lines.append(f"{r.get(Spec.spec, r.get(Spec.model))}: waited {100 * float(r.get(Loader.loader_wait_fraction, math.nan)):.1f}% of "
                     f"its step time for batches (decode {r.get(Loader.decode_path, '?')}, {r.get(Loader.loader_workers, '?')} "
                     f"worker(s) per rank" + (f", loader {float(rate):.0f} samples/s per rank" if num(rate) else "") + ")")
    return lines


WINNERS_NOTE = ("Per model and node count: the fastest strategy at the fixed local batch the ladder compares them at, "
                "and the fastest at its own max batch (each rung's max-batch search), each with its peak reserved memory "
                "per GPU (what decides an out-of-memory); the largest batch any strategy reached. '-' for memory: not "
                "measured (a CPU keeps no allocator peaks).")


def memory_cell(r: RungAttrs | None) -> str:
    """A rung's peak reserved memory per GPU, or '-' where there is none to show: no rung, a
    CPU rung (it records 0 bytes: no allocator statistics), an OOM."""
    x = num(r.get(Memory.peak_reserved_gib)) if r is not None and memory_measured(r) else None
    return "-" if x is None else f"{x:.1f} GiB"


def _fastest(rs: list[RungAttrs], batch: str) -> str:
    """"DDP: 350.6 items/s at batch 4 (knobs)" for the fastest of ``rs``, with the noise caveat
    against the best other strategy; '-' when none trained. ``batch`` says which batch."""
    fastest = max(rs, key=lambda r: r[Throughput.items_per_s], default=None)
    if fastest is None:
        return "-"
    others = [r for r in rs if r[Spec.strategy] != fastest[Spec.strategy]]
    runner_up = max(others, key=lambda r: r[Throughput.items_per_s], default=None)
    caveat = distinguishable(fastest, runner_up) if runner_up else ""
    knobs = str(fastest.get(Spec.knobs))
    extra = "" if knobs in ("pre-lag", "pf0") else f" ({knobs_label(knobs)})"  # each generation's default knobs go unsaid
    return (f"{strategy_label(fastest[Spec.strategy])}{extra}: {_fmt(Throughput.items_per_s, fastest[Throughput.items_per_s])} "
            f"items/s at batch {batch or max_batch_label(fastest)}" + (f"; {caveat}" if caveat else ""))


def _largest(rs: list[RungAttrs]) -> str:
    """The largest max batch of ``rs``'s searches, and every strategy that reached it (on a CPU
    all of them stop at the search cap: a tie, not a winner)."""
    found = [r for r in rs if is_max(r) and r.get(Record.status) == "ok" and num(r.get(MaxBatch.max_batch))]
    top = max((num(r.get(MaxBatch.max_batch)) or 0 for r in found), default=None)
    if top is None:
        return "-"
    tied = [r for r in found if num(r.get(MaxBatch.max_batch)) == top]
    capped = any(r.get(MaxBatch.maxbatch_capped) for r in tied)
    names = ", ".join(sorted({strategy_label(r[Spec.strategy]) for r in tied}))
    return f"{int(top)}{' (the search cap: a lower bound)' if capped else ''}: {names}"


def winners(rungs: list[RungAttrs]) -> list[dict[str, str]]:
    """The report's first table: per model and node count, the fastest strategy at the fixed
    batch and the fastest at its max batch, never mixed (a max-batch rung's rate is not the
    fixed batch's), each with its peak memory per GPU; the largest batch; which
    strategies ran out of memory."""
    groups: dict[tuple[str, int], list[RungAttrs]] = defaultdict(list)
    for r in rungs:
        groups[(r[Spec.model], int(r.get(Spec.nodes, 1)))].append(r)
    rows = []
    order = model_order(rungs)
    for model, nodes in sorted(groups, key=lambda k: (order.index(k[0]), k[1])):
        rs = groups[(model, nodes)]
        b = fixed_batch(rs)
        at_b = [r for r in rs if is_ok(r) and batch_of(r) == b]
        at_max = [r for r in rs if is_ok(r) and is_max(r)]
        best_b = max(at_b, key=lambda r: r[Throughput.items_per_s], default=None)
        best_max = max(at_max, key=lambda r: r[Throughput.items_per_s], default=None)
        rows.append({
            "model": model,
            "nodes": str(nodes),
            "fastest at the fixed batch": _fastest(at_b, str(b)) if b is not None else "-",
            "its peak memory per GPU": memory_cell(best_b),
            "fastest at its max batch": _fastest(at_max, ""),
            "its peak memory per GPU (max batch)": memory_cell(best_max),
            "largest batch": _largest(rs),
            "out of memory": ", ".join(sorted({strategy_label(r[Spec.strategy]) for r in rs if is_oom(r)})) or "-",
        })
    return rows


def _summary(rungs: list[RungAttrs], root: dict[str, Any]) -> list[tuple[str, str]]:
    prov = {}
    try:
        prov = json.loads(root.get(LadderFile.provenance, "{}"))
    except (TypeError, json.JSONDecodeError):
        pass
    counts = json.loads(root.get(LadderFile.status_counts, "{}") or "{}") if isinstance(root.get(LadderFile.status_counts), str) else {}
    devices = sorted({str(r.get(Placement.device_name)) for r in rungs if r.get(Placement.device_name)})
    return [
        ("site", str(prov.get("site", "-"))),
        ("rungs", f"{len(rungs)} ({', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or '-'})"),
        ("steps per rung", f"{prov.get('steps', '-')} ({prov.get('warmup', '-')} warm-up steps excluded)"),
        ("runs per rung", f"{prov.get('repeats', 1)} (repeats; the intervals: docs/metrics.md, 'Uncertainty')"),
        ("devices", ", ".join(devices) or "-"),
        ("torch", ", ".join(sorted({str(r.get(Provenance.torch_version)) for r in rungs if r.get(Provenance.torch_version)})) or "-"),
        ("scaleladder", f"{root.get(LadderFile.scaleladder_version, '-')} (git {str(root.get(LadderFile.git_commit, ''))[:12] or '-'})"),
        ("aggregated", str(root.get(LadderFile.created_utc, "-"))),
        ("combinations skipped", str(len(prov.get("skipped", []))) if prov else "-"),
    ]


HOST_NOTE = ("These rungs ran on a GPU that waited for the host: the host took at least 90% of the device's step to "
             "issue it (host_boundness, docs/metrics.md) while the device had caught up with it at step starts: their "
             "throughput measures Python, the dispatcher, autograd and the wrapper's hooks, not the strategy. What "
             "lowers the host's share: -compile (one graph per block), a larger batch (the same host work for more "
             "device work), -sac in place of -ac (no re-run of the whole layer's forward), FSDP1 with "
             "use_orig_params=False; benchmarks/bench_host.py measures a rung's host work on the CPU.")


def _host_advice(r: RungAttrs) -> str:
    """What may move this host-bound rung's host work off the critical path (HOST_NOTE says why)."""
    strategy = str(r.get(Spec.strategy, ""))
    tips = [] if strategy.endswith("-compile") else ["-compile"]
    tips.append("a larger batch")
    if "-ac" in strategy:
        tips.append("-sac instead of -ac")
    if str(r.get(Spec.wrapper, "")) == "fsdp":
        tips.append("use_orig_params=False")
    return ", ".join(tips)


def host_bound(rungs: list[RungAttrs]) -> list[str]:
    """The rungs whose record says ``host_bound`` (GPU rungs: rung.loop.host_attrs), one line each."""
    lines = []
    for r in _sorted_rungs(rungs):
        if not (is_ok(r) and bool(r.get(Host.host_bound, False))):
            continue
        issue, step = num(r.get(Host.host_issue_median_s)), num(r.get(Throughput.step_time_median_s))
        took = f": the host took {issue * 1e3:.1f} ms to issue a {step * 1e3:.1f} ms step" if issue and step else ""
        boundness: Any = r.get(Host.host_boundness)  # a host_bound record carries it (rung.loop.host_attrs)
        lines.append(f"{r.get(Spec.spec, r.get(Spec.model))}: host_boundness {float(boundness):.2f}{took}; "
                     f"try {_host_advice(r)}")
    return lines


def corrupt(rungs: list[RungAttrs]) -> list[str]:
    """Rungs whose file could not be read (results.aggregate), each with the command that redoes it."""
    return [f"{r[Spec.spec]}: {r.get(Oom.error, 'unreadable')}; redo it with: {r.get(Corrupt.redo, '-')}"
            for r in sorted(rungs, key=lambda r: r[Spec.spec]) if r.get(Record.status) == "corrupt"]


CORRUPT_NOTE = "These rung files could not be read, so the figures leave them out; the other rungs are unaffected."


def _sorted_rungs(rungs: list[RungAttrs]) -> list[RungAttrs]:
    order = model_order(rungs)
    return sorted(rungs, key=lambda r: (order.index(r[Spec.model]), int(r.get(Spec.nodes, 1)), r[Spec.spec]))


#: above this many rungs the report summarises them per model and links the table (results/rungs.csv)
EVERY_RUNG_MAX = 500
#: a list section (within noise, input- or host-bound) shows this many lines, then counts the rest
LIST_MAX = 50
TABLE_LINK = "rungs.csv"  # beside the report: the workflow's `export` rule writes it
EVERY_RUNG_NOTE = "An OOM rung is a result: its metrics are absent, not zero."


def capped(lines: list[str], limit: int = LIST_MAX) -> list[str]:
    """``lines``, at most ``limit`` of them, then one counting the rest."""
    return lines if len(lines) <= limit else [*lines[:limit], f"... and {len(lines) - limit} more (every rung: {TABLE_LINK})"]


def per_model(rungs: list[RungAttrs]) -> tuple[list[str], list[list[str]]]:
    """A ladder too long to list: per model, its rungs by status and its fastest rung."""
    statuses = sorted({str(r.get(Record.status)) for r in rungs})
    rows = []
    for model in sorted({str(r.get(Spec.model)) for r in rungs}):
        mine = [r for r in rungs if str(r.get(Spec.model)) == model]
        ok = [r for r in mine if str(r.get(Record.status)) == "ok" and isinstance(r.get(Throughput.items_per_s), int | float)]
        best = max(ok, key=lambda r: float(r[Throughput.items_per_s]), default=None)
        fastest = f"{float(best[Throughput.items_per_s]):.1f} ({best[Spec.spec]})" if best else "-"
        rows.append([model, str(len(mine)), *[str(sum(str(r.get(Record.status)) == st for r in mine)) for st in statuses], fastest])
    return ["model", "rungs", *statuses, "fastest items/s (rung)"], rows


def every_rung(rungs: list[RungAttrs]) -> tuple[str, list[str], list[list[str]], bool]:
    """The "Every rung" section: (note, header, rows, per-rung): every rung, or past
    :data:`EVERY_RUNG_MAX` a summary per model and the link to the table of every rung."""
    if len(rungs) <= EVERY_RUNG_MAX:
        return EVERY_RUNG_NOTE, [h for _, h in COLUMNS], [[_cell(r, k) for k, _ in COLUMNS] for r in _sorted_rungs(rungs)], True
    note = (f"{len(rungs)} rungs are too many to list here: below, per model; every rung, with every figure of its "
            f"record, is in {TABLE_LINK} (`scaleladder export --ladder results/ladder.h5 --out rungs.csv`). " + EVERY_RUNG_NOTE)
    header, rows = per_model(rungs)
    return note, header, rows, False


def render_markdown(rungs: list[RungAttrs], root: dict[str, Any], plot_rel: str, figures: Sequence[str] | None = None) -> str:
    """``figures``: the names to show (default: the ladder's, registry.names("plots"))."""
    out = ["# scaleladder report", ""]
    out += md.table(None, _summary(rungs, root)) + [""]
    if bad := corrupt(rungs):
        out += ["## Corrupt rung files", "", CORRUPT_NOTE, ""] + [f"- {line}" for line in bad] + [""]
    out += ["## Which strategy for which model", "", WINNERS_NOTE, ""]
    w = winners(rungs)
    if w:
        out += md.dict_table(w)
    out += [""]
    noise = within_noise(rungs)
    if noise:
        out += ["## Differences within noise", "", NOISE_NOTE, ""] + [f"- {line}" for line in capped(noise)] + [""]
    if slow := input_bound(rungs):
        out += ["## Input-bound rungs", "", *([input_note(rungs), ""] if input_note(rungs) else [])] + [f"- {line}" for line in capped(slow)] + [""]
    if busy := host_bound(rungs):
        out += ["## Host-bound rungs", "", HOST_NOTE, ""] + [f"- {line}" for line in capped(busy)] + [""]
    for name in registry.names("plots") if figures is None else figures:
        title = registry.title(name)
        out += [f"## {title}", "", f"![{title}]({plot_rel}/{name}.png)", f"([PDF]({plot_rel}/{name}.pdf))", ""]
    note, header, rows, _each = every_rung(rungs)
    out += ["## Every rung", "", note.replace(TABLE_LINK, f"[{TABLE_LINK}]({TABLE_LINK})", 1), ""]
    out += md.table(header, rows)
    return "\n".join(out) + "\n"


def render_html(rungs: list[RungAttrs], root: dict[str, Any], plot_rel: str, figures: Sequence[str] | None = None) -> str:
    """``figures``: the names to show (default: the ladder's, registry.names("plots"))."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>scaleladder report</title>",
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "th{background:#f3f3f3}tr.oom td{color:#c0392b}img{max-width:100%;border:1px solid #eee}"
        "figure{margin:2em 0}</style></head><body>",
        "<h1>scaleladder report</h1><table>",
    ]
    parts += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _summary(rungs, root)]
    parts.append("</table>")
    if bad := corrupt(rungs):
        parts.append(f"<h2>Corrupt rung files</h2><p>{e(CORRUPT_NOTE)}</p><ul>")
        parts += [f"<li>{e(line)}</li>" for line in bad]
        parts.append("</ul>")
    parts.append(f"<h2>Which strategy for which model</h2><p>{e(WINNERS_NOTE)}</p>")
    w = winners(rungs)
    if w:
        keys = list(w[0])
        parts.append("<table><tr>" + "".join(f"<th>{e(k)}</th>" for k in keys) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{e(row[k])}</td>" for k in keys) + "</tr>" for row in w]
        parts.append("</table>")
    noise = within_noise(rungs)
    if noise:
        parts.append(f"<h2>Differences within noise</h2><p>{e(NOISE_NOTE)}</p><ul>")
        parts += [f"<li>{e(line)}</li>" for line in capped(noise)]
        parts.append("</ul>")
    if slow := input_bound(rungs):
        parts.append(f"<h2>Input-bound rungs</h2><p>{e(input_note(rungs))}</p><ul>")
        parts += [f"<li>{e(line)}</li>" for line in capped(slow)]
        parts.append("</ul>")
    if busy := host_bound(rungs):
        parts.append(f"<h2>Host-bound rungs</h2><p>{e(HOST_NOTE)}</p><ul>")
        parts += [f"<li>{e(line)}</li>" for line in capped(busy)]
        parts.append("</ul>")
    for name in registry.names("plots") if figures is None else figures:
        src, title = f"{plot_rel}/{name}.png", registry.title(name)
        parts.append(f"<figure><h2>{e(title)}</h2><img src='{e(src)}' alt='{e(title)}'>"
                     f"<figcaption><a href='{e(plot_rel)}/{name}.pdf'>PDF</a></figcaption></figure>")
    note, header, rows, each = every_rung(rungs)
    link = f"<a href='{e(TABLE_LINK)}'>{e(TABLE_LINK)}</a>"
    parts.append(f"<h2>Every rung</h2><p>{e(note).replace(e(TABLE_LINK), link, 1)}</p><table><tr>")
    parts += [f"<th>{e(h)}</th>" for h in header]
    parts.append("</tr>")
    classes = [" class='oom'" if is_oom(r) else "" for r in _sorted_rungs(rungs)] if each else [""] * len(rows)
    parts += [f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for cls, row in zip(classes, rows)]
    parts.append("</table>")
    knob_note = ", ".join(sorted({f"{k} = {knobs_label(k)}" for k in {str(r.get(Spec.knobs)) for r in rungs} if "-" in k}))
    if knob_note:
        parts.append(f"<p><small>FSDP knobs in run specs: {e(knob_note)}.</small></p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def with_budget(text: str, ladder: str, html_page: bool) -> str:
    """The report plus a "Budget" section: ``scaleladder budget --out results/budget.md`` beside
    the ladder file, shown as written (what the campaign costs, its node-hours and sources)."""
    path = os.path.join(os.path.dirname(os.path.abspath(ladder)), "budget.md")
    if not os.path.exists(path):
        return text
    with open(path) as f:
        body = f.read()
    if html_page:
        return text.replace("</body></html>", f"<h2>Budget</h2>\n<pre>{html.escape(body)}</pre>\n</body></html>")
    return text + "\n## Budget\n\n" + body


def failed_attempts(ladder: str) -> list[dict[str, Any]]:
    """Every failed attempt noted in ``failed/`` beside the ladder (campaign.supervise.note_failure),
    oldest first, each with whether the rung has a result now."""
    from scaleladder.results.export import failure_notes

    root = os.path.dirname(os.path.abspath(ladder))
    out: list[dict[str, Any]] = []
    for spec, notes in failure_notes(os.path.join(root, "failed")).items():
        redone = os.path.isfile(os.path.join(root, "rungs", f"{spec}.h5"))
        out += [{**e, "redone": redone} for e in notes]
    return sorted(out, key=lambda e: str(e.get(FailedAttempt.when, "")))


def with_failures(text: str, ladder: str, html_page: bool) -> str:
    """The report plus a "Failed attempts" section, when any rung of this results folder failed
    before (a lost node, a crash): each attempt's time and one-line reason, and whether it was redone."""
    rows = failed_attempts(ladder)
    if not rows:
        return text
    lines = [f"{r.get(FailedAttempt.when, '?')} {r.get(Spec.spec, '?')}: {r.get(FailedAttempt.reason, '?')}"
             + ("; redone since" if r["redone"] else "; no result yet") for r in rows]
    if html_page:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        return text.replace("</body></html>", f"<h2>Failed attempts</h2>\n<ul>{items}</ul>\n</body></html>")
    return text + "\n## Failed attempts\n\n" + "".join(f"- {line}\n" for line in lines)


def main(args: argparse.Namespace) -> int:
    if not (args.html or args.md):
        print("scaleladder report: error: give --html and/or --md", file=sys.stderr)
        return 2
    if not os.path.exists(args.ladder):
        print(f"scaleladder report: error: no ladder file {args.ladder}", file=sys.stderr)
        return 2
    rungs, root = read_ladder(args.ladder)
    for out, render in ((args.html, render_html), (args.md, render_markdown)):
        if out:
            rel = os.path.relpath(args.plots, os.path.dirname(os.path.abspath(out)) or ".")
            text = render(rungs, root, rel, figures_in(args.plots))
            if args.converge:  # the section lives with its figure (figures/convergence.py)
                from scaleladder.figures.convergence import read_records, with_section

                text = with_section(text, read_records(args.converge), rel, html_page=render is render_html)
            text = with_budget(text, args.ladder, html_page=render is render_html)
            text = with_failures(text, args.ladder, html_page=render is render_html)
            atomic_write_text(out, text, fsync=True)  # a full disk: one line naming the file, no tmp left
            print(f"scaleladder report: {out}")
    return 0
