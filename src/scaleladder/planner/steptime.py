"""A rung's step time before it runs: compute, host work and communication, and what overlaps.

    step_time_s = max(host_s, compute_s + exposed_comm_s)      (a GPU rung)
    step_time_s = host_s + compute_s + exposed_comm_s          (a CPU rung: one thread does all)

* ``compute_s``: the rung's HARDWARE FLOPs (HFU's numerator: AC's recompute counted;
  ``models/flops.py``) at the device's rate for the model's width (``rates.py``), plus the
  fused AdamW step's HBM traffic over the rank's trainable elements.
* ``host_s``: the rung's host work per step as ``benchmarks/bench_host.py`` measured it on the
  flavor's skeleton (``calibration/host_table.json``, ``rates.HostTable``: the rung's row, or its
  model's ``single`` x the family's measured ratio), x the calibration host's ``table_factor``
  x the site's stated ``cpu_factor``. The host issues kernels asynchronously, so a step takes
  the LONGER of host and GPU, not their sum.
* ``comm_s``: every collective of the step by the alpha-beta model (``comm.py``), from the
  wrapping units' sizes (``step_setup``); ``exposed_comm_s``: what the overlap replay
  (``overlap.py``) leaves outside the compute.
* a ``-compile`` rung: the eager rung's FLOPs at the eager rate (an upper bound: fusion is not
  modelled), its host work from the table's ``-compile`` rows; its compile time is per job.

The STATED fallback, for a rung the table has nothing for and for calibrations that price host
work per aten op (the CPU ones: docs/planner.md, "Two nodes"): 126 top-level aten ops per ViT layer pass and 212
per FLAVA layer pass (a vit-base step ~1,500, a flava-350m step ~11,500: the H100 run's traces,
docs/gpu-check-h100/); non-reentrant AC re-runs the forward, about half of a step's ops (each
forward op leaves one backward node); FSDP1 and FSDP2 at one rank spend 2.1x and 1.9x the host
work of ``single`` (vit-debug b4 on the CPU; docs/performance.md, "Host work"). Torch-free: ``plan`` runs on a login node.

FSDP2's units of k layers (knobs ``-u<k>``): a unit's gather and reduce carry its k layers, one
stage per unit in the overlap replay (:func:`_fsdp_stages`), and the host work beyond ``single``'s
shrinks by its per-unit share, :data:`UNIT_HOST_SHARE`, as the units do (:func:`unit_host_factor`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scaleladder.flavors import Flavor, get_flavor
from scaleladder.models.families import family_of
from scaleladder.models.flava_impl import DEFAULT as FLAVA_DEFAULT
from scaleladder.models.flava_impl import recorded
from scaleladder.models.flops import FlopCount
from scaleladder.planner.comm import Links, all_gather_s, all_reduce_s, links_from_profile, reduce_scatter_s
from scaleladder.planner.overlap import Schedule, Stage, schedule
from scaleladder.planner.rates import OPT_BYTES_PER_PARAM, HostTable, Rates, host_table
from scaleladder.planner.static import fsdp_param_bytes, storage_bytes
from scaleladder.planner.step_setup import StepSetup, step_setup
from scaleladder.spec import Knobs, RunSpec, Strategy

# The stated aten ops per layer pass are the family's (Family.ops_per_layer_pass: see the module
# docstring); so are FLAVA's masking rates before any run (models/families/flava.py: MLM_RATE ...).
AC_FORWARD_SHARE = 0.5  # non-reentrant AC re-runs the forward: +this share of a step's host work
WRAPPER_HOST = {"single": 1.0, "ddp": 1.0, "fsdp": 2.1, "fsdp2": 1.9}  # host work relative to single
# Of FSDP2's host work beyond single's, the share that is paid per unit (its hooks); the rest is per
# parameter (copy-in and copy-out, the views' swaps, the reduce-scatter's copy-in: the same for any
# k). Fitted to benchmarks/bench_host.py --units 1,2,3,4,6,12 on the vit-base skeleton, one rank
# (docs/performance.md, "Units of k layers"): extra = a + b x units, b x 12 units = 0.42 of it at k = 1.
UNIT_HOST_SHARE = 0.42
MIB = 1 << 20
DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES = 25 * MIB, 1 * MIB  # DDP's bucket_cap_mb=25, its 1 MiB first bucket


@dataclass(frozen=True)
class Site:
    """What a site's profile says about time (its ``timing:`` block; see docs/planner.md)."""

    links: Links | None = None
    links_note: str = "no profile: no link figures"
    cpu_factor: float = 1.0
    cpu_source: str = "cpu_factor 1.0 (the calibration host's own; no profile)"
    compile_s: float | None = None


