"""`scaleladder plan`: predict per-GPU memory and the largest local batch, before any run.

The planner is analytic: it never touches a GPU. It replays one training step of the
runner (forward, backward, foreach AdamW) as a timeline of allocations on the busiest
rank, for any model × strategy × precision × local batch × nodes × GPUs per node ×
device, and reports the peak, a breakdown, whether it fits and the largest batch that
does. The pieces live in ``scaleladder.planner`` (see its docstring and docs/planner.md).

Uses: ``scaleladder launch --plan-device`` records rungs predicted not to fit as
``predicted-oom`` (supervise.py); ``scaleladder maxbatch`` starts its search at the
predicted max batch; ``--fits-table`` / ``--fits-chart`` show what fits where.

Public API: :func:`predict`, :class:`Prediction`, :data:`DEVICES`,
:func:`static_bytes_per_rank`, :func:`fits_table`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from dataclasses import dataclass
from typing import Any

from scaleladder.models.flavors import FLAVORS
from scaleladder.planner.memory import (
    COMM_LIB_BYTES,
    CONTEXT_BYTES,
    DEVICES,
    FRAGMENTATION,
    GIB,
    Prediction,
    predict,
)
from scaleladder.planner.static import static_bytes_per_rank
from scaleladder.spec import (
    DEFAULT_KNOBS,
    RunSpec,
    SpecError,
    parse_batch,
    parse_knobs,
    parse_positive,
    parse_precision,
    parse_strategy,
)

__all__ = ["DEVICES", "Prediction", "predict", "static_bytes_per_rank", "fits_table", "FitsCell",
           "CONTEXT_BYTES", "COMM_LIB_BYTES", "FRAGMENTATION", "TABLE_STRATEGIES"]

# The ladder a fits table shows, cheapest-memory last.
TABLE_STRATEGIES = ("single", "ddp", "fsdp-no-shard", "fsdp-hybrid2", "fsdp-grad-op", "fsdp-full", "fsdp-full-ac")


@dataclass(frozen=True)
class FitsCell:
    model: str
    strategy: str
    fits: bool | None  # None: the strategy cannot run on this world (single on 8 ranks, a hybrid group that does not divide it)
    max_batch: int | None
    peak_bytes: int | None  # at the requested batch (or at max_batch when none was requested)
    reason: str = ""


def fits_table(device: str, nodes: int, gpus_per_node: int, precision: str = "bf16-mixed", batch: int | None = None,
               models: list[str] | None = None, strategies: tuple[str, ...] = TABLE_STRATEGIES) -> list[FitsCell]:
    """What fits where: every model × strategy on ``nodes`` × ``gpus_per_node`` ranks of ``device``.

    With ``batch``, a cell fits when that local batch fits; without, when batch 1 does,
    and ``max_batch`` says how far it goes.
    """
    world = nodes * gpus_per_node
    models = models or [m for m, f in FLAVORS.items() if not f.debug]
    cells = []
    for m in models:
        for s in strategies:
            strat = parse_strategy(s)
            try:
                strat.check_world(world)
            except SpecError as e:
                cells.append(FitsCell(m, s, None, None, None, str(e)))
                continue
            spec = RunSpec(m, strat, precision, parse_knobs(DEFAULT_KNOBS), nodes, batch if batch is not None else "max")
            p = predict(spec, world, gpus_per_node, device)
            fits = p.fits if batch is not None else p.max_batch is not None
            cells.append(FitsCell(m, s, fits, p.max_batch, p.peak_bytes))
    return cells


# -- CLI -----------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", help="model/strategy/precision/knobs/n<nodes>/b<batch> (b'max': predict the max batch)")
    p.add_argument("--device", required=True, help=f"device key: {', '.join(DEVICES)}")
    p.add_argument("--gpus-per-node", default="8", help="ranks per node (default 8)")
    p.add_argument("--fits-table", action="store_true", help="print what fits where: model × strategy")
    p.add_argument("--fits-chart", metavar="OUT.png", help="draw the what-fits-where chart")
    p.add_argument("--nodes", default="1", help="nodes, for --fits-table/--fits-chart (default 1)")
    p.add_argument("--precision", default="bf16-mixed", help="precision for --fits-table/--fits-chart (default bf16-mixed)")
    p.add_argument("--batch", default=None, help="local batch for --fits-table/--fits-chart (default: report the max batch)")
    p.add_argument("--vs-measured", metavar="OUT.png", help="draw predicted against measured peak memory of --rungs")
    p.add_argument("--rungs", nargs="*", default=[], help="rung HDF5 files for --vs-measured")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _gib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def _print_prediction(p: Prediction) -> None:
    print(f"{p.spec} on {p.world} × {p.device} ({p.ranks_per_node} per node), local batch {p.batch}")
    for k in ("params", "grads", "optimizer", "activations", "buffers", "inputs"):
        print(f"  {k:12s} {_gib(p.breakdown.get(k, 0)):>12s}")
    print(f"  {'= peak':12s} {_gib(p.peak_bytes):>12s}   (torch active_bytes.all.peak; at {p.phase})")
    print(f"  {'+ overhead':12s} {_gib(p.breakdown.get('overhead', 0)):>12s}   (fragmentation {FRAGMENTATION:.0%}, "
          f"context {_gib(CONTEXT_BYTES)}, comm library {_gib(COMM_LIB_BYTES if p.world > 1 else 0)})")
    cap = "unlimited" if p.capacity_bytes is None else _gib(p.capacity_bytes)
    print(f"  {'= required':12s} {_gib(p.required_bytes):>12s}   of {cap}: {'fits' if p.fits else 'DOES NOT FIT'}")
    mb = "unbounded" if p.capacity_bytes is None else ("none (not even batch 1)" if p.max_batch is None else str(p.max_batch))
    print(f"  max local batch: {mb}")


def _print_table(cells: list[FitsCell], title: str) -> None:
    strategies = list(dict.fromkeys(c.strategy for c in cells))
    models = list(dict.fromkeys(c.model for c in cells))
    print(title)
    print(f"{'model':12s} " + " ".join(f"{s:>14s}" for s in strategies))
    by = {(c.model, c.strategy): c for c in cells}
    for m in models:
        row = []
        for s in strategies:
            c = by[(m, s)]
            row.append("n/a" if c.fits is None else ("-" if not c.fits else (f"max {c.max_batch}" if c.max_batch else "fits")))
        print(f"{m:12s} " + " ".join(f"{x:>14s}" for x in row))
    print("cells: 'max N' = fits, largest local batch N; '-' = predicted OOM; n/a = strategy impossible on this world")


def main(args: argparse.Namespace) -> int:
    if args.device not in DEVICES:
        raise SpecError(f"unknown device {args.device!r}; expected one of {', '.join(DEVICES)}")
    gpus = parse_positive("gpus-per-node", args.gpus_per_node)
    if args.vs_measured:
        from scaleladder.plan_plots import points_from_rungs, predicted_vs_measured

        missing = [r for r in args.rungs if not Path(r).is_file()]
        if not args.rungs or missing:
            raise SpecError(f"--vs-measured needs existing --rungs files; missing: {missing[0] if missing else '(none given)'}")
        points = points_from_rungs(args.rungs, args.device)
        predicted_vs_measured(points, args.vs_measured, f"planner vs measurement ({args.device})")
        if args.json:
            print(json.dumps([pt.__dict__ for pt in points], indent=1))
        return 0
    if args.fits_table or args.fits_chart:
        if args.spec:
            raise SpecError("--spec and --fits-table/--fits-chart are separate modes; give one")
        nodes = parse_positive("nodes", args.nodes)
        precision = parse_precision(args.precision)
        parsed = None if args.batch is None else parse_batch(args.batch)
        batch = parsed if isinstance(parsed, int) else None  # 'max' = report the max batch
        cells = fits_table(args.device, nodes, gpus, precision, batch)
        if args.fits_chart:
            from scaleladder.plan_plots import fits_chart

            fits_chart(cells, args.fits_chart, f"{args.device}, {nodes}×{gpus} ranks, {precision}"
                       + (f", local batch {batch}" if batch else ""))
        if args.json:
            print(json.dumps([c.__dict__ for c in cells], indent=1))
        elif args.fits_table or not args.fits_chart:
            _print_table(cells, f"what fits on {nodes} node(s) × {gpus} {args.device}, {precision}"
                         + (f", local batch {batch}" if batch else ""))
        return 0
    if not args.spec:
        raise SpecError("give --spec (or --fits-table / --fits-chart)")
    spec = RunSpec.from_path(args.spec)
    p = predict(spec, spec.nodes * gpus, gpus, args.device)
    if args.json:
        out: dict[str, Any] = p.as_dict()
        print(json.dumps(out, indent=1))
    else:
        _print_prediction(p)
    return 0

