"""What a ladder will cost, before anything is submitted: a time model per rung, and node-hours.

A rung's job runs ``steps`` steps plus two start-ups: the one a batch job pays once (the
profile's stated ``budget.job_startup_s``: the allocation, the container image read on every node,
first imports from cold caches), and the one each rung pays again, in a pack too (measured, from
the records of finished rungs (rung/startup.py; :func:`measured_startup`), else the stated
``budget.rung_startup_s``: the launcher's step, the ranks' processes, the process group, the first
batch), plus the site's stated ``timing.compile_s`` for a ``-compile`` rung. A rung in a pack
(campaign/packing.py) pays only its own part: :attr:`Estimate.rung_s`. One step is PREDICTED by the planner's step-time
model (``planner/steptime.py``: compute from the rung's hardware FLOPs at the device's measured
or datasheet rate, host work, and the collectives over the site's links, with what overlaps),
for the rung's own world and ranks per node. Where the planner has no rates for the device, or
``TimeModel.predicted`` is off, the older stated-MFU model prices it instead:

    step time = local batch x model FLOPs per sample / (device peak x MFU)

with an MFU per strategy stated in the profile (``budget.mfu``: a strategy name, else its
wrapper ``ddp``/``fsdp``/``fsdp2``/``single``, else ``default``).

Calibration: as the campaign runs, measured rungs take over. A rung that was measured itself
takes its own ``step_time_mean_s``; another takes the median measured MFU of the rungs of the
SAME model and strategy (other sizes, nodes, batches, knobs); each estimate names where it
comes from (``predicted ...``, ``calibrated mfu ... from`` the spec paths, ``measured (this rung)``).

A ``max`` rung is priced at the planner's predicted max batch, plus the search's probes
(``probe_steps`` each, one per doubling up to that batch, as the search starts at the
prediction and checks its neighbours: an estimate, said as such).

A models-file model (``campaign/plan_trace.traced_model``) has no analytic FLOPs or step time:
its CACHED trace gives them (``plan_trace.step_time``; FLOPs per sample from FlopCounterMode on
the traced step), read with no torch. Where no trace is cached, the stated MFU prices FLOPs per
sample that a finished rung of the same model recorded; where there is none either, the job is
priced at its rule's time limit (``rung``/``rung_max`` ``runtime``: an upper bound, the scheduler
ends it there), else it is not priced (counted apart). The source says which, never a zero.

Torch-free: this runs on a login node.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scaleladder.campaign.plan_trace import NotTraced, Trace, Untraceable, traced_model
from scaleladder.campaign.plan_trace import step_time as traced_step_time
from scaleladder.campaign.plan_trace import trace as cached_trace
from scaleladder.flavors import get_flavor
from scaleladder.planner.devices import PEAKS, chip_of
from scaleladder.planner.rates import rates
from scaleladder.planner.steptime import Site, flops_per_sample, predict_step
from scaleladder.spec import RunSpec, SpecError

DEFAULT_MFU = 0.30
DEFAULT_STARTUP_S = 120.0


def peak_key(plan_device: str) -> str:
    """The planner's device name -> the device table's chip (planner/devices.py PEAKS): the
    chip whose memory variant it is, else the name with a memory suffix dropped."""
    if plan_device in PEAKS:
        return plan_device
    if (chip := chip_of(plan_device)) is not None:
        return chip
    head = plan_device.rsplit("-", 1)[0]
    if head in PEAKS:
        return head
    raise KeyError(f"no peak FLOP/s for plan_device {plan_device!r} (planner/devices.py PEAKS: {', '.join(PEAKS)})")


def plan_device_peak_flops(plan_device: str, precision: str) -> float:
    """The dense peak of the site's ``plan_device`` from the table: no device is at hand here
    (cf. ``rung/device_peak.py``'s peak of a rank's own device, checked against its SMs and power cap)."""
    return PEAKS[peak_key(plan_device)].for_precision(precision)


def model_flops_per_sample(spec: RunSpec, global_batch: int) -> float:
    """The analytic model FLOPs of one sample (a built-in family's); a models-file model has none
    (:func:`traced_model_flops`), said in one line."""
    flavor = get_flavor(spec.model)
    if traced_model(flavor):
        raise SpecError(f"{spec.model} is a models-file model: no analytic FLOPs count (its trace's: scaleladder plan)")
    return flops_per_sample(flavor, spec.strategy.ac, global_batch).model


def traced_model_flops(spec: RunSpec, world: int, tr: Trace, cache: str | None = None) -> tuple[float, str]:
    """A traced rung's model FLOPs per sample (no recompute) and where they come from: its trace's
    FLOPs; an activation-checkpointed rung's from its plain sibling's cached trace, else its own
    (recompute included: a step priced high, said so)."""
    if not spec.strategy.ac:
        return tr.flops_per_sample, "FLOPs per sample traced"
    plain = dataclasses.replace(spec, strategy=dataclasses.replace(spec.strategy, ac=False, reentrant=False, selective=False))
    try:
        sibling, _, _ = cached_trace(plain, world, cache=cache, cached_only=True)
    except SpecError:
        return tr.flops_per_sample, "FLOPs per sample traced, the recomputed forward included (no trace of the rung without AC)"
    return sibling.flops_per_sample, f"FLOPs per sample traced ({plain.strategy}'s)"


def stated_mfu(spec: RunSpec, table: Mapping[str, float]) -> tuple[float, str]:
    for key in (str(spec.strategy), spec.strategy.wrapper, "default"):
        if key in table:
            return float(table[key]), f"stated mfu {float(table[key]):.2f} ({key})"
    return DEFAULT_MFU, f"default mfu {DEFAULT_MFU:.2f}"


@dataclass(frozen=True)
class Measured:
    """What a finished rung's record says (results/rungs/<spec>.h5 attributes)."""

    spec: RunSpec
    status: str
    step_time_s: float | None
    mfu: float | None
    batch: int | None  # the local batch it ran (a max rung: the batch it found)
    startup_s: float | None = None  # rank 0's start-up + tear-down (rung/startup.py); None in older records
    flops_per_sample: float | None = None  # the model FLOPs it recorded (a models-file model's, counted)


@dataclass
class Estimate:
    spec: RunSpec
    world: int
    nodes: int
    batch: int | None  # the local batch priced (None: nothing fits)
    fits: bool
    step_s: float
    job_s: float
    source: str  # where the step time comes from
    measured: bool = False
    priced: bool = True  # False: nothing to price it with (no predicted max batch); counted apart
    fallback: bool = False  # a models-file model priced without its trace (its source says by what)
    startup_s: float = 0.0  # of job_s, the part outside the steps (the job's and the rung's; the max search pays the rung's per probe too)
    startup_source: str = ""
    job_startup_s: float = 0.0  # of startup_s, what the batch job pays once: a pack pays it once for all its rungs
    packed: bool = False  # runs in a pack, whose job start-up is priced once with the pack (campaign/packing.py)
    refused: str = ""  # predicted past the site's time limit and not run: why, in one line (campaign/timelimit.py)
    steps: int | None = None  # the steps it runs where a time limit shortened it (job_s is at them)

    @property
    def rung_s(self) -> float:
        """The rung's time inside a pack: its job's without the job's own start-up."""
        return self.job_s - self.job_startup_s

    @property
    def own_s(self) -> float:
        """What this rung adds to the campaign: its whole job, or in a pack its own part."""
        return self.rung_s if self.packed else self.job_s

    @property
    def startup_node_hours(self) -> float:
        return self.nodes * (self.startup_s - (self.job_startup_s if self.packed else 0.0)) / 3600

    @property
    def node_hours(self) -> float:
        return self.nodes * self.own_s / 3600


@dataclass
class TimeModel:
    """The time model's inputs, from the profile: what prices a rung's job in seconds."""

    plan_device: str
    steps: int
    mfu: Mapping[str, float] = field(default_factory=dict)
    startup_s: float = DEFAULT_STARTUP_S  # what each rung pays outside its steps (budget.rung_startup_s), stated
    probe_steps: int = 5
    site: Site = field(default_factory=Site)  # the profile's timing: links, cpu_factor, compile_s
    ranks_per_node: int = 1
    predicted: bool = True  # False: the stated-MFU model (budget.mfu) instead of planner/steptime.py
    trace_cache: str | None = None  # where a models-file model's traces are read (None: plan_trace's default)
    limits_s: Mapping[str, float] = field(default_factory=dict)  # rule (rung, rung_max) -> its time limit: an untraced model's bound
    job_startup_s: float = 0.0  # what a batch job pays once, outside its rungs (budget.job_startup_s), stated


def calibrated_mfu(spec: RunSpec, measured: Sequence[Measured]) -> tuple[float, list[str]] | None:
    """Median measured MFU of the ok rungs of the same model and strategy (None: none yet)."""
    same = [m for m in measured if m.status == "ok" and m.mfu and m.spec.model == spec.model
            and str(m.spec.strategy) == str(spec.strategy)]
    if not same:
        return None
    return statistics.median(m.mfu for m in same if m.mfu), sorted(m.spec.path for m in same)


def measured_startup(spec: RunSpec, measured: Sequence[Measured]) -> tuple[float, str] | None:
    """The start-up of a job of ``spec.nodes`` nodes, from finished rungs' records (None: none).

    The median at the same node count; where there is none but two or more node counts were
    measured and the start-up grows with nodes, the least-squares line through their medians
    (a, b in a + b x nodes) at ``spec.nodes``; else the median of all. It counts from each
    rank's process start (rung/startup.py), so it stands for the rung's own start-up: what a job
    spends before that (the allocation, the batch script, the container's first start) is the
    stated ``budget.job_startup_s``, never in a measurement."""
    ok = [m for m in measured if m.status == "ok" and m.startup_s is not None]
    if not ok:
        return None
    by_nodes: dict[int, list[float]] = {}
    for m in ok:
        by_nodes.setdefault(m.spec.nodes, []).append(float(m.startup_s or 0.0))
    if spec.nodes in by_nodes:
        same = by_nodes[spec.nodes]
        return statistics.median(same), f"measured start-up (median of {len(same)} rung(s) on {spec.nodes} node(s))"
    medians = {n: statistics.median(v) for n, v in by_nodes.items()}
    if len(medians) >= 2:
        fit = statistics.linear_regression(list(medians), list(medians.values()))
        if fit.slope > 0:
            value = fit.intercept + fit.slope * spec.nodes
            return max(value, 0.0), f"measured start-up, {fit.intercept:.1f} s + {fit.slope:.1f} s x nodes (from {sorted(medians)} nodes)"
    every = [float(m.startup_s or 0.0) for m in ok]
    return statistics.median(every), f"measured start-up (median of {len(every)} rung(s))"


def estimate(spec: RunSpec, world: int, fits: bool, max_batch: int | None, timing: TimeModel,
             measured: Mapping[str, Measured]) -> Estimate:
    """One rung's job: its step time (measured, calibrated or stated), steps, start-up."""
    own = measured.get(spec.path)
    batch = spec.batch if isinstance(spec.batch, int) else max_batch
    if not fits or batch is None:
        return Estimate(spec, world, spec.nodes, None, False, 0.0, 0.0, "planner: does not fit, recorded without a job")
    if own and own.status == "ok" and own.step_time_s:
        step, source, done = own.step_time_s, "measured (this rung)", True
        batch = own.batch or batch
    else:
        priced, source, fallback = _step(spec, world, batch, timing, measured)
        if priced is None:
            return unpriced(spec, world, timing, source, batch)
        step, done = priced, False
    start = measured_startup(spec, list(measured.values()))
    startup, startup_source = start if start else (timing.startup_s, f"stated rung start-up {timing.startup_s:.0f} s (budget.rung_startup_s)")
    if timing.job_startup_s:
        startup_source = f"stated job start-up {timing.job_startup_s:.0f} s (budget.job_startup_s) + {startup_source}"
    if spec.strategy.compile and timing.site.compile_s:
        startup += timing.site.compile_s
        startup_source += f" + stated compile {timing.site.compile_s:.0f} s (timing.compile_s)"
    job, paid = timing.job_startup_s + timing.steps * step + startup, timing.job_startup_s + startup
    if spec.batch == "max":  # the search's probes, one per doubling up to the batch (an estimate), each a launch of its own
        probes = max(1, math.ceil(math.log2(max(batch, 2))))
        job += probes * (timing.probe_steps * step + startup)
        paid += probes * startup
    return Estimate(spec, world, spec.nodes, batch, True, step, job, source, done, startup_s=paid, startup_source=startup_source,
                    fallback=not done and fallback, job_startup_s=timing.job_startup_s)


def unpriced(spec: RunSpec, world: int, timing: TimeModel, why: str, batch: int | None = None) -> Estimate:
    """A rung the time model cannot price (a models-file model with no cached trace and no record
    of its FLOPs): its job at its rule's time limit, an upper bound (the scheduler ends it there),
    else not priced; ``why`` first in its source."""
    rule = "rung_max" if spec.batch == "max" else "rung"
    limit = timing.limits_s.get(rule)
    if limit:
        return Estimate(spec, world, spec.nodes, batch, True, math.nan, limit,
                        f"{why}: priced at the {rule} job's time limit, {limit / 60:.0f} min (an upper bound)",
                        startup_source="in the time limit", fallback=True)
    return Estimate(spec, world, spec.nodes, batch, True, 0.0, 0.0,
                    f"not priced: {why}, and no {rule} time limit (runtime) to bound its job", priced=False)


def _trace(spec: RunSpec, world: int, timing: TimeModel) -> tuple[Trace | None, str]:
    """A traced rung's cached trace, else None and why, in a few words."""
    try:
        return cached_trace(spec, world, cache=timing.trace_cache, cached_only=True)[0], ""
    except NotTraced as e:
        return None, f"{'a stale' if e.stale else 'no'} cached trace at world {e.world}"
    except Untraceable:
        return None, f"no trace (fake tensors cannot trace FSDP1 on {world} ranks)"


def _recorded_flops(spec: RunSpec, measured: Mapping[str, Measured]) -> tuple[float, str] | None:
    """The model FLOPs per sample a finished rung of the same model recorded (the median of them)."""
    got = {m.spec.path: m.flops_per_sample for m in measured.values()
           if m.spec.model == spec.model and m.status == "ok" and m.flops_per_sample}
    if not got:
        return None
    return statistics.median(v for v in got.values() if v), f"FLOPs per sample recorded by {', '.join(sorted(got))}"


def _step(spec: RunSpec, world: int, batch: int, timing: TimeModel,
          measured: Mapping[str, Measured]) -> tuple[float | None, str, bool]:
    """A rung not measured itself: calibrated from its measured siblings, else predicted, else stated;
    and whether a models-file model was priced without its trace. None (and why) for one with neither
    a cached trace nor a record of its FLOPs."""
    cal = calibrated_mfu(spec, list(measured.values()))
    traced = traced_model(get_flavor(spec.model))
    tr, why = _trace(spec, world, timing) if traced else (None, "")
    if cal is None and timing.predicted and (tr is not None or not traced):
        try:
            r = rates(timing.plan_device, spec.precision)
            if tr is not None:
                st = traced_step_time(spec, world, batch, tr, r, timing.site)
            else:
                st = predict_step(spec, world, min(timing.ranks_per_node, world), batch, r, timing.site)
        except SpecError:
            pass  # no rates for this device: the stated MFU below
        else:
            p = st.parts()
            return st.step_time_s, (f"predicted{' from its cached trace' if tr is not None else ''} ({st.bound}-bound: "
                                    f"compute {p['compute_s']:.3f} s, host {p['host_s']:.3f} s, "
                                    f"comm {p['comm_s']:.3f} s, exposed {p['exposed_comm_s']:.3f} s"
                                    + ("; no link figures" if world > 1 and timing.site.links is None and tr is None else "")
                                    + ("; communication not modelled" if world > 1 and tr is not None else "") + ")"), False
    peak = plan_device_peak_flops(timing.plan_device, spec.precision)
    if cal:
        mfu, sources = cal
        source = f"calibrated mfu {mfu:.3f} from " + ", ".join(sources)
    else:
        mfu, source = stated_mfu(spec, timing.mfu)
    if not traced:
        return batch * model_flops_per_sample(spec, batch * world) / (peak * mfu), source, False
    recorded = _recorded_flops(spec, measured)
    if cal and recorded:  # the FLOPs the calibrating rungs' MFU was measured against
        flops: tuple[float, str] | None = recorded
    else:
        flops = traced_model_flops(spec, world, tr, timing.trace_cache) if tr is not None else recorded
    if flops is None:
        return None, f"a models-file model with {why} and no finished rung recording its FLOPs", True
    return batch * flops[0] / (peak * mfu), f"{source}; {flops[1]}" + (f" ({why})" if tr is None else ""), tr is None


def block_table(blocks: Sequence[tuple[str, Sequence[Estimate]]], limits_min: Mapping[str, float],
                asks: Callable[[float], float] | None = None) -> list[dict[str, str]]:
    """Per ladder block and in total: rungs, rungs to run, won't fit, node-hours, the longest job
    against the time limit of its rule (``rung`` or ``rung_max``, minutes: over when ``asks`` of its
    predicted seconds, the minutes its job asks for, is past it; without ``asks``, its prediction);
    where models-file models were priced without a trace, how many (each one's source says by what);
    where a time limit shortened or refused rungs, how many. A packed rung's node-hours are its own
    part; its pack's job start-up is the caller's to add, once per pack."""
    rows = []
    everything: list[Estimate] = []
    fallback = any(e.fallback for _, ests in blocks for e in ests)  # a column only where a models-file model has one
    limited = any(e.refused or e.steps is not None for _, ests in blocks for e in ests)
    ask = asks or (lambda s: s / 60)
    for name, ests in list(blocks) + [("total", [])]:
        ests = list(ests) if name != "total" else everything
        if name != "total":
            everything += ests
        todo = [e for e in ests if e.fits and not e.measured and e.priced and not e.refused]
        own = [e for e in todo if not e.packed]  # a job of its own: its time limit is its own
        longest = max(own, key=lambda e: e.job_s, default=None)
        limit = limits_min.get("rung_max" if longest and longest.spec.batch == "max" else "rung")
        over = [e for e in own if ask(e.job_s) > limits_min.get("rung_max" if e.spec.batch == "max" else "rung", math.inf)]
        rows.append({
            "ladder block": name,
            "rungs": str(len(ests)),
            "to run": str(len(todo)),
            "won't fit": str(sum(not e.fits for e in ests)),
            "measured": str(sum(e.measured for e in ests)),
            "not priced": str(sum(not e.priced for e in ests)),
            **({"shortened": str(sum(e.steps is not None and not e.refused for e in ests)),
                "refused": str(sum(bool(e.refused) for e in ests))} if limited else {}),
            **({"untraced, priced by fallback": str(sum(e.fallback for e in ests))} if fallback else {}),
            "node-hours to run": f"{sum(e.node_hours for e in todo):.1f}",
            "of which start-up": f"{sum(e.startup_node_hours for e in todo):.1f}",
            "longest job": (f"{longest.job_s / 60:.0f} min ({longest.spec.path})" if longest else
                            "- (every rung in a pack)" if todo else "-"),
            "time limit": (f"{limit:.0f} min" + (f", {len(over)} over" if over else "") if limit else "-"),
        })
    return rows


def read_measured(paths: Sequence[str]) -> dict[str, Measured]:
    """Every finished rung record among ``paths`` (spec path -> what it measured)."""
    from scaleladder.results.model_entries import register_recorded
    from scaleladder.results.record import MaxBatch, Record, Spec, Startup, Throughput
    from scaleladder.results.store import read_attrs

    out: dict[str, Measured] = {}
    for p in paths:
        try:  # the file's path is its spec (a max rung's record names the batch it found in `batch`)
            a: dict[str, Any] = read_attrs(p)
            register_recorded(a)  # a models-file model: known from its record
            spec = RunSpec.from_path(_spec_path(p))
        except (OSError, KeyError, ValueError, SpecError):  # not a rung record
            continue
        found = str(a.get(MaxBatch.max_batch, a.get(Spec.batch, "")))
        startup = _float(a.get(Startup.startup_s))
        out[spec.path] = Measured(spec, str(a.get(Record.status, "")), _float(a.get(Throughput.step_time_mean_s)),
                                  _float(a.get(Throughput.mfu)), int(found) if found.isdigit() else None,
                                  None if startup is None else startup + (_float(a.get(Startup.teardown_s)) or 0.0),
                                  _float(a.get(Throughput.flops_per_sample)))
    return out


def _spec_path(path: str) -> str:
    tail = path.split("results/rungs/", 1)[-1]
    return tail[:-3] if tail.endswith(".h5") else tail


def _float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None