def site_from_config(config: Mapping[str, Any], name: str) -> Site:
    """A profile's merged config -> its :class:`Site`. A missing link is not an error: the
    note (one line naming the missing key) travels with every prediction, which then is
    compute + host."""
    timing: Mapping[str, Any] = config.get("timing") or {}
    links, note = links_from_profile(timing.get("links"), "timing.links")
    note = f"profile {name}: {note}" if links is None else ""
    factor = timing.get("cpu_factor")
    src = (f"profile {name}: timing.cpu_factor {float(factor)} (stated)" if factor is not None
           else f"profile {name} states no timing.cpu_factor: 1.0, the calibration host's")
    compile_s = timing.get("compile_s")
    return Site(links, note, 1.0 if factor is None else float(factor), src,
                None if compile_s is None else float(compile_s))


@dataclass
class StepTime:
    step_time_s: float
    compute_s: float
    host_s: float
    comm_s: float
    exposed_comm_s: float
    bound: str  # "gpu" or "host" (or "cpu": a CPU rung, one thread)
    sources: list[str] = field(default_factory=list)  # where every figure came from, and what is missing

    def parts(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "host_s": self.host_s, "comm_s": self.comm_s,
                "exposed_comm_s": self.exposed_comm_s}

    def as_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "step_time_parts": self.parts(), "step_time_bound": self.bound,
                "step_time_sources": list(self.sources)}


def flops_per_sample(flavor: Flavor, ac: bool, global_batch: int, flava_impl: str = FLAVA_DEFAULT) -> FlopCount:
    """FLOPs per sample before any run: the family's (``Family.plan_flops``)."""
    return family_of(flavor).plan_flops(flavor, ac, global_batch, {"flava_impl": flava_impl})


def layer_passes(flavor: Flavor, flava_impl: str = FLAVA_DEFAULT) -> list[tuple[str, float]]:
    """The forward's layer passes in order: (unit id, relative compute ~ tokens), the family's
    (``Family.layer_passes``). TorchMultimodal's FLAVA runs its image and text encoders twice
    (plain, masked), the sdpa FLAVA once over both inputs (models/flava_passes.py); the fusion
    encoder runs once."""
    return family_of(flavor).layer_passes(flavor, {"flava_impl": flava_impl})


def table_name(strategy: Strategy) -> tuple[str, str]:
    """The host table's name for ``strategy`` (benchmarks/host_table.py measured one rank), and what
    that maps: every FSDP1 sharding as ``fsdp-full`` and every FSDP2 one as ``fsdp2-full`` (at one
    rank FSDP1 runs them all as NO_SHARD; the per-unit hooks are the same), ``-ac-reentrant`` as
    ``-ac``; ``-sac`` is its own row (it recomputes only elementwise work)."""
    base = {"single": "single", "ddp": "ddp", "fsdp": "fsdp-full", "fsdp2": "fsdp2-full"}[strategy.wrapper]
    ac = ("-sac" if strategy.selective else "-ac") if strategy.ac else ""
    name = base + ac + ("-compile" if strategy.compile else "")
    note = "" if name == str(strategy) else f"; {strategy} as {name}"
    return name, note


