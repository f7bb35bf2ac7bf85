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
``select`` that selects nothing, a world size a strategy cannot take. The command, which reads the
profile, is site/doctor.py's ``rehearse_main`` (this stage reads no profile). Why and what it costs:
docs/planner.md, "Every wrapper at its real world size, and the campaign rehearsed".
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

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


def rehearse(rungs: Sequence[tuple[RunSpec, int]], not_to_fit: frozenset[str], blocks: Sequence[dict[str, object]],
             why: Callable[[RunSpec], str], jobs: int = 1, trace: bool = True, bound: float = PEAK_BOUND,
             out: Callable[[str], None] = print, label: str = "") -> int:
    """Rehearse ``rungs`` ((spec, world) each, in ladder order): the lines to ``out``; 0, or 1 on a failure.
    ``not_to_fit``: the planner's verdicts; ``blocks``: the ladder's blocks (their names say which seed
    figures they draw); ``why``: the planner's reason a rung does not fit. The profile is read by the
    command (site/doctor.py's ``rehearse_main``: the campaign stage reads no profile)."""
    t0 = time.perf_counter()
    reps = plan_representatives(rungs, not_to_fit) if trace else {}
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
        out(f"{'FAIL' if bad else 'ok  '} {spec.path} at world {world}: " + _what(o, spec, not_to_fit, reps))
    empty = seed_panels(blocks, [s for s, _ in rungs], not_to_fit, why)
    for line in empty:
        out(f"FAIL {line}")
    out(f"rehearse: {len(rungs)} rungs built and wrapped, {len(traced)} traced, {failed} failed, {len(empty)} empty seed "
        f"panel(s) ({label}{time.perf_counter() - t0:.0f} s, {max(1, jobs)} worker(s))")
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
