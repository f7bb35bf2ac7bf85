"""An independent check of the planner: torch's own memory trackers on fake CPU tensors.

:func:`measure` builds a rung's full-size model on FAKE tensors (no storage), wraps it with
the runner's own apply_strategy, optimizer and scaler, and runs two real training steps of the
runner's step under ``MemTracker`` (``FSDPMemTracker`` for FSDP2, on the fake process group as
rank 0 of ``world``); the second step's peak and static categories are compared with
:func:`scaleladder.planner.memory.predict`. The traps met are ``TRAP:`` comments where each is
handled. Why, results and limits: docs/planner.md, "Validation" ("Held against PyTorch's
MemTracker").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scaleladder.models.flava_impl import SDPA
from scaleladder.spec import RunSpec, SpecError

if TYPE_CHECKING:
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


def _fake_materialize(model: Any, device: Any) -> None:
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
        raise SpecError(f"{spec.path}: the planner check covers single, FSDP1 on one rank and FSDP2 at a fixed batch")
    t0 = time.perf_counter()
    steps = run_steps(spec, world, int(spec.batch), flava_impl)
    pred = predict(spec, world, world, "cpu", variant=Variant(flava_impl=flava_impl))
    return Check(spec.path, world, steps.peak_total, int(pred.peak_bytes), steps.categories(),
                 {k: int(v) for k, v in pred.breakdown.items() if k != "overhead"}, time.perf_counter() - t0)


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
    # TRAP: DDP cannot be built on fake tensors: its constructor verifies and broadcasts the parameters
    # and its reducer makes its buckets, all reading tensor data ("data is not allocated yet").
    if spec.strategy.compile or spec.strategy.wrapper == "ddp" or spec.strategy.is_fsdp1 and world > 1:
        raise SpecError(f"{spec.path}: the planner check covers single, FSDP1 on one rank and FSDP2 at a fixed batch")
    spec.strategy.check_world(world)
    if family.freezes_unused:
        unused_parameter_names(family.name)  # the probe runs before any process group (rung.unused_params)
    device = torch.device("cpu")
    prec = policy(spec.precision)
    with _group(world):
        mesh_patch = _premade_meshes(spec, world)
        model = _build(flavor, "meta" if fake else "cpu", flava_impl)
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(), mesh_patch:
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
            with tracker, _phase_split(tracker, optimizer, phases):  # the second step: the steady state
                step(pool[1 % len(pool)])
            out = Steps(batch, phases, _moments(tracker), sum(_local_numel(p) for p in wrapped.parameters() if p.requires_grad))
            tracker.reset_mod_stats()
            if count:
                _count(step, pool[0], out)
    return out


def _build(flavor: Flavor, device: str, flava_impl: str) -> TrainModule:
    """The rung's model, as the runner builds it (through its family). TRAP: on meta and OUTSIDE
    fake mode (timm's ``create_model`` fails inside it: drop-path's data-dependent op)."""
    from scaleladder.models.build import build_model

    return build_model(flavor, device, flava_impl=flava_impl)


def _pool(flavor: Flavor, batch: int, device: Any, dtype: Any) -> list[dict[str, Any]]:
    """The runner's pool of synthetic batches (rung/batches.py: the family's samples), resident."""
    from scaleladder.models.batch_layout import SYNTHETIC_POOL
    from scaleladder.rung.batches import SyntheticBatches

    return SyntheticBatches(flavor, batch, 0, SYNTHETIC_POOL, 0, device, dtype=dtype).pool


def _premade_meshes(spec: RunSpec, world: int) -> contextlib.AbstractContextManager[Any]:
    """FSDP2's device meshes, made now. TRAP: init_device_mesh must run before fake mode;
    apply_strategy asks for it inside."""
    if not spec.strategy.is_fsdp2:
        return contextlib.nullcontext()
    import torch.distributed.device_mesh as dm

    real = dm.init_device_mesh
    meshes: dict[Any, Any] = {}
    shapes: list[tuple[tuple[int, ...], tuple[str, ...]]] = [((world,), ("shard",))]
    if spec.strategy.sharding == "hybrid":
        group = spec.strategy.group or 1
        shapes.append(((world // group, group), ("replicate", "shard")))
    for shape, names in shapes:
        meshes[(shape, names)] = real("cpu", shape, mesh_dim_names=names)

    def premade(device_type: str, shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None = None) -> Any:
        key = (tuple(shape), tuple(mesh_dim_names or ()))
        if key not in meshes:
            raise SpecError(f"{spec.path}: the planner check makes the meshes {sorted(meshes)} only, not {shape}")
        return meshes[key]

    return _patched(dm, "init_device_mesh", premade)


def _local_numel(p: Any) -> int:
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


def _top_level_aten(events: Any) -> int:
    """The profiler's ``aten::`` events with no ``aten::`` event above them: what
    benchmarks/bench_host.py counts as a step's aten ops (an op inside another op is not counted again)."""
    def nested(e: Any) -> bool:
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
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class _NoHook:
    def remove(self) -> None:
        pass


def _no_hooks_on_frozen(tracker: Any, model: Any) -> None:
    """TRAP: MemTracker registers a gradient hook on every parameter of a module it meets, and a
    frozen one (FLAVA's codebook, its unused heads) refuses it ("cannot register a hook on a tensor
    that doesn't require gradient"). A placeholder handle makes the tracker skip them; it clears
    its handles at every exit, so this runs before every entry."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


def _tracker(wrapped: Any, optimizer: Any, spec: RunSpec) -> Any:
    if spec.strategy.is_fsdp2:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return FSDPMemTracker(wrapped, optimizer)
    from torch.distributed._tools.mem_tracker import MemTracker

    return MemTracker()