def host_seconds(spec: RunSpec, rates: Rates, site: Site, flava_impl: str = FLAVA_DEFAULT,
                 table: HostTable | None = None) -> tuple[float, str]:
    """The step's host work: the host table's measured row (or the model's ``single`` x the family's
    measured ratio) x the calibration host's ``table_factor`` x the site's ``cpu_factor``; where the
    calibration has no table factor (the CPU calibrations: cpu.json, cpu_wide.json) or the table nothing for the
    rung, the STATED per-op figures of the module docstring, labelled so."""
    flavor = get_flavor(spec.model)
    family = family_of(flavor)
    impl = recorded(family, flava_impl)
    name, note = table_name(spec.strategy)
    why = "the calibration prices host work per aten op"
    stated_extra = 1 - 1 / WRAPPER_HOST[spec.strategy.wrapper]  # the share beyond single's, stated
    if rates.table_factor is not None:
        t = table or host_table()
        found = t.host_ms(spec.model, flavor.family, name, impl)
        if found is not None:
            ms, how = found
            # units of k: the same rung's single (AC and compile kept), for the share beyond it
            single = (t.host_ms(spec.model, flavor.family, "single" + name.removeprefix("fsdp2-full"), impl)
                      if spec.strategy.is_fsdp2 and spec.knobs.unit_layers > 1 else None)
            factor, unit_note = unit_host_factor(spec, max(0.0, 1 - single[0] / ms) if single else stated_extra)
            s = ms * factor * 1e-3 * rates.table_factor * site.cpu_factor
            return s, (f"host: {ms:.1f} ms on the table's machine ({t.where}: {how}{note}"
                       + (f", FLAVA {impl}" if impl else "") + f"{unit_note}) x table_factor {rates.table_factor} "
                       f"({rates.host_source}) x cpu_factor {site.cpu_factor} ({site.cpu_source})")
        why = f"{t.where} has no {spec.model}/{name}" + (f" ({impl})" if impl else "") + " nor its parts"
    ops = float(len(layer_passes(flavor, flava_impl)) * family.ops_per_layer_pass)
    ops *= (1 + AC_FORWARD_SHARE if spec.strategy.ac else 1.0) * WRAPPER_HOST[spec.strategy.wrapper]
    factor, unit_note = unit_host_factor(spec, stated_extra)
    ops *= factor
    s = ops * rates.us_per_op * 1e-6 * site.cpu_factor
    return s, (f"host: STATED {ops:,.0f} aten ops x {rates.us_per_op} us x {site.cpu_factor} ({site.cpu_source}; "
               f"{why}{unit_note}); {rates.host_source}")


