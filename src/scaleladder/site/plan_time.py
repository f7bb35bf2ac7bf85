"""`scaleladder plan`'s step time: the site's figures from ``--profile``, the calibration, and the
weak-scaling chart drawn before anything runs (``--time-chart``). The model itself is
``planner/steptime.py``; this module is the front door's glue, so that ``plan.py`` stays the
memory planner's.

Every figure says where it came from (``step_time_sources``): a measured rate or the
datasheet's, the site's stated CPU factor, and, where the profile has no link figures, the one
line naming the missing key (the step time is then compute + host).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder.errors import SpecError
from scaleladder.flavors import get_flavor
from scaleladder.models.families import family_of
from scaleladder.models.flava_impl import DEFAULT as FLAVA_DEFAULT
from scaleladder.models.flava_impl import parse_flava_impl
from scaleladder.planner.memory import Device, predict
from scaleladder.planner.rates import check_calibration, rates, read_calibration
from scaleladder.planner.steptime import Site, predict_step, site_from_config
from scaleladder.spec import RunSpec, default_knobs

if TYPE_CHECKING:
    from scaleladder.campaign.plan_trace import NotTraced


@dataclass(frozen=True)
class Timing:
    site: Site
    calibration: dict[str, Any] | None
    where: str
    profile: Any = None  # profiles.SiteProfile with --profile
    flava_impl: str = FLAVA_DEFAULT  # a FLAVA rung's implementation (run's --flava-impl): its host work and FLOPs


def timing_from_args(args: argparse.Namespace, device: str | None) -> Timing:
    """``--profile``, ``--calibration`` and ``--torch`` -> what prices the step time."""
    prof, site = None, Site()
    if getattr(args, "profile", None):
        from scaleladder.site.profiles import load_profile

        prof = load_profile(args.profile, Path(getattr(args, "repo", ".")).resolve())
        if prof.config_error:
            raise SpecError(f"profile {args.profile}: {prof.config_error}")
        site = site_from_config(prof.config, args.profile)
    cal, where = None, ""
    if getattr(args, "calibration", None):
        cal, where = read_calibration(args.calibration), str(args.calibration)
        check_calibration(cal, device or "", getattr(args, "torch", None), where)
    return Timing(site, cal, where, prof, parse_flava_impl(getattr(args, "flava_impl", None) or FLAVA_DEFAULT))


def step_fields(spec: RunSpec, world: int, rpn: int, batch: int | None, device: str, timing: Timing) -> dict[str, Any]:
    """The ``--json`` fields: ``step_time_s``, ``step_time_parts``, where each came from (None where
    the device has no rates, or nothing fits)."""
    if batch is None:
        return {"step_time_s": None, "step_time_parts": None, "step_time_sources": ["no batch fits: no step"]}
    try:
        r = rates(device, spec.precision, timing.calibration, timing.where)
        out = predict_step(spec, world, rpn, batch, r, timing.site, flava_impl=timing.flava_impl).as_dict()
    except SpecError as e:
        return {"step_time_s": None, "step_time_parts": None, "step_time_sources": [str(e)]}
    return {**out, **({"flava_impl": timing.flava_impl} if family_of(get_flavor(spec.model)).uses_flava_impl else {})}


def memory_model(spec: RunSpec) -> str:
    """What the memory figures of ``spec`` are (``plan --json``'s ``memory_model``)."""
    if spec.strategy.compile:
        return ("upper bound: the eager rung's memory (torch.compile per block; inductor's partitioner saves no "
                "more activations than eager in the common case, often fewer; not modelled)")
    return "eager: modelled"


def step_lines(f: dict[str, Any]) -> list[str]:
    """The text output's lines for :func:`step_fields`."""
    if f.get("step_time_s") is None:
        return [f"  step time: not predicted ({'; '.join(f.get('step_time_sources') or [])})"]
    p = f["step_time_parts"]
    out = [f"  step time: {f['step_time_s'] * 1e3:.1f} ms predicted ({f['step_time_bound']}-bound): compute "
           f"{p['compute_s'] * 1e3:.1f} ms, host {p['host_s'] * 1e3:.1f} ms, communication {p['comm_s'] * 1e3:.1f} ms "
           f"of which exposed {p['exposed_comm_s'] * 1e3:.1f} ms"]
    return out + [f"    {s}" for s in f.get("step_time_sources") or []]


def cell_step(f: dict[str, Any]) -> str:
    """A fits-table cell's step time: '0.41 s' or '' (none)."""
    s = f.get("step_time_s")
    return "" if s is None else (f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s")


# -- the weak-scaling chart ---------------------------------------------------------------------


@dataclass
class ScalePoint:
    model: str
    strategy: str
    nodes: int
    batch: int | None
    items_per_s: float | None
    required_gib: float | None
    fits: bool
    bound: str = ""


def _series(prof: Any) -> list[RunSpec]:
    """Every (model, strategy, precision) of the ladder once, at its smallest fixed batch (else
    'max'), default knobs; a -compile rung's memory is its eager rung's, an upper bound."""
    out: dict[tuple[str, str, str], RunSpec] = {}
    for r in prof.ladder.rungs:
        key = (r.model, str(r.strategy), r.precision)
        plain = RunSpec(r.model, r.strategy, r.precision, default_knobs(r.strategy), 1, r.batch)
        old = out.get(key)
        if old is None or (isinstance(r.batch, int) and (old.batch == "max" or r.batch < int(old.batch))):
            out[key] = plain
    return list(out.values())


def scaling_points(prof: Any, timing: Timing, device: str, rpn: int, nodes: list[int],
                   missing: list[NotTraced] | None = None) -> list[ScalePoint]:
    """Every series of the ladder at each node count: memory and step time predicted. A models-file
    model's from its CACHED trace at that world (campaign/plan_trace.py), torch-free; a point with
    none is left out and its ``NotTraced`` appended to ``missing``."""
    from scaleladder.campaign.plan_trace import NotTraced, traced_model
    from scaleladder.campaign.plan_trace import predict as predict_traced
    from scaleladder.campaign.plan_trace import step_fields as traced_step_fields

    pts = []
    for spec in _series(prof):
        traced = traced_model(get_flavor(spec.model))
        for n in nodes:
            world = n * rpn
            at = RunSpec(spec.model, spec.strategy, spec.precision, spec.knobs, n, spec.batch)
            try:
                if traced:
                    tp = predict_traced(at, world, rpn, device, cached_only=True)
                    p = tp.prediction
                else:
                    p = predict(at, world, rpn, device)
            except NotTraced as e:
                if missing is not None:
                    missing.append(e)
                continue
            except SpecError:  # a strategy that cannot run on this world (a hybrid group > world), or be traced there
                continue
            batch = p.batch if p.fits else None
            f = traced_step_fields(spec, world, batch, device, timing, tp.trace) if traced else step_fields(spec, world, rpn, batch, device, timing)
            s = f.get("step_time_s")
            pts.append(ScalePoint(spec.model, str(spec.strategy), n, batch, batch * world / s if s and batch else None,
                                  p.required_bytes / 2**30 if p.fits else None, p.fits, f.get("step_time_bound", "")))
    return pts


def chart_nodes(prof: Any) -> list[int]:
    """1, 2, 4, ... up to the most nodes the ladder or the site names."""
    top = max([r.nodes for r in prof.ladder.rungs] + [int(prof.site.get("max_nodes") or 1)])
    out, n = [], 1
    while n <= top:
        out.append(n)
        n *= 2
    return out if out[-1] == top else out + [top]


def time_chart(args: argparse.Namespace, device: Device, rpn: int, out: Path,
               missing: list[NotTraced] | None = None) -> list[ScalePoint]:
    from scaleladder.figures.plan_plots import scaling_chart

    if not getattr(args, "profile", None):
        raise SpecError("--time-chart needs --profile PROFILE (its ladder, links and host factor)")
    timing = timing_from_args(args, device.name)
    prof = timing.profile
    if prof.config.get("models_file") and not getattr(args, "models", None):
        args.models = prof.config["models_file"]  # what the one line's command names
    pts = scaling_points(prof, timing, device.name, rpn, chart_nodes(prof), missing)
    note = timing.site.links_note or "links from the profile"
    scaling_chart(pts, out, f"Predicted before any run: profile {args.profile}, {device.name}, {rpn} ranks per node",
                  f"planner/steptime.py; {note}")
    return pts
