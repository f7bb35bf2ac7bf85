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
from typing import Any

from scaleladder.models.flava_impl import SDPA
from scaleladder.spec import RunSpec, SpecError

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
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from scaleladder.flavors import get_flavor
    from scaleladder.models.build import build_model
    from scaleladder.planner.memory import predict
    from scaleladder.planner.step_setup import Variant
    from scaleladder.rung.batches import SyntheticBatches
    from scaleladder.rung.optim import backward_and_step, make_optimizer, make_scaler
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy
    from scaleladder.rung.unused_params import unused_parameter_names

    flavor = get_flavor(spec.model)
    if flavor.family == "flava" and flava_impl != SDPA:
        # TRAP: TorchMultimodal's FLAVA loss indexes by boolean masks (multimodal_masked_sequence[pos_mask]):
        # a nonzero, whose output size fake tensors cannot know. The sdpa FLAVA's losses select by labels.
        raise SpecError(f"{spec.model}: the planner check does not cover FLAVA --flava-impl {flava_impl} (its masked "
                        "indexing is a nonzero whose size fake tensors cannot know; docs/planner.md)")
    if spec.strategy.compile or spec.strategy.is_fsdp1 and world > 1 or spec.batch == "max":
        raise SpecError(f"{spec.path}: the planner check covers single, ddp, FSDP1 on one rank and FSDP2 at a fixed batch")
    spec.strategy.check_world(world)
    t0 = time.perf_counter()
    unused_parameter_names(flavor.family)  # the probe runs before any process group (rung.unused_params)
    device = torch.device("cpu")
    prec = policy(spec.precision)
    batch = int(spec.batch)
    with _group(world):
        mesh_patch: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if spec.strategy.is_fsdp2:
            # TRAP: init_device_mesh must run before fake mode; apply_strategy asks for it inside.
            import torch.distributed.device_mesh as dm

            real = dm.init_device_mesh
            meshes: dict[Any, Any] = {}
            for shape, names in (((world,), ("shard",)),):
                meshes[(shape, names)] = real("cpu", shape, mesh_dim_names=names)

            def premade(device_type: str, shape: tuple[int, ...], mesh_dim_names: tuple[str, ...] | None = None) -> Any:
                key = (tuple(shape), tuple(mesh_dim_names or ()))
                if key not in meshes:
                    raise SpecError(f"{spec.path}: the planner check makes 1-D meshes only, not {shape}")
                return meshes[key]

            mesh_patch = _patched(dm, "init_device_mesh", premade)
        model = build_model(flavor, "meta", flava_impl=flava_impl)
        with FakeTensorMode(allow_non_fake_inputs=True), mesh_patch:
            _fake_materialize(model, device)
            model.to = lambda *a, **k: model  # type: ignore[method-assign]  # already on the device (see _fake_materialize)
            if prec.storage_dtype != torch.float32:
                for p in model.parameters():
                    p.data = p.data.to(prec.storage_dtype)
            wrapped, _ = apply_strategy(model, spec.strategy, spec.knobs, prec, device)
            optimizer = make_optimizer(wrapped.parameters(), 1e-4, spec.precision)
            scaler = make_scaler(spec.precision, spec.strategy, device)
            batches = SyntheticBatches(flavor, batch, 0, 2, 0, device, dtype=prec.storage_dtype)
            tracker = _tracker(wrapped, optimizer, spec)
            if not spec.strategy.is_fsdp2:
                tracker.track_external(wrapped, optimizer, batches.pool)
            else:
                tracker.track_inputs(tuple(batches.pool))
            autocast = prec.autocast_dtype
            for b in batches:
                _no_hooks_on_frozen(tracker, wrapped)
                with tracker:  # entering again resets the peak: the second step's is the steady state
                    with cuda_like_autocast(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                        loss = wrapped(b)
                    backward_and_step(loss, optimizer, scaler)
                    del loss
                tracker.reset_mod_stats()
            peak = tracker.get_tracker_snapshot("peak")
    snap = next(iter(peak.values()))
    tracked = {str(getattr(k, "value", k)): int(v) for k, v in snap.items() if str(k) != "Total"}
    pred = predict(spec, world, world, "cpu", variant=Variant(flava_impl=flava_impl))
    return Check(spec.path, world, int(snap["Total"]), int(pred.peak_bytes), tracked,
                 {k: int(v) for k, v in pred.breakdown.items() if k != "overhead"}, time.perf_counter() - t0)


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
