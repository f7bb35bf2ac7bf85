"""A rung's predicted memory on a device: :func:`predict` and the max-batch search.

The step itself is replayed in :mod:`~scaleladder.planner.timeline` (phases) from a
:mod:`~scaleladder.planner.step_setup` (what does not depend on the batch). Whether a peak
FITS adds what the allocator does not count: :data:`CONTEXT_BYTES`, :data:`COMM_LIB_BYTES`,
:data:`FRAGMENTATION`. docs/planner-internals.md, "Memory: how it works", gives the reasoning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# DEVICES and GIB are re-exported ("as": explicitly, for mypy strict): the planner's device keys
# and usable bytes, read from the one device table's memory variants (planner/devices.py: per
# chip, its peaks and its memories).
from scaleladder.planner.devices import DEVICES as DEVICES
from scaleladder.planner.devices import GIB as GIB

# InputBatches and Variant are re-exported: callers name the planner's inputs from here.
from scaleladder.planner.step_setup import RUNNER, StepSetup, step_setup
from scaleladder.planner.step_setup import InputBatches as InputBatches
from scaleladder.planner.step_setup import Variant as Variant
from scaleladder.planner.step_setup import input_batches as input_batches
from scaleladder.planner.timeline import simulate
from scaleladder.spec import RunSpec, SpecError


@dataclass(frozen=True)
class Device:
    """A device to plan for: a name and the memory PyTorch reports for it (None: unlimited)."""

    name: str
    capacity_bytes: int | None


# Calibration constants (no GPU in this repository's CI: these are ESTIMATES, to be refit
# from measured rungs — see docs/planner-internals.md, "Calibration constants").
CONTEXT_BYTES = int(0.5 * GIB)  # CUDA/HIP context + kernels: outside the caching allocator
COMM_LIB_BYTES = int(0.5 * GIB)  # NCCL/RCCL channel buffers when world > 1: also outside it
FRAGMENTATION = 0.05  # reserved/active − 1 in steady state: the allocator's rounding and splitting


@dataclass(frozen=True)
class Overheads:
    """What must fit beyond the allocator's peak: a fraction of it, and fixed bytes.

    The calibrated values are the constants above; the seed comparison scales them
    (``scaled``) to show which verdicts hang on them (docs/planner.md, "Sensitivity").
    """

    fragmentation: float = FRAGMENTATION
    context_bytes: float = CONTEXT_BYTES
    comm_lib_bytes: float = COMM_LIB_BYTES

    def scaled(self, k: float) -> Overheads:
        return Overheads(self.fragmentation * k, self.context_bytes * k, self.comm_lib_bytes * k)

    def fixed(self, world: int) -> float:
        return self.context_bytes + (self.comm_lib_bytes if world > 1 else 0)


CALIBRATED = Overheads()


MAX_BATCH_LIMIT = 1 << 16


@dataclass
class Prediction:
    """The planner's verdict for one rung on one device."""

    spec: str
    device: str
    world: int
    ranks_per_node: int
    batch: int | None  # local batch the peak is for (None when the spec says 'max' and nothing fits)
    data: str  # 'synthetic' or a loader: how many input batches sit on the device
    peak_bytes: int  # predicted torch.cuda active_bytes.all.peak on the busiest rank
    required_bytes: int  # peak + fragmentation + context + comm library: what must fit
    capacity_bytes: int | None  # the device's memory (None: unlimited)
    fits: bool
    max_batch: int | None  # the largest local batch that fits (None: unlimited device or nothing fits)
    phase: str  # where the peak happens: "forward", "backward:<call>", "optimizer", "codebook"
    breakdown: dict[str, int] = field(default_factory=dict)  # at the peak; sums to peak_bytes (+ overhead)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# -- public API -------------------------------------------------------------------------------


def resolve_device(device: str | Device) -> Device:
    """A device key (``DEVICES``) or a :class:`Device` as it is."""
    if isinstance(device, Device):
        return device
    if device not in DEVICES:
        raise SpecError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)} (or a custom size in GiB)")
    return Device(device, DEVICES[device])


def custom_device(name: str, gib: str | float) -> Device:
    """A device with ``gib`` GiB of usable memory (what torch reports as its total capacity)."""
    try:
        g = float(gib)
    except (TypeError, ValueError):
        raise SpecError(f"device memory must be a number of GiB, got {gib!r}") from None
    if not (g > 0 and g < float("inf")):
        raise SpecError(f"device memory must be a positive, finite number of GiB, got {gib!r}")
    if not name.strip():
        raise SpecError("a custom device needs a name")
    return Device(name, int(g * GIB))


def required_bytes(peak: float, world: int, overheads: Overheads = CALIBRATED) -> int:
    """What must fit on the device for a predicted allocator peak."""
    return int(peak * (1 + overheads.fragmentation) + overheads.fixed(world))


def _fits(setup: StepSetup, batch: int, capacity: int | None, overheads: Overheads = CALIBRATED) -> bool:
    if capacity is None:
        return True
    return required_bytes(simulate(setup, batch).peak, setup.world, overheads) <= capacity


def max_batch_for(setup: StepSetup, capacity: int | None, overheads: Overheads = CALIBRATED) -> int | None:
    """The largest local batch that fits (None: unlimited, or not even batch 1)."""
    if capacity is None:
        return None
    return largest_batch(lambda b: _fits(setup, b, capacity, overheads))


def largest_batch(fits: Callable[[int], bool]) -> int | None:
    """The largest local batch up to :data:`MAX_BATCH_LIMIT` for which ``fits`` holds (None: not even
    batch 1). ``fits`` must turn false once and stay so (a peak non-decreasing in the batch): the
    search doubles, then bisects. The traced memory model (campaign/plan_trace.py) searches with it too."""
    if not fits(1):
        return None
    lo, hi = 1, 2
    while hi <= MAX_BATCH_LIMIT and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_BATCH_LIMIT + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def predict(spec: RunSpec, world: int, ranks_per_node: int, device: str | Device, batch: int | None = None,
            data: str = "synthetic", variant: Variant = RUNNER, overheads: Overheads = CALIBRATED) -> Prediction:
    """Predict one rung's per-rank memory on ``device`` with ``world`` ranks.

    ``batch`` overrides the spec's local batch (needed when the spec says ``max``:
    then the prediction is made at the predicted max batch). ``data`` is the runner's
    ``--data``: ``synthetic`` or a shard manifest (see :func:`input_batches`).
    ``variant`` and ``overheads`` are for explaining the seeds; the defaults are the runner.
    Imports no torch: the workflow calls it while building its DAG.
    """
    dev = resolve_device(device)
    if world < 1 or ranks_per_node < 1:
        raise SpecError(f"world ({world}) and ranks per node ({ranks_per_node}) must be >= 1")
    setup = step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, world, variant, input_batches(data))
    mb = max_batch_for(setup, dev.capacity_bytes, overheads)
    b = batch if batch is not None else (None if spec.batch == "max" else int(spec.batch))
    if b is None:
        b = mb if mb is not None else 1
    tl = simulate(setup, b)
    req = required_bytes(tl.peak, world, overheads)
    breakdown = {k: int(round(v)) for k, v in tl.peak_parts.items()}
    breakdown["overhead"] = req - int(tl.peak)
    return Prediction(
        spec=spec.path, device=dev.name, world=world, ranks_per_node=ranks_per_node, batch=b, data=data,
        peak_bytes=int(tl.peak), required_bytes=req, capacity_bytes=dev.capacity_bytes,
        fits=dev.capacity_bytes is None or req <= dev.capacity_bytes, max_batch=mb, phase=tl.phase, breakdown=breakdown,
    )
