"""An independent check of the planner: torch's own memory trackers on fake CPU tensors.

:func:`measure` builds a rung's full-size model on FAKE tensors (no storage), wraps it with
the runner's own apply_strategy, optimizer and scaler, and runs two real training steps of the
runner's step under ``MemTracker`` (``FSDPMemTracker`` for FSDP2), on the fake process group as
rank 0 of ``world``, for every wrapper: FSDP1 at any sharding (HYBRID on its 2-D mesh), FSDP2, DDP
(:func:`_wrapping`); the second step's peak and static categories are compared with
:func:`scaleladder.planner.memory.predict`, and its collectives' bytes counted (:class:`Collectives`).
:func:`build_and_wrap` builds and wraps only (``scaleladder rehearse``: campaign/rehearse.py). The traps met are ``TRAP:`` comments where each is
handled. Why, results and limits: docs/planner.md, "Validation" ("Held against PyTorch's
MemTracker").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from scaleladder.models.flava_impl import SDPA
from scaleladder.spec import RunSpec, SpecError

if TYPE_CHECKING:
    import torch

    from scaleladder.flavors import Flavor
    from scaleladder.models.build import TrainModule

#: MemTracker's categories that are static across a step, against the planner's breakdown keys.
STATIC = {"params": ("Parameter", "Sharded Param"), "optimizer": ("Optstate", "OptState")}


@dataclass
class Check:
    spec: str
    world: int
    tracked_peak: int  # bytes, the tracker's peak of the second step
    planned_peak: int  # bytes, scaleladder plan's peak
    tracked: dict[str, int] = field(default_factory=dict)  # the tracker's categories at its peak
    planned: dict[str, int] = field(default_factory=dict)  # the planner's breakdown at its peak
    seconds: float = 0.0
    collectives: dict[str, int] = field(default_factory=dict)  # bytes per kind, the second step (Collectives)

    @property
    def error(self) -> float:
        """planned ÷ tracked − 1."""
        return self.planned_peak / self.tracked_peak - 1 if self.tracked_peak else float("nan")

    def static(self, kind: str) -> tuple[int, int]:
        """(tracked, planned) bytes of a static category: ``params`` or ``optimizer``."""
        return sum(self.tracked.get(k, 0) for k in STATIC[kind]), int(self.planned.get(kind, 0))

    def lines(self) -> list[str]:
        mib = 2**20
        out = [f"{self.spec} at world {self.world}: planner {self.planned_peak / mib:.1f} MiB, torch's tracker "
               f"{self.tracked_peak / mib:.1f} MiB, planned/tracked - 1 = {self.error:+.1%} ({self.seconds:.0f} s)"]
        for kind in STATIC:
            t, p = self.static(kind)
            out.append(f"  {kind}: planner {p / mib:.2f} MiB, tracker {t / mib:.2f} MiB")
        out.append("  tracker at its peak (MiB): " + ", ".join(f"{k} {v / mib:.2f}" for k, v in self.tracked.items() if v))
        out.append("  planner at its peak (MiB): " + ", ".join(f"{k} {v / mib:.2f}" for k, v in self.planned.items() if v))
        return out


@contextlib.contextmanager
def cuda_like_autocast() -> Iterator[None]:
    """CPU autocast with CUDA's fp32 choices for softmax, log_softmax and cross-entropy.

    TRAP: CPU autocast keeps them in bf16 (CUDA's autocast lists them fp32), so a CPU trace
    would undercount what the GPU saves for them. The functional forms the models call are
    wrapped for the duration to upcast a low-precision input first, as CUDA autocast does."""
    import torch
    import torch.nn.functional as F

    saved = {name: getattr(F, name) for name in ("softmax", "log_softmax", "cross_entropy")}
    saved_torch = {name: getattr(torch, name) for name in ("softmax", "log_softmax")}

    def upcast(fn: Any) -> Any:
        def wrapped(x: Any, *a: Any, **k: Any) -> Any:
            if torch.is_autocast_enabled("cpu") and getattr(x, "dtype", None) in (torch.bfloat16, torch.float16):
                x = x.float()
            return fn(x, *a, **k)
        return wrapped

    try:
        for name, fn in saved.items():
            setattr(F, name, upcast(fn))
        for name, fn in saved_torch.items():
            setattr(torch, name, upcast(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(F, name, fn)
        for name, fn in saved_torch.items():
            setattr(torch, name, fn)


def _fake_materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Each meta parameter and buffer replaced by an empty fake one on ``device`` (in fake mode).

    TRAP: ``to_empty``/``to`` go through ``Module._apply``, which must swap fake parameters
    (``swap_tensors``) and fails ("Couldn't swap Conv2d.weight"); init functions such as
    ``trunc_normal_`` raise under fake mode. Empty tensors need neither."""
    import torch

    # TRAP: tied parameters (FLAVA's MLM/MIM heads: ``decoder.bias`` IS ``cls.bias``) must stay one
    # parameter: replaced one module at a time, the tie breaks, freeze_unused freezes one name of
    # the two and FSDP1 meets a unit mixing frozen and trainable ("uniform requires_grad").
    made: dict[int, torch.nn.Parameter] = {}
    for m in model.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            if id(p) not in made:
                made[id(p)] = torch.nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
            setattr(m, name, made[id(p)])
        for name, b in list(m.named_buffers(recurse=False)):
            m._buffers[name] = torch.empty_like(b, device=device)


@contextlib.contextmanager
def _group(world: int) -> Iterator[None]:
    """A process group for apply_strategy: a real one-rank gloo group, or torch's fake group playing
    rank 0 of ``world`` (collectives return at once; FSDP2 shards as on ``world`` ranks)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise SpecError("the planner check makes its own process group; one exists already")
    # TRAP: torch.distributed.nn.functional.all_gather (FLAVA's contrastive loss, through
    # TorchMultimodal) takes ``group=group.WORLD`` as a default argument, evaluated at import: imported
    # first while a check's group exists, it keeps that group, and the next check's backward fails
    # ("not initialized in the world group map"). Imported here, before any group, the default is None.
    import torch.distributed.nn.functional  # noqa: F401
    if world == 1:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    else:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def measure(spec: RunSpec, world: int = 1, flava_impl: str = SDPA) -> Check:
    """Two runner steps of ``spec`` under torch's memory tracker, and the planner's prediction.
    ``flava_impl``: the FLAVA a rung builds (models/flava_impl.py); only ``sdpa`` can be checked."""
    from scaleladder.planner.memory import predict
    from scaleladder.planner.step_setup import Variant

    if spec.batch == "max":
        raise SpecError(f"{spec.path}: the planner check covers a fixed batch, not 'max'")
    t0 = time.perf_counter()
    steps = run_steps(spec, world, int(spec.batch), flava_impl)
    pred = predict(spec, world, world, "cpu", variant=Variant(flava_impl=flava_impl))
    tracked = fsdp1_categories(steps) if spec.strategy.is_fsdp1 else steps.categories()
    return Check(spec.path, world, steps.peak_total, int(pred.peak_bytes), tracked,
                 {k: int(v) for k, v in pred.breakdown.items() if k != "overhead"}, time.perf_counter() - t0,
                 steps.collectives)


def planned_collectives(spec: RunSpec, world: int) -> dict[str, int]:
    """The bytes per kind of collective the planner prices for one step of ``spec`` on ``world`` ranks:
    planner/steptime.py's FSDP and DDP stages, walked for their volumes (the full side of each
    collective, as :class:`Collectives` counts them) instead of their times."""
    from scaleladder.flavors import get_flavor
    from scaleladder.planner.static import fsdp_param_bytes, sharding, storage_bytes
    from scaleladder.planner.step_setup import step_setup
    from scaleladder.planner.steptime import layer_passes

    out: dict[str, int] = {}

    def add(kind: str, n: float) -> None:
        if n:
            out[kind] = out.get(kind, 0) + int(n)

    if world == 1 or spec.strategy.wrapper == "single":
        return out
    setup = step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, world)
    if spec.strategy.wrapper == "ddp":
        add("all_reduce", setup.inv.trainable_numel * storage_bytes(spec.precision))
        return out
    sh = sharding(setup.strategy, world)
    gbytes = setup.variant.gathered_param_bytes or fsdp_param_bytes(setup.precision)
    rbytes = 4 if setup.precision in ("bf16-mixed", "fp16-mixed") else storage_bytes(setup.precision)

    # A collective over one rank moves nothing: the planner prices it at 0 s (planner/comm.py) and torch
    # issues none (FSDP2 HYBRID 1's shard groups of one rank: only the replicas' all-reduce).
    def gather(kind: str) -> None:
        if sh.sharded and sh.group > 1:
            add("all_gather", setup.unit_full.get(kind, 0) * gbytes)

    def reduce(kind: str) -> None:
        n = setup.grad_full.get(kind, 0) * rbytes
        if not sh.sharded:
            add("all_reduce", n)
            return
        if sh.group > 1:
            add("reduce_scatter", n)
        if world // sh.group > 1:
            add("all_reduce", n / sh.group)

    gather("root")
    if setup.inv.codebook:
        gather("codebook")
    passes = layer_passes(get_flavor(spec.model))
    seen: set[str] = set()
    for unit, _ in passes:
        if sh.reshard_after_forward or unit not in seen:
            gather("layer")
        seen.add(unit)
    for _unit in {u for u, _ in passes}:  # the backward regathers (resharded) and reduces each unit once
        if sh.reshard_after_forward:
            gather("layer")
        reduce("layer")
    reduce("root")
    return out


#: Where FSDP1's gathered flat parameters go among the tracker's categories (:func:`fsdp1_categories`).
GATHERED = "Parameter (gathered)"


def fsdp1_categories(steps: Steps) -> dict[str, int]:
    """The tracker's categories at the peak, FSDP1's parameters split in two. TRAP: torch's generic
    ``MemTracker`` files a unit's gathered (unsharded) flat parameter as "Parameter", beside the shard
    (``FSDPMemTracker``, which tells them apart, is FSDP2's only). At the optimizer step every unit is
    resharded, so the "Parameter" seen there is the shards, the planner's ``params``; what the peak holds
    above it is gathered, :data:`GATHERED`, part of the planner's ``buffers`` (docs/planner.md)."""
    cats = steps.categories()
    sharded = steps.phases.get(PHASES[1], {}).get("Parameter", cats.get("Parameter", 0))
    gathered = cats.get("Parameter", 0) - sharded
    if gathered > 0:
        cats["Parameter"] = sharded
        cats[GATHERED] = gathered
    return cats


#: The two phases of a step whose peaks :func:`run_steps` keeps apart: forward and backward (up to
#: the optimizer's ``step()`` call), then the optimizer step and ``zero_grad``.
PHASES = ("forward-backward", "optimizer")


@dataclass
class Steps:
    """What torch's tracker saw in the second runner step (the steady state) at one local batch.

    ``phases``: per phase (:data:`PHASES`), the tracker's categories at that phase's peak, its
    ``Total`` included. ``moments``: the same at every moment the tracker snapshots for each module
    call (before and after its forward and its backward, and its peak within each; a recomputed
    forward too), keyed ``fqn|state|call``. With ``count``, the counted third step: ``flops`` and ``forward_flops``
    (FlopCounterMode, the whole local batch; recomputed forwards included), ``aten_ops`` (its
    top-level aten ops, as benchmarks/bench_host.py counts them from a profiler trace) and
    ``width`` (the FLOP-weighted median of the narrowest dimension of its matrix products)."""

    batch: int
    phases: dict[str, dict[str, int]]
    moments: dict[str, dict[str, int]] = field(default_factory=dict)
    trainable: int = 0  # trainable elements on the rank (its shard under FSDP)
    flops: float = 0.0
    forward_flops: float = 0.0
    aten_ops: int = 0
    width: float = 0.0
    collectives: dict[str, int] = field(default_factory=dict)  # bytes per kind of collective, the second step

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=lambda ph: self.phases[ph].get("Total", 0))

    @property
    def peak_total(self) -> int:
        return self.phases[self.peak_phase].get("Total", 0)

    def categories(self) -> dict[str, int]:
        """The tracker's categories at the step's peak, without the total."""
        return {k: v for k, v in self.phases[self.peak_phase].items() if k != "Total"}


