"""`scaleladder rehearse --profile P`: the campaign rehearsed at its real world sizes on one CPU.

Every rung the profile's ladder runs (its ``select`` applied) is **built and wrapped** as rank 0 of its
real world size, on torch's fake process group with fake tensors (campaign/plan_check.py's
:func:`~scaleladder.campaign.plan_check.build_and_wrap`): a rung that cannot be built or wrapped at 64
nodes is found here, not once its job has started. One **representative** per (model, wrapper, sharding,
AC form), at the largest world it runs at, is then **traced**: two runner steps under torch's memory
tracker, its collectives' bytes counted, both held against the planner (``plan --check``). ``-compile``
rungs are built and wrapped only (inductor refuses fake tensors on the meta/CPU mix; the planner gives
their memory as the eager rung's), and so are the rungs the planner predicts not to fit (they never run).

Then the seed figures: for each figure a ladder block says it draws (its name: "(ViT seed, Figures 2-3)"),
the panels (one per model) every rung of which is predicted not to fit are named, with the planner's why.

One line per rung; exit 1 on a rung that cannot be built or wrapped, a trace whose peak or collectives
pass the bound, or an empty seed panel; exit 2 (one line) on bad input: a profile with no ladder, a
``select`` that selects nothing, a world size a strategy cannot take. Why and what it costs:
docs/planner.md, "Rehearsing the campaign".
"""

from __future__ import annotations

import argparse
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from scaleladder.errors import SpecError
from scaleladder.spec import RunSpec

#: The planner's peak against the tracker's, traced rungs (the accuracy plan --check holds it to).
PEAK_BOUND = 0.05
#: Collective bytes against the planner's volumes (planner/steptime.py's stages).
COMM_BOUND = 0.01
GIB = 2**30
#: A block's name says which seed figures it draws: "(ViT seed, Figures 2-3)", "(FLAVA seed, Figure 1)".
SEED_FIGURES = re.compile(r"\((?P<seed>[\w-]+ seed), Figures? (?P<figs>[\d, -]+)\)")


@dataclass
class Outcome:
    """What rehearsing one rung found (made in a worker process, so plain data)."""

    spec: str
    world: int
    built: str = ""  # what the wrap reports, or "" on failure
    error: str = ""  # the first line of what failed
    seconds: float = 0.0
    traced: bool = False
    planned_peak: int = 0
    tracked_peak: int = 0
    collectives: dict[str, int] = field(default_factory=dict)
    planned_collectives: dict[str, int] = field(default_factory=dict)

    @property
    def peak_error(self) -> float:
        return self.planned_peak / self.tracked_peak - 1 if self.tracked_peak else 0.0

    def comm_errors(self) -> dict[str, float]:
        kinds = set(self.collectives) | set(self.planned_collectives)
        return {k: (self.planned_collectives.get(k, 0) / self.collectives[k] - 1) if self.collectives.get(k)
                else (0.0 if not self.planned_collectives.get(k) else float("inf")) for k in sorted(kinds)}


def representative_key(spec: RunSpec) -> tuple[str, str, str, str]:
    """(model, wrapper, sharding with its group, AC form): rungs with one key share a trace."""
    s = spec.strategy
    sharding = f"{s.sharding or ''}{s.group or ''}"
    ac = "reentrant" if s.ac and s.reentrant else ("selective" if s.ac and s.selective else ("ac" if s.ac else ""))
    return spec.model, s.wrapper, sharding, ac


def plan_representatives(rungs: Sequence[tuple[RunSpec, int]], not_to_fit: frozenset[str]) -> dict[str, str]:
    """Each traceable rung's representative (spec path -> spec path): per :func:`representative_key`, the
    rung at the largest world (the first such in ladder order). -compile rungs and rungs predicted not to
    fit have none."""
    best: dict[tuple[str, str, str, str], tuple[RunSpec, int]] = {}
    for spec, world in rungs:
        if spec.strategy.compile or spec.path in not_to_fit or spec.batch == "max":
            continue
        key = representative_key(spec)
        if key not in best or world > best[key][1]:
            best[key] = (spec, world)
    return {spec.path: best[representative_key(spec)][0].path for spec, _ in rungs
            if representative_key(spec) in best and not spec.strategy.compile and spec.path not in not_to_fit
            and spec.batch != "max"}