def layer_unit_count(flavor: Flavor, k: int) -> int:
    """FSDP layer units of k layers: ceil(n / k) per stack (``Family.layer_counts``)."""
    return sum(-(-n // k) for n in family_of(flavor).layer_counts(flavor))


def unit_host_factor(spec: RunSpec, extra_share: float) -> tuple[float, str]:
    """The host work of an FSDP2 rung with units of k layers over the same rung's at k = 1:
    ``1 - extra_share x UNIT_HOST_SHARE x (1 - units_k / units_1)``, where ``extra_share`` is the
    share of the k = 1 rung's host work beyond ``single``'s. (1.0, "") at k = 1."""
    k = spec.knobs.unit_layers
    if k == 1 or not spec.strategy.is_fsdp2:
        return 1.0, ""
    flavor = get_flavor(spec.model)
    u1, uk = layer_unit_count(flavor, 1), layer_unit_count(flavor, k)
    f = 1 - extra_share * UNIT_HOST_SHARE * (1 - uk / u1)
    return f, (f"; units of {k} layers: {uk} layer units for {u1}, x {f:.3f} (the per-unit share "
               f"{UNIT_HOST_SHARE} of the {extra_share:.0%} beyond single)")


def _depths(knobs: Any, fsdp2: bool) -> tuple[int | None, int | None, bool]:
    """(forward depth, backward depth, backward gather before the reduce) for the knobs."""
    if fsdp2:
        d = 1 + int(getattr(knobs, "prefetch_layers", 0))
        return d, d, False
    k = knobs if isinstance(knobs, Knobs) else Knobs()
    fwd = 1 if k.limit_all_gathers else None
    if k.backward_prefetch == "pre":
        return fwd, fwd, False
    return fwd, 0, k.backward_prefetch == "post"


def _fsdp_stages(setup: StepSetup, links: Links, rpn: int, fwd_s: float, bwd_s: float,
                 flava_impl: str = FLAVA_DEFAULT) -> list[Stage]:
    """Long because the forward's gathers, the backward's regathers and reductions (per sharding:
    FULL/GRAD_OP reduce-scatter, NO_SHARD all-reduce, HYBRID both) are one walk over the units.

    Per unit: the forward gathers it (again on each pass when it reshards after forward), the
    backward regathers it (FULL_SHARD, HYBRID) and reduces its gradient once after its last pass."""
    from scaleladder.planner.static import sharding

    sh = sharding(setup.strategy, setup.world)
    world, g = setup.world, sh.group
    flavor = setup.inv.flavor
    gbytes = setup.variant.gathered_param_bytes or fsdp_param_bytes(setup.precision)
    rbytes = 4 if setup.precision in ("bf16-mixed", "fp16-mixed") else storage_bytes(setup.precision)
    shard_link = links.for_group(g, 1, rpn)
    world_link = links.for_group(world, 1, rpn)
    rep_link = links.for_group(world // g, g, rpn) if world // g > 1 else None

    def gather(kind: str) -> float:
        return all_gather_s(setup.unit_full.get(kind, 0) * gbytes, g, shard_link) if sh.sharded else 0.0

    def reduce(kind: str) -> float:
        n = setup.grad_full.get(kind, 0) * rbytes
        if not sh.sharded:
            return all_reduce_s(n, world, world_link)
        out = reduce_scatter_s(n, g, shard_link)
        return out + (all_reduce_s(n / g, world // g, rep_link) if rep_link is not None else 0.0)

    fdepth, bdepth, post = _depths(setup.knobs, sh.fsdp2)
    passes = layer_passes(flavor, flava_impl)
    total_w = sum(w for _, w in passes)
    k = setup.knobs.unit_layers
    if k > 1:  # FSDP2's units of k layers: a stage per unit call, its gather and reduce k layers' worth
        passes, size = _unit_passes(passes, flavor, k)
    else:
        size = {}
    stages = [Stage(0.0, gather("root") + (gather("codebook") if setup.inv.codebook else 0.0), 0.0, fdepth)]
    seen: set[str] = set()
    for unit, w in passes:
        again = sh.reshard_after_forward or unit not in seen
        stages.append(Stage(fwd_s * w / total_w, size.get(unit, 1) * gather("layer") if again else 0.0, 0.0, fdepth))
        seen.add(unit)
    back = list(reversed(passes))
    last = {u: i for i, (u, _) in enumerate(back)}
    regathered: set[str] = set()
    for i, (unit, w) in enumerate(back):
        n = size.get(unit, 1)
        g_s = n * gather("layer") if sh.reshard_after_forward and unit not in regathered else 0.0
        regathered.add(unit)
        stages.append(Stage(bwd_s * w / total_w, g_s, n * reduce("layer") if last[unit] == i else 0.0, bdepth, post))
    stages.append(Stage(0.0, 0.0, reduce("root")))
    return stages


def _unit_passes(passes: list[tuple[str, float]], flavor: Flavor, k: int) -> tuple[list[tuple[str, float]], dict[str, int]]:
    """The layer passes merged into unit passes for units of k layers: each layer named by its unit
    (the layers in order of first appearance, split into the family's stacks, k at a time, the last
    unit of a stack the remainder), consecutive passes of one unit one stage (their compute summed);
    and the layers of each unit. The replay's prefetch depth then counts units, as pf<n> does."""
    order = list(dict.fromkeys(u for u, _ in passes))
    unit_of: dict[str, str] = {}
    size: dict[str, int] = {}
    start = 0
    for n in family_of(flavor).layer_counts(flavor):
        for i in range(0, n, k):
            name = f"u{len(size)}"
            members = order[start + i:start + min(i + k, n)]
            size[name] = len(members)
            unit_of.update((m, name) for m in members)
        start += n
    merged: list[tuple[str, float]] = []
    for layer, w in passes:
        unit = unit_of[layer]
        if merged and merged[-1][0] == unit:
            merged[-1] = (unit, merged[-1][1] + w)
        else:
            merged.append((unit, w))
    return merged, size


def _ddp_stages(trainable: int, grad_bytes: int, world: int, links: Links, rpn: int,
                fwd_s: float, bwd_s: float) -> list[Stage]:
    """DDP: the forward, then the backward in gradient buckets (a 1 MiB first bucket, then 25 MiB),
    each all-reduced over the world as soon as it is full (in the order autograd fills them)."""
    total = trainable * grad_bytes
    sizes, left = [], total
    for cap in [DDP_FIRST_BUCKET_BYTES] + [DDP_BUCKET_BYTES] * (total // DDP_BUCKET_BYTES + 1):
        if left <= 0:
            break
        sizes.append(min(cap, left))
        left -= sizes[-1]
    link = links.for_group(world, 1, rpn)
    return [Stage(fwd_s)] + [Stage(bwd_s * b / total, 0.0, all_reduce_s(b, world, link)) for b in sizes]


def predict_step(spec: RunSpec, world: int, ranks_per_node: int, batch: int, rates: Rates,
                 site: Site = Site(), setup: StepSetup | None = None, flava_impl: str = FLAVA_DEFAULT,
                 table: HostTable | None = None) -> StepTime:
    """One rung's step time at local ``batch`` on ``world`` ranks (see the module docstring); a
    FLAVA rung as ``flava_impl`` builds it (the runner's default, ``sdpa``), its host work from
    ``table`` (default: the committed host table)."""
    flavor = get_flavor(spec.model)
    setup = setup or step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, world)
    fc = flops_per_sample(flavor, spec.strategy.ac, batch * world, flava_impl)
    gpu = batch * fc.hardware / rates.flops_per_s(flavor.hidden)
    fwd_s, bwd_s = gpu * fc.forward / fc.hardware, gpu * (1 - fc.forward / fc.hardware)
    opt_s = setup.local.trainable * OPT_BYTES_PER_PARAM / rates.hbm_bps
    sources = [f"compute: {batch * fc.hardware / 1e12:.3g} TFLOP (hardware) at {rates.flops_per_s(flavor.hidden) / 1e12:.0f} "
               f"TFLOP/s, {rates.compute_source}; optimizer {opt_s * 1e3:.2f} ms of HBM traffic"]
    if spec.strategy.compile:
        sources.append("compile: the eager rung's hardware FLOPs at the eager rate (inductor's fusion of the "
                       "memory-bound ops is not modelled: an upper bound on the compute); the compile time is "
                       "per job (the profile's timing.compile_s), not per step")
    host, hsrc = host_seconds(spec, rates, site, flava_impl, table)
    sources.append(hsrc)
    w, links = spec.strategy.wrapper, site.links
    stages = [Stage(gpu)]
    if world > 1 and w != "single" and links is None:
        sources.append(f"{site.links_note}: step time is compute + host, communication not modelled")
    elif w == "ddp" and links is not None:
        stages = _ddp_stages(setup.inv.trainable_numel, storage_bytes(spec.precision), world, links,
                             ranks_per_node, fwd_s, bwd_s)
    elif w in ("fsdp", "fsdp2") and links is not None:
        stages = _fsdp_stages(setup, links, ranks_per_node, fwd_s, bwd_s, flava_impl)
    sched: Schedule = schedule(stages + [Stage(opt_s)], rates.overlap)
    device_s = sched.total_s
    if rates.device == "cpu":
        step, bound = host + device_s, "cpu"
    else:
        step, bound = max(host, device_s), ("host" if host > device_s else "gpu")
    return StepTime(step, sched.compute_s, host, sched.comm_s, sched.exposed_s, bound, sources)