def run_steps(spec: RunSpec, world: int, batch: int, flava_impl: str = SDPA, count: bool = False,
              fake: bool = True) -> Steps:
    """Two steps of the runner's step for ``spec`` at local ``batch`` under torch's memory tracker,
    as rank 0 of ``world`` (module docstring); with ``count``, a third one counted (:class:`Steps`).

    ``fake``: on fake tensors, the full-size model built on meta (no storage); ``False`` builds it
    for real on the CPU and trains it (for tests that hold the fake trace against real tensors).
    Shared by :func:`measure` and ``campaign/plan_trace.py`` (the traced memory model)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scaleladder.flavors import get_flavor
    from scaleladder.models.families import family_of
    from scaleladder.rung.optim import backward_and_step, make_optimizer, make_scaler
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy
    from scaleladder.rung.unused_params import unused_parameter_names

    flavor = get_flavor(spec.model)
    family = family_of(flavor)
    if family.uses_flava_impl and flava_impl != SDPA:
        # TRAP: TorchMultimodal's FLAVA loss indexes by boolean masks (multimodal_masked_sequence[pos_mask]):
        # a nonzero, whose output size fake tensors cannot know. The sdpa FLAVA's losses select by labels.
        raise SpecError(f"{spec.model}: the planner check does not cover FLAVA --flava-impl {flava_impl} (its masked "
                        "indexing is a nonzero whose size fake tensors cannot know; docs/planner.md)")
    if spec.strategy.compile:
        # TRAP: inductor refuses fake tensors on the meta/CPU mix; a compiled rung is built and wrapped
        # only (:func:`build_and_wrap`), its memory planned as its eager rung's.
        raise SpecError(f"{spec.path}: the planner check traces eager rungs at a fixed batch; a -compile rung "
                        "can be built and wrapped on fake tensors, not traced (inductor refuses them)")
    spec.strategy.check_world(world)
    if family.freezes_unused:
        unused_parameter_names(family.name)  # the probe runs before any process group (rung.unused_params)
    device = torch.device("cpu")
    prec = policy(spec.precision)
    comm = Collectives()
    with _group(world), _wrapping(spec, world, comm):
        model = _build(flavor, "meta" if fake else "cpu", flava_impl)
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
            if fake:
                _fake_materialize(model, device)
                model.to = lambda *a, **k: model  # type: ignore[method-assign]  # already on the device (see _fake_materialize)
            if prec.storage_dtype != torch.float32:
                for p in model.parameters():
                    p.data = p.data.to(prec.storage_dtype)
            wrapped, _ = apply_strategy(model, spec.strategy, spec.knobs, prec, device)
            optimizer = make_optimizer(wrapped.parameters(), 1e-4, spec.precision)
            scaler = make_scaler(spec.precision, spec.strategy, device)
            pool = _pool(flavor, batch, device, prec.storage_dtype)
            autocast = prec.autocast_dtype

            def step(b: dict[str, Any], after_forward: Any = None) -> None:
                with cuda_like_autocast(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                    loss = wrapped(b)
                if after_forward is not None:
                    after_forward()
                backward_and_step(loss, optimizer, scaler)

            # The first step makes the optimizer's state; untracked, it costs a third of the time the
            # tracker would add (it visits every tracked module at each allocation). The tracker meets
            # the state, the parameters and the pool as they stand after it.
            step(pool[0])
            tracker = _tracker(wrapped, optimizer, spec)
            if not spec.strategy.is_fsdp2:
                tracker.track_external(wrapped, optimizer, pool)
            else:
                tracker.track_inputs(tuple(pool))
            phases: dict[str, dict[str, int]] = {}
            _no_hooks_on_frozen(tracker, wrapped)
            with tracker, _phase_split(tracker, optimizer, phases), comm.counting():  # the second step: the steady state
                step(pool[1 % len(pool)])
            out = Steps(batch, phases, _moments(tracker), sum(_local_numel(p) for p in wrapped.parameters() if p.requires_grad),
                        collectives=dict(comm.bytes))
            tracker.reset_mod_stats()
            if count:
                _count(step, pool[0], out)
    return out


#: The c10d ops a step's collectives reach the dispatcher as (FSDP1: ``allgather_`` and
#: ``_reduce_scatter_base_``, ``allreduce_`` across HYBRID's replicas and for NO_SHARD; FSDP2:
#: ``_allgather_base_`` and ``_reduce_scatter_base_``), each to the kind the planner prices.
C10D_KINDS = {"allgather_": "all_gather", "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
              "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
              "reduce_scatter_tensor_coalesced_": "reduce_scatter", "allreduce_": "all_reduce",
              "allreduce_coalesced_": "all_reduce"}


class Collectives:
    """The bytes of every collective a step issues, per kind (:data:`C10D_KINDS`'s values): the FULL
    side of each (a gather's output, a reduce-scatter's input, an all-reduce's tensor), as the planner
    prices them (planner/steptime.py's FSDP and DDP stages). FSDP's are seen by a dispatch mode on the
    c10d ops; DDP's in its comm hook (:func:`_wrapping`), which reduces through no c10d op of its own."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.active = False

    def add(self, kind: str, n: int) -> None:
        if self.active:
            self.bytes[kind] = self.bytes.get(kind, 0) + int(n)

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class _Count(TorchDispatchMode):
            def __torch_dispatch__(self, func: _Op, types: object, args: tuple[object, ...] = (),
                                   kwargs: dict[str, object] | None = None) -> object:
                name = func._schema.name
                if name.startswith("c10d::") and name[6:] in C10D_KINDS:
                    outer.add(C10D_KINDS[name[6:]], max(_nbytes(a) for a in args[:2]))
                return func(*args, **(kwargs or {}))

        self.active = True
        try:
            with _Count():  # type: ignore[no-untyped-call]  # torch's mode has an untyped __init__
                yield
        finally:
            self.active = False


class _Event(Protocol):
    """A profiler event, as far as :func:`_top_level_aten` reads it."""

    name: str
    cpu_parent: _Event | None


class _Op(Protocol):
    _schema: _Schema

    def __call__(self, *args: object, **kwargs: object) -> object: ...


class _Schema(Protocol):
    name: str


def _nbytes(x: object) -> int:
    """Bytes of the tensors in ``x`` (a tensor, or lists of them); 0 for anything else."""
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    numel, size = getattr(x, "numel", None), getattr(x, "element_size", None)
    return int(numel()) * int(size()) if callable(numel) and callable(size) else 0


@contextlib.contextmanager
def _wrapping(spec: RunSpec, world: int, comm: Collectives | None = None) -> Iterator[None]:
    """What apply_strategy needs to wrap ``spec`` on fake tensors as rank 0 of ``world``: the meshes made
    before fake mode (:func:`_premade_meshes`); for DDP, ``init_sync=False`` and a comm hook.

    TRAP: DDP's constructor broadcasts and verifies the parameters, reading their data ("data is not
    allocated yet" on fake tensors): ``init_sync=False`` skips it. TRAP: the fake group's all-reduce
    future holds None, and c10d asserts on it when the bucket is read back: the hook returns the
    bucket's own buffer (what an all-reduce of equal replicas' mean would hold), counting its bytes."""
    import torch
    import torch.nn.parallel as par

    with contextlib.ExitStack() as stack:
        stack.enter_context(_premade_meshes(spec, world))
        if spec.strategy.wrapper == "ddp":
            real = par.DistributedDataParallel

            from torch._C._distributed_c10d import GradBucket

            def hook(_state: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
                buf = bucket.buffer()
                if comm is not None:
                    comm.add("all_reduce", buf.numel() * buf.element_size())
                fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
                fut.set_result(buf)
                return fut

            # TRAP: DDP checks the hook's annotations against the classes themselves, and this module's
            # are strings (``from __future__ import annotations``): given as the classes here.
            hook.__annotations__ = {"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]}

            def ddp(module: torch.nn.Module, *a: object, **k: object) -> torch.nn.Module:
                k.setdefault("init_sync", False)
                wrapped = real(module, *a, **k)  # type: ignore[arg-type]
                wrapped.register_comm_hook(None, hook)
                wrapped.reducer = _NoRebuild(wrapped.reducer)  # type: ignore[assignment]
                return wrapped

            stack.enter_context(_patched(par, "DistributedDataParallel", ddp))
        yield


class _NoRebuild:
    """DDP's reducer, but for the rebuild of its buckets in the second forward (autograd's order of the
    first backward), which it skips. TRAP: the rebuild broadcasts the new bucket indices from rank 0 and
    reads them back ("data is not allocated yet" on fake tensors). The buckets keep the constructor's
    order (the parameters reversed), the same sizes and bytes; what the rebuild changes is their order."""

    def __init__(self, reducer: object) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> object:
        return getattr(self._reducer, name)


def build_and_wrap(spec: RunSpec, world: int, flava_impl: str = SDPA) -> str:
    """Build ``spec``'s full-size model on fake tensors and wrap it with the runner's apply_strategy as
    rank 0 of ``world`` on the fake process group: no step. What ``scaleladder rehearse`` does to every
    rung (a -compile one included: torch.compile wraps lazily). Returns what the wrap reports."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scaleladder.flavors import get_flavor
    from scaleladder.models.families import family_of
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy
    from scaleladder.rung.unused_params import unused_parameter_names

    flavor = get_flavor(spec.model)
    family = family_of(flavor)
    spec.strategy.check_world(world)
    if family.freezes_unused:
        unused_parameter_names(family.name)
    device = torch.device("cpu")
    prec = policy(spec.precision)
    with _group(world), _wrapping(spec, world):
        model = _build(flavor, "meta", flava_impl)
        with FakeTensorMode(allow_non_fake_inputs=True):
            _fake_materialize(model, device)
            model.to = lambda *a, **k: model  # type: ignore[method-assign]
            if prec.storage_dtype != torch.float32:
                for p in model.parameters():
                    p.data = p.data.to(prec.storage_dtype)
            _, report = apply_strategy(model, spec.strategy, spec.knobs, prec, device)
    parts = [f"{report.fsdp_units} FSDP units" if report.fsdp_units else "",
             f"{report.ac_layers} AC layers" if report.ac_layers else "",
             f"{report.compiled_layers} compiled blocks" if report.compiled_layers else ""]
    return ", ".join(p for p in parts if p) or "wrapped"


def _build(flavor: Flavor, device: str, flava_impl: str) -> TrainModule:
    """The rung's model, as the runner builds it (through its family). TRAP: on meta and OUTSIDE
    fake mode (timm's ``create_model`` fails inside it: drop-path's data-dependent op)."""
    from scaleladder.models.build import build_model

    return build_model(flavor, device, flava_impl=flava_impl)


def _pool(flavor: Flavor, batch: int, device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    """The runner's pool of synthetic batches (rung/batches.py: the family's samples), resident."""
    from scaleladder.models.batch_layout import SYNTHETIC_POOL
    from scaleladder.rung.batches import SyntheticBatches

    return SyntheticBatches(flavor, batch, 0, SYNTHETIC_POOL, 0, device, dtype=dtype).pool


def _premade_meshes(spec: RunSpec, world: int) -> contextlib.AbstractContextManager[None]:
    """The device meshes apply_strategy will ask for (FSDP2's; FSDP1's 2-D HYBRID mesh), made now.
    TRAP: init_device_mesh must run before fake mode; apply_strategy asks for it inside. FSDP1 HYBRID
    must be given its mesh: without one it sizes its intra-node group from ``device_count()``."""
    fsdp1_hybrid = spec.strategy.is_fsdp1 and spec.strategy.sharding == "hybrid" and (spec.strategy.group or 1) > 1
    if not spec.strategy.is_fsdp2 and not fsdp1_hybrid:
        return contextlib.nullcontext()
    import torch.distributed.device_mesh as dm

    real = dm.init_device_mesh
    meshes: dict[tuple[tuple[int, ...], tuple[str, ...]], object] = {}
    shapes: list[tuple[tuple[int, ...], tuple[str, ...]]] = [] if fsdp1_hybrid else [((world,), ("shard",))]
    if spec.strategy.sharding == "hybrid":
        group = spec.strategy.group or 1
        shapes.append(((world // group, group), ("replicate", "shard")))
    for shape, names in shapes:
        meshes[(shape, names)] = real("cpu", shape, mesh_dim_names=names)

    def premade(device_type: str, shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None = None) -> object:
        key = (tuple(shape), tuple(mesh_dim_names or ()))
        if key not in meshes:
            raise SpecError(f"{spec.path}: the planner check makes the meshes {sorted(meshes)} only, not {shape}")
        return meshes[key]

    return _patched(dm, "init_device_mesh", premade)


def _local_numel(p: torch.Tensor) -> int:
    """Elements of ``p`` on this rank (an FSDP2 DTensor's local shard)."""
    local = getattr(p, "_local_tensor", None)
    return int((p if local is None else local).numel())


@contextlib.contextmanager
def _phase_split(tracker: Any, optimizer: Any, phases: dict[str, dict[str, int]]) -> Iterator[None]:
    """Keep the peak of forward + backward apart from the optimizer step's: when the runner calls
    ``optimizer.step()`` the tracker's peak so far is the first phase's; it is then reset, so the
    step's own peak (at least what is alive when it starts) is the second's. Fills ``phases``."""
    real_step = optimizer.step
    at_step: dict[str, int] = {}

    def snapshot(kind: str) -> dict[str, int]:
        snap = tracker.get_tracker_snapshot(kind)
        return {str(getattr(k, "value", k)): int(v) for k, v in next(iter(snap.values()), {}).items()}

    def step(*a: Any, **k: Any) -> Any:
        phases[PHASES[0]] = snapshot("peak")
        at_step.update(snapshot("current"))
        tracker._peak_mem.clear()  # the tracker's peak restarts here (mem_tracker.MemTracker._update_peak_stats)
        tracker._peak_mem_snap.clear()
        return real_step(*a, **k)

    optimizer.step = step
    try:
        yield
    finally:
        del optimizer.step  # the class's own again
        after = snapshot("peak")
        phases[PHASES[1]] = after if after.get("Total", 0) > at_step.get("Total", 0) else dict(at_step)
        phases.setdefault(PHASES[0], snapshot("peak"))


def _moments(tracker: Any) -> dict[str, dict[str, int]]:
    """Every per-module snapshot the tracker took in the step (:class:`Steps`'s ``moments``)."""
    out: dict[str, dict[str, int]] = {}
    for stats in tracker.memory_tracking.values():
        for state, snaps in stats.snapshots.items():
            for i, snap in enumerate(snaps):
                dev = next(iter(snap.values()), None)
                if dev:
                    out[f"{stats.mod_fqn}|{getattr(state, 'value', state)}|{i}"] = {
                        str(getattr(k, "value", k)): int(v) for k, v in dev.items()}
    return out


def _count(step: Any, batch: dict[str, Any], out: Steps) -> None:
    """One more step, counted: its FLOPs (forward, and forward + backward), its top-level aten ops
    and the width its matrix products run at (see :class:`Steps`)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    widths: list[tuple[float, float]] = []
    counter = FlopCounterMode(display=False, custom_mapping=_flop_formulas(widths))
    forward: list[float] = []
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof, counter:
        step(batch, lambda: forward.append(float(counter.get_total_flops())))
    out.flops = float(counter.get_total_flops())
    out.forward_flops = forward[0] if forward else 0.0
    out.aten_ops = _top_level_aten(prof.events())
    out.width = _weighted_median(widths)


def _flop_formulas(widths: list[tuple[float, float]]) -> dict[Any, Any]:
    """FlopCounterMode's formulas, two ways extended: the matrix products and convolutions also note
    (FLOPs, narrowest dimension) in ``widths``; the CPU's fused attention, which torch's table leaves
    out (its flash kernel for the CPU), is counted as the GPU's SDPA kernels are."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def noting(formula: Any, dims: Any) -> Any:
        def count(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            n = int(formula(*args, out_val=out_val, **kwargs))
            if dims is not None:
                widths.append((float(n), float(min(dims(*[fc.get_shape(a) for a in args[:3]])))))
            return n

        count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode passes the tensors as they are
        return count

    def conv_dims(x: Any, w: Any, *rest: Any) -> list[int]:
        k = 1
        for d in w[1:]:
            k *= d
        return [w[0], k]  # an implicit GEMM: C_out by C_in/groups x the kernel

    return {aten.mm: noting(fc.mm_flop, lambda a, b: (a[0], a[1], b[1])),
            aten.addmm: noting(fc.addmm_flop, lambda c, a, b: (a[0], a[1], b[1])),
            aten.bmm: noting(fc.bmm_flop, lambda a, b: (a[1], a[2], b[2])),
            aten.baddbmm: noting(fc.baddbmm_flop, lambda c, a, b: (a[1], a[2], b[2])),
            aten.convolution: noting(fc.conv_flop, conv_dims),
            aten._convolution: noting(fc.conv_flop, conv_dims),
            aten._scaled_dot_product_flash_attention_for_cpu: noting(fc.sdpa_flop, None),
            aten._scaled_dot_product_flash_attention_for_cpu_backward: noting(fc.sdpa_backward_flop, None)}


def _weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The median of the values weighted by their weights: (weight, value) pairs; 0 for none."""
    total = sum(w for w, _ in pairs)
    run = 0.0
    for w, v in sorted(pairs, key=lambda p: p[1]):
        run += w
        if run >= total / 2:
            return v
    return 0.0


def _top_level_aten(events: Iterable[_Event]) -> int:
    """The profiler's ``aten::`` events with no ``aten::`` event above them: what
    benchmarks/bench_host.py counts as a step's aten ops (an op inside another op is not counted again)."""
    def nested(e: _Event) -> bool:
        p = e.cpu_parent
        while p is not None:
            if p.name.startswith("aten::"):
                return True
            p = p.cpu_parent
        return False

    return sum(1 for e in events if e.name.startswith("aten::") and not nested(e))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """The profiler's native lines (kineto's start and stop, a failed GPU count on a CPU machine) off
    the console: file descriptor 2 goes to /dev/null for the counted step."""
    import os
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def _patched(obj: object, name: str, value: object) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class _NoHook:
    def remove(self) -> None:
        pass


def _no_hooks_on_frozen(tracker: Any, model: torch.nn.Module) -> None:
    """TRAP: MemTracker registers a gradient hook on every parameter of a module it meets, and a
    frozen one (FLAVA's codebook, its unused heads) refuses it ("cannot register a hook on a tensor
    that doesn't require gradient"). A placeholder handle makes the tracker skip them; it clears
    its handles at every exit, so this runs before every entry."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


def _tracker(wrapped: torch.nn.Module, optimizer: torch.optim.Optimizer, spec: RunSpec) -> Any:
    if spec.strategy.is_fsdp2:
        from scaleladder.campaign.unit_tracker import fsdp2_tracker

        # torch's own re-hooks every module of a unit: a unit of k blocks would run as k (unit_tracker.py)
        return fsdp2_tracker(wrapped, optimizer)
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker()