def rehearse_one(path: str, world: int, trace: bool) -> Outcome:
    """Build and wrap one rung (in a worker); with ``trace``, also its two traced steps."""
    import warnings

    from scaleladder.campaign.plan_check import build_and_wrap, measure, planned_collectives

    warnings.simplefilter("ignore")  # FSDP's and torch's warnings on fake tensors, once per rung: not findings
    spec = RunSpec.from_path(path)
    out = Outcome(path, world)
    t0 = time.perf_counter()
    try:
        out.built = build_and_wrap(spec, world)
        if trace:
            check = measure(spec, world)
            out.traced = True
            out.planned_peak, out.tracked_peak = check.planned_peak, check.tracked_peak
            out.collectives = dict(check.collectives)
            out.planned_collectives = planned_collectives(spec, world)
    except Exception as e:  # every failure is the rung's finding, reported in one line
        first = str(e).splitlines()[0] if str(e) else ""
        out.error = f"{type(e).__name__}: {first}"
    out.seconds = time.perf_counter() - t0
    return out


def seed_panels(blocks: Sequence[dict[str, object]], rungs: Sequence[RunSpec], not_to_fit: frozenset[str],
                why: Callable[[RunSpec], str]) -> list[str]:
    """One line per empty seed panel: a model of a block that names seed figures whose rungs (in every
    block naming those figures) are all predicted not to fit."""
    by_figure: dict[str, dict[str, list[RunSpec]]] = {}
    in_ladder = {s.path: s for s in rungs}
    for block in blocks:
        m = SEED_FIGURES.search(str(block.get("name") or ""))
        if not m:
            continue
        figure = f"{m['seed']}, Figure{'s' if re.search(r'[-,]', m['figs']) else ''} {m['figs'].strip()}"
        models = [str(x) for x in block.get("models") or []]  # type: ignore[attr-defined]
        panels = by_figure.setdefault(figure, {})
        for model in models:
            panels.setdefault(model, [])
        for s in in_ladder.values():
            if s.model in models and _in_block(s, block):
                panels[s.model].append(s)
    out = []
    for figure, panels in by_figure.items():
        for model, specs in panels.items():
            if specs and all(s.path in not_to_fit for s in specs):
                out.append(f"{figure}: the {model} panel would be empty: all {len(specs)} of its rungs are predicted "
                           f"not to fit ({why(specs[0])})")
    return out


def _in_block(spec: RunSpec, block: dict[str, object]) -> bool:
    def has(key: str, value: str) -> bool:
        return value in [str(x) for x in block.get(key) or []]  # type: ignore[attr-defined]

    return (has("strategies", str(spec.strategy)) and has("precisions", spec.precision)
            and has("nodes", str(spec.nodes)) and has("batches", str(spec.batch)))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="a folder name under profiles/")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides as Snakemake's --config takes them (select={models: [vit-base]})")
    p.add_argument("--repo", default=".", help="the workflow's folder (default: here)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: the CPUs)")
    p.add_argument("--no-trace", action="store_true", help="build and wrap every rung; trace none")
    p.add_argument("--bound", type=float, default=PEAK_BOUND,
                   help=f"a traced peak's planned/tracked - 1 that fails the rehearsal (default {PEAK_BOUND})")


