"""`scaleladder plan`: predict per-GPU memory and the largest local batch, before any run.

The planner is analytic: it never touches a GPU. It replays one training step of the
runner (forward, backward, its fused AdamW step) as a timeline of allocations on the busiest
rank, for any model × strategy × precision × local batch × nodes × GPUs per node ×
device, and reports the peak, a breakdown, whether it fits and the largest batch that
does. The pieces live in ``scaleladder.planner`` (see its docstring and docs/planner.md).
A model whose family has no analytic model (a models-file model), or any with ``--traced``,
is TRACED instead: torch's memory tracker on fake tensors at two batches, extrapolated
(``campaign/plan_trace.py``; that path imports torch).

Uses: ``scaleladder launch --plan-device`` records rungs predicted not to fit as
``predicted-oom`` (campaign/supervise.py); the workflow does the same while it builds its DAG,
calling :func:`predict` on a login node — so this module and everything it imports
must work WITHOUT torch (tests/test_plan_torchfree.py); ``scaleladder maxbatch`` starts
its search at the predicted max batch; ``--fits-table`` / ``--fits-chart`` show what
fits where; ``--vs-measured`` draws predicted against measured peaks.

Public API: :func:`predict`, :class:`Prediction`, :data:`DEVICES`, :class:`Device`,
:func:`custom_device`, :func:`static_bytes_per_rank`, :func:`fits_table`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder import flavors
from scaleladder.planner.fits import TABLE_STRATEGIES, FitsCell, fits_table, seed_differences
from scaleladder.planner.memory import (
    COMM_LIB_BYTES,
    CONTEXT_BYTES,
    DEVICES,
    FRAGMENTATION,
    GIB,
    Device,
    Prediction,
    custom_device,
    predict,
    resolve_device,
)
from scaleladder.planner.static import static_bytes_per_rank
from scaleladder.planner.step_setup import Variant, input_batches
from scaleladder.spec import (
    RunSpec,
    SpecError,
    parse_batch,
    parse_positive,
    parse_precision,
    parse_strategy,
)

if TYPE_CHECKING:
    from scaleladder.campaign.plan_trace import NotTraced, TracedPlan

__all__ = ["DEVICES", "Device", "Prediction", "predict", "custom_device", "static_bytes_per_rank", "fits_table",
           "FitsCell", "CONTEXT_BYTES", "COMM_LIB_BYTES", "FRAGMENTATION", "TABLE_STRATEGIES"]

CHART_FORMATS = (".png", ".pdf", ".svg")  # what matplotlib writes from the file name's suffix

# -- CLI -----------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", help="model/strategy/precision/knobs/n<nodes>/b<batch> (b'max': predict the max batch)")
    p.add_argument("--device", default=None, help=f"device key: {', '.join(DEVICES)}; with --device-gib, any name")
    p.add_argument("--device-gib", default=None, metavar="G",
                   help="plan for a device with G GiB (the total capacity torch reports for it), named by --device")
    p.add_argument("--gpus-per-node", default=None, help="ranks per node (default: the --profile's ranks_per_node, else 8)")
    p.add_argument("--data", default="synthetic",
                   help="the runner's --data: 'synthetic' (its pool of batches on the device) or a shard manifest / "
                        "'loader' (one batch on the device, two for a moment between steps)")
    p.add_argument("--fits-table", action="store_true", help="print what fits where: model × strategy")
    p.add_argument("--fits-chart", metavar="OUT.png", help="draw the what-fits-where chart")
    p.add_argument("--nodes", default="1", help="nodes, for --fits-table/--fits-chart (default 1)")
    p.add_argument("--precision", default="bf16-mixed", help="precision for --fits-table/--fits-chart (default bf16-mixed)")
    p.add_argument("--batch", default=None, help="local batch for --fits-table/--fits-chart (default: report the max batch)")
    p.add_argument("--vs-measured", metavar="OUT.png", help="draw predicted against measured peak memory of --ladder or --rungs (.png, .pdf or .svg)")
    p.add_argument("--ladder", default=None, help="an aggregated ladder file (results/ladder.h5) for --vs-measured")
    p.add_argument("--rungs", nargs="*", default=[], help="rung HDF5 files for --vs-measured")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--profile", default=None,
                   help="a profile folder under profiles/: its links and host factor price the step time (planner/steptime.py); "
                        "its plan_device and ranks_per_node are the defaults of --device and --gpus-per-node")
    p.add_argument("--repo", default=".", help="where profiles/ lies, with --profile (default: here)")
    p.add_argument("--time-chart", metavar="OUT.png",
                   help="with --profile: predicted items/s and memory per GPU against nodes, every strategy of its ladder")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibration file of measured rates (default: the committed one for the device, if any)")
    p.add_argument("--flava-impl", default=None, metavar="IMPL",
                   help="a FLAVA rung's implementation, as `scaleladder run --flava-impl` (default sdpa, the runner's): "
                        "its step time's host work and FLOPs")
    p.add_argument("--torch", default=None, metavar="VERSION",
                   help="the torch the rungs will run under: a --calibration measured under another is refused")
    p.add_argument("--check", action="store_true",
                   help="with --spec: hold the planner against torch's own MemTracker/FSDPMemTracker, two runner steps on "
                        "fake CPU tensors (no GPU; every wrapper on the fake process group at --check-world ranks); both figures "
                        "side by side (campaign/plan_check.py)")
    p.add_argument("--check-world", default="1",
                   help="the world size --check builds at, as rank 0 of it (every wrapper: DDP, FSDP1 and HYBRID's 2-D mesh, "
                        "FSDP2; default 1)")
    p.add_argument("--traced", action="store_true",
                   help="with --spec: the traced memory model even where an analytic one exists (what a model without "
                        "one always gets: torch's tracker on fake tensors at two batches, extrapolated; "
                        "campaign/plan_trace.py), to compare the two")
    p.add_argument("--trace-cache", default=None, metavar="DIR",
                   help="where traces are kept (default: $SCALELADDER_CACHE/plan-traces, else "
                        "$XDG_CACHE_HOME/scaleladder/plan-traces, else ~/.cache/scaleladder/plan-traces)")


def device_from_args(name: str | None, gib: str | None) -> Device:
    """``--device KEY``, or ``--device-gib G`` (named by ``--device``, which may then be anything)."""
    if gib is None:
        if not name:
            raise SpecError(f"give --device (one of {', '.join(DEVICES)}) or --device-gib G")
        return resolve_device(name)
    if name in DEVICES:
        raise SpecError(f"--device {name!r} is a known device with its own capacity; name a custom --device-gib device otherwise")
    return custom_device(name or f"custom-{gib}gib", gib)


def _chart_path(path: str, what: str) -> Path:
    out = Path(path)
    if out.suffix.lower() not in CHART_FORMATS:
        raise SpecError(f"{what} {path!r}: the file name must end in {', '.join(CHART_FORMATS)}")
    return out


def _gib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def _print_prediction(p: Prediction) -> None:
    inputs = input_batches(p.data)
    print(f"{p.spec} on {p.world} × {p.device} ({p.ranks_per_node} per node), local batch {p.batch}, "
          f"data {p.data} ({inputs.resident} batch(es) on the device)")
    for k in ("params", "grads", "optimizer", "activations", "buffers", "inputs"):
        print(f"  {k:12s} {_gib(p.breakdown.get(k, 0)):>12s}")
    print(f"  {'= peak':12s} {_gib(p.peak_bytes):>12s}   (torch active_bytes.all.peak; at {p.phase})")
    print(f"  {'+ overhead':12s} {_gib(p.breakdown.get('overhead', 0)):>12s}   (fragmentation {FRAGMENTATION:.0%}, "
          f"context {_gib(CONTEXT_BYTES)}, comm library {_gib(COMM_LIB_BYTES if p.world > 1 else 0)})")
    cap = "unlimited" if p.capacity_bytes is None else _gib(p.capacity_bytes)
    print(f"  {'= required':12s} {_gib(p.required_bytes):>12s}   of {cap}: {'fits' if p.fits else 'DOES NOT FIT'}")
    mb = "unbounded" if p.capacity_bytes is None else ("none (not even batch 1)" if p.max_batch is None else str(p.max_batch))
    print(f"  max local batch: {mb}")


SEED_DOCS = "docs/planner.md, \"Seed claims, recomputed\""


def _print_table(cells: list[FitsCell], title: str, steps: list[str] | None = None,
                 differ: dict[tuple[str, str], str] | None = None, traced: bool = False) -> None:
    """The table, every number in it a prediction (said in its title and last line); a cell
    where a seed claimed otherwise ends in '*', and each is named under it with where to read why.
    ``traced``: models-file models are in it (their cells from cached traces; 'no trace' without one)."""
    from scaleladder.campaign.plan_trace import NO_TRACE

    differ = differ or {}
    strategies = list(dict.fromkeys(c.strategy for c in cells))
    models = list(dict.fromkeys(c.model for c in cells))
    print(title)
    print(f"{'model':12s} " + " ".join(f"{s:>14s}" for s in strategies))
    by = {(c.model, c.strategy): c for c in cells}
    step = {(c.model, c.strategy): t for c, t in zip(cells, steps or [""] * len(cells))}
    for m in models:
        row = []
        for s in strategies:
            c = by[(m, s)]
            cell = ("no trace" if c.reason == NO_TRACE else "n/a") if c.fits is None else \
                ("-" if not c.fits else (f"max {c.max_batch}" if c.max_batch else "fits"))
            cell += "*" if (m, s) in differ else ""
            row.append(cell + (f" {step[(m, s)]}" if step[(m, s)] and c.fits else ""))
        print(f"{m:12s} " + " ".join(f"{x:>14s}" for x in row))
    print("cells: 'max N' = fits, largest local batch N; '-' = predicted OOM; n/a = strategy impossible on this world"
          + (" (or, for a models-file model, one the fake tensors cannot trace there: FSDP1)" if traced else "")
          + ("; 'no trace' = a models-file model not traced yet (the command below)" if traced else "")
          + ("; then the predicted step time at that batch (scaleladder plan --spec ... for its parts)" if steps else ""))
    if traced:
        print("a models-file model's cells are its cached traces' (campaign/plan_trace.py): memory and FLOPs traced, "
              "communication not modelled")
    print("every cell is the planner's prediction, not a measurement (docs/planner.md; measured against it: "
          "scaleladder plan --vs-measured)")
    if differ:
        print(f"* differs from a seed's claim; {SEED_DOCS} says why:")
        for (m, s), why in differ.items():
            print(f"  {m} {s}: {why}")


def _vs_measured(args: argparse.Namespace, device: Device) -> int:
    from scaleladder.figures.plan_plots import points_from_ladder, points_from_rungs, predicted_vs_measured

    out = _chart_path(args.vs_measured, "--vs-measured")
    if bool(args.ladder) == bool(args.rungs):
        raise SpecError("--vs-measured needs either --ladder results/ladder.h5 or --rungs FILES")
    sources = [args.ladder] if args.ladder else args.rungs
    missing = [r for r in sources if not Path(r).is_file()]
    if missing:
        raise SpecError(f"--vs-measured: no such file: {missing[0]}")
    untraced: list[tuple[NotTraced, int]] = []
    points = points_from_ladder(args.ladder, device, untraced) if args.ladder else points_from_rungs(args.rungs, device, untraced)
    predicted_vs_measured(points, out, f"planner vs measurement ({device.name}, {len(points)} rungs)")
    if args.json:
        print(json.dumps([pt.__dict__ for pt in points], indent=1))
    for rpn in sorted({r for _, r in untraced}):  # one line per ranks per node the rungs ran at (a trace's world)
        print(_untraced_note([m for m, r in untraced if r == rpn], device, rpn, args, "rung(s)", "--vs-measured"), file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    """``--check``: the planner and torch's memory tracker, side by side, for one spec (no device needed:
    the peak does not depend on the capacity)."""
    from scaleladder.campaign.plan_check import measure

    if not args.spec:
        raise SpecError("--check needs --spec")
    spec = RunSpec.from_path(args.spec)
    if not _analytic(spec):
        raise SpecError(f"--check holds the analytic planner against torch's tracker, and {spec.model} has no analytic "
                        "model: its plan (scaleladder plan --spec ...) is the tracker's own, traced")
    c = measure(spec, parse_positive("check-world", args.check_world))
    if args.json:
        print(json.dumps({**c.__dict__, "error": c.error}, indent=1))
    else:
        print("\n".join(c.lines()))
    return 0


def _profile_defaults(args: argparse.Namespace) -> None:
    """``--profile`` gives ``--device`` (its plan_device) and ``--gpus-per-node`` (its ranks_per_node)
    where they are not given."""
    if not getattr(args, "profile", None) or (args.device and args.gpus_per_node):
        return
    from scaleladder.site.profiles import load_profile

    site = load_profile(args.profile, Path(getattr(args, "repo", ".")).resolve()).site
    if not args.device and not args.device_gib and site.get("plan_device"):
        args.device = site["plan_device"]
    if not args.gpus_per_node and isinstance(site.get("ranks_per_node"), int):
        args.gpus_per_node = str(site["ranks_per_node"])


def _time_chart(args: argparse.Namespace, device: Device, gpus: int) -> int:
    from scaleladder.site.plan_time import time_chart

    missing: list[NotTraced] = []
    pts = time_chart(args, device, gpus, _chart_path(args.time_chart, "--time-chart"), missing)
    if args.json:
        print(json.dumps([pt.__dict__ for pt in pts], indent=1))
    if missing:
        print(_untraced_note(missing, device, gpus, args, "point(s)", "--time-chart"), file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    if getattr(args, "check", False):
        return _check(args)
    _profile_defaults(args)
    device = device_from_args(args.device, args.device_gib)
    gpus = parse_positive("gpus-per-node", args.gpus_per_node or "8")
    if args.vs_measured:
        return _vs_measured(args, device)
    if getattr(args, "time_chart", None):
        return _time_chart(args, device, gpus)
    from scaleladder.site.plan_time import cell_step, memory_model, step_fields, step_lines, timing_from_args

    timing = timing_from_args(args, device.name)
    if args.fits_table or args.fits_chart:
        if args.spec:
            raise SpecError("--spec and --fits-table/--fits-chart are separate modes; give one")
        nodes = parse_positive("nodes", args.nodes)
        precision = parse_precision(args.precision)
        parsed = None if args.batch is None else parse_batch(args.batch)
        batch = parsed if isinstance(parsed, int) else None  # 'max' = report the max batch
        chart = _chart_path(args.fits_chart, "--fits-chart") if args.fits_chart else None
        cells = fits_table(device, nodes, gpus, precision, batch, data=args.data)
        steps = [_cell_step_fields(c, nodes, gpus, precision, batch, device, timing, step_fields) for c in cells]
        # the models of --models: their cached traces (campaign/plan_trace.fits_cells), torch-free
        from scaleladder.campaign.plan_trace import fits_cells

        traced = [m for m, f in flavors.FLAVORS.items() if f.entry]  # looked up now: --models registered them
        more, plans, missing = fits_cells(traced, device, nodes, gpus, precision, batch, args.data,
                                          cache=getattr(args, "trace_cache", None))
        cells += more
        from scaleladder.campaign.plan_trace import step_fields as traced_step_fields

        for c in more:  # a traced cell's step time at its batch, from its trace
            found = _traced_cell(c, plans, nodes, precision, batch)
            steps.append({"step_time_s": None, "step_time_parts": None, "step_time_sources": [c.reason or "does not fit"]}
                         if found is None else
                         traced_step_fields(found[0], nodes * gpus, int(found[0].batch), device.name, timing, found[1].trace))
        what = f"{device.name}, {nodes}×{gpus} ranks, {precision}" + (f", local batch {batch}" if batch else "")
        if chart is not None:
            from scaleladder.figures.plan_plots import fits_chart

            fits_chart(cells, chart, f"What fits where (planner): {'fits at the batch' if batch else 'max local batch'}, {what}")
        note = _untraced_note(missing, device, gpus, args, "cell(s)", "a fits table") if missing else ""
        if args.json:
            print(json.dumps([{**c.__dict__, **f} for c, f in zip(cells, steps)], indent=1))
        elif args.fits_table or chart is None:
            _print_table(cells, f"what fits on {what} (predicted)", [cell_step(f) for f in steps],
                         seed_differences(cells, device, nodes * gpus, precision, batch), traced=bool(traced))
            if note:
                print(note)
                note = ""
        if note:
            print(note, file=sys.stderr)
        return 0
    if not args.spec:
        raise SpecError("give --spec (or --fits-table / --fits-chart / --vs-measured / --time-chart)")
    spec = RunSpec.from_path(args.spec)
    if getattr(args, "traced", False) or not _analytic(spec):
        return _traced(args, spec, device, gpus, timing)
    # the memory of the FLAVA the rung builds (--flava-impl, as `scaleladder run` takes it)
    p = predict(spec, spec.nodes * gpus, gpus, device, data=args.data, variant=Variant(flava_impl=timing.flava_impl))
    st = step_fields(spec, spec.nodes * gpus, gpus, p.batch if p.fits else None, device.name, timing)
    if args.json:
        out: dict[str, Any] = {**p.as_dict(), "memory_model": memory_model(spec), **st}
        print(json.dumps(out, indent=1))
    else:
        _print_prediction(p)
        if spec.strategy.compile:
            print(f"  memory: {memory_model(spec)}; so the max batch is a lower bound")
        print("\n".join(step_lines(st)))
    return 0


def _analytic(spec: RunSpec) -> bool:
    from scaleladder.campaign.plan_trace import analytic
    from scaleladder.flavors import get_flavor

    return analytic(get_flavor(spec.model))


def _traced(args: argparse.Namespace, spec: RunSpec, device: Device, gpus: int, timing: Any) -> int:
    """A rung whose family has no analytic memory model (or ``--traced``): memory and FLOPs traced
    on fake tensors (campaign/plan_trace.py; needs torch), the step time priced from them."""
    from scaleladder.campaign.plan_trace import predict as predict_traced
    from scaleladder.campaign.plan_trace import step_fields as traced_step_fields
    from scaleladder.site.plan_time import step_lines

    world = spec.nodes * gpus
    tp = predict_traced(spec, world, gpus, device, data=args.data, flava_impl=timing.flava_impl,
                        cache=getattr(args, "trace_cache", None))
    p = tp.prediction
    st = traced_step_fields(spec, world, p.batch if p.fits else None, device.name, timing, tp.trace)
    if args.json:
        print(json.dumps({**p.as_dict(), **tp.fields(), **st}, indent=1))
    else:
        _print_prediction(p)
        print("\n".join(tp.lines()))
        print("\n".join(step_lines(st)))
    return 0


def _device_key(device: Device) -> str:
    """A device ``plan --device`` takes, for a command that only traces (a trace is the same on any)."""
    return device.name if device.name in DEVICES else "cpu"


def _untraced_note(missing: list[NotTraced], device: Device, gpus: int, args: argparse.Namespace, what: str,
                   where: str) -> str:
    """The one line for everything the cache-only paths could not plan: how many, and the command."""
    from scaleladder.campaign.plan_trace import untraced_hint

    hint = untraced_hint(missing, _device_key(device), gpus, getattr(args, "models", None), getattr(args, "trace_cache", None))
    return (f"scaleladder plan: {len(missing)} {what} of models-file models not planned: no cached trace ({where} reads "
            f"the cache only); {hint}")


def _traced_cell(c: FitsCell, plans: dict[tuple[str, str], TracedPlan], nodes: int, precision: str,
                 batch: int | None) -> tuple[RunSpec, TracedPlan] | None:
    """A traced fits-table cell's rung at its batch (the given one, else its max batch) and its plan;
    None where it has no step (no trace, does not fit)."""
    from scaleladder.spec import default_knobs

    at = batch if batch is not None else c.max_batch
    tp = plans.get((c.model, c.strategy))
    if not c.fits or at is None or tp is None:
        return None
    strategy = parse_strategy(c.strategy)
    return RunSpec(c.model, strategy, precision, default_knobs(strategy), nodes, at), tp


def _cell_step_fields(c: FitsCell, nodes: int, gpus: int, precision: str, batch: int | None, device: Device,
                      timing: Any, step_fields: Any) -> dict[str, Any]:
    """A fits-table cell's step time at its batch (the given one, else its max batch)."""
    at = batch if batch is not None else c.max_batch
    if not c.fits or at is None:
        return {"step_time_s": None, "step_time_parts": None, "step_time_sources": ["does not fit"]}
    from scaleladder.spec import default_knobs

    strategy = parse_strategy(c.strategy)
    spec = RunSpec(c.model, strategy, precision, default_knobs(strategy), nodes, at)
    return dict(step_fields(spec, nodes * gpus, gpus, at, device.name, timing))