def rehearse(profile: str, repo: Path, overrides: dict[str, object] | None = None, jobs: int = 1, trace: bool = True,
             bound: float = PEAK_BOUND, out: Callable[[str], None] = print) -> int:
    """The command, callable (``doctor --rehearse`` runs it): the lines to ``out``; 0 or 1."""
    from scaleladder.site import ladder as site_ladder
    from scaleladder.site.profiles import load_profile

    t0 = time.perf_counter()
    prof = load_profile(profile, repo, plan=True, overrides=overrides)
    if not (prof.config or {}).get("ladders"):
        raise SpecError(f"profile {profile} has no ladder to rehearse (no 'ladders' in its config)")
    if prof.config_error or prof.ladder is None:
        raise SpecError(f"profile {profile}: {prof.config_error}")
    ladder = prof.ladder
    worlds = [w for w in ladder.skipped if "does not divide the world size" in w]
    if worlds:
        raise SpecError(f"profile {profile}: {len(worlds)} rung(s) at a world size the strategy cannot take, first "
                        f"{worlds[0]}")
    rungs = [(s, site_ladder.rank_args(s, ladder.ranks_per_node)[0]) for s in ladder.selected]
    reps = plan_representatives(rungs, ladder.predicted_oom) if trace else {}
    traced = set(reps.values())
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=get_context("spawn")) as pool:
        # the traces first (the longest), then the builds: the pool stays full to the end
        order = sorted(rungs, key=lambda r: (r[0].path not in traced, -r[1]))
        futures = {s.path: pool.submit(rehearse_one, s.path, w, s.path in traced) for s, w in order}
        outcomes = {path: f.result() for path, f in futures.items()}
    failed = 0
    for spec, world in rungs:
        o = outcomes[spec.path]
        bad = bool(o.error) or (o.traced and (abs(o.peak_error) > bound
                                             or any(abs(e) > COMM_BOUND for e in o.comm_errors().values())))
        failed += bad
        out(f"{'FAIL' if bad else 'ok  '} {spec.path} at world {world}: " + _what(o, spec, ladder.predicted_oom, reps))
    empty = seed_panels(ladder.config["ladders"], [s for s, _ in rungs], ladder.predicted_oom,
                        lambda s: _why(s, ladder.settings.site.plan_device or "", ladder.ranks_per_node))
    for line in empty:
        out(f"FAIL {line}")
    out(f"rehearse: {len(rungs)} rungs built and wrapped, {len(traced)} traced, {failed} failed, {len(empty)} empty seed "
        f"panel(s) (profile {profile}, {time.perf_counter() - t0:.0f} s, {max(1, jobs)} worker(s))")
    return 1 if failed or empty else 0


def _what(o: Outcome, spec: RunSpec, not_to_fit: frozenset[str], reps: dict[str, str]) -> str:
    if o.error:
        return f"cannot be built or wrapped: {o.error}" if not o.built else f"built and wrapped; the trace failed: {o.error}"
    head = f"built and wrapped ({o.built})"
    if o.traced:
        comm = ", ".join(f"{k} {o.collectives.get(k, 0) / GIB:.3f} GiB (planner {e:+.2%})" for k, e in o.comm_errors().items())
        return (f"{head}; traced: planner {o.planned_peak / GIB:.2f} GiB, tracker {o.tracked_peak / GIB:.2f} GiB, "
                f"{o.peak_error:+.1%}; collectives {comm or 'none'} ({o.seconds:.0f} s)")
    if spec.strategy.compile:
        return f"{head}; memory as the eager rung (inductor refuses fake tensors: not traced)"
    if spec.path in not_to_fit:
        return f"{head}; predicted not to fit, not traced (it does not run)"
    rep = reps.get(spec.path)
    return f"{head}; as traced by {rep}" if rep else head


def _why(spec: RunSpec, device: str, rpn: int) -> str:
    """The planner's why for a rung predicted not to fit: what it needs against the device (a
    models-file model's from the cached trace the ladder judged it by)."""
    from scaleladder.campaign.plan_trace import predict as predict_traced
    from scaleladder.campaign.plan_trace import traced_model
    from scaleladder.flavors import get_flavor
    from scaleladder.planner.memory import predict
    from scaleladder.site.ladder import rank_args

    world, r = rank_args(spec, rpn)
    if traced_model(get_flavor(spec.model)):
        p = predict_traced(spec, world, r, device, cached_only=True).prediction
    else:
        p = predict(spec, world, r, device)
    cap = f" of {p.capacity_bytes / GIB:.2f}" if p.capacity_bytes else ""
    return f"e.g. {spec.path} needs {p.peak_bytes / GIB:.1f} GiB{cap} on {device}"


def main(args: argparse.Namespace) -> int:
    from scaleladder.site.profiles import parse_config

    return rehearse(args.profile, Path(args.repo).resolve(), parse_config(args.config) or None, args.jobs,
                    not args.no_trace, args.bound)
