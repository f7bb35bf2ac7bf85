"""The timed training loop, and what every number it returns means.

Definitions (also in docs/metrics.md; the tests check them):

* **Step** = forward + backward + optimizer step + zero_grad on one local batch.
* **Warm-up**: the first ``warmup`` steps are run but excluded from every figure
  (allocator growth, NCCL/RCCL communicator setup, cuDNN/MIOpen autotuning).
* **Step time** (``step_time_s``): on a GPU, the time between CUDA events recorded
  on the compute stream at consecutive step boundaries, read once after the loop —
  so no step is stalled by a host sync. FSDP's communication streams are joined
  into the compute stream before the optimizer step, so the events bound the
  whole step. On the CPU, ``time.perf_counter`` around each step.
* **Measured window**: all ranks pass a barrier and synchronise the device after
  warm-up; the window ends when the last step is synchronised. Its length is the
  MAX over ranks (the slowest rank sets the global pace).
* **Throughput**: ``samples_per_s = global_batch × measured_steps / window``.
  ``items_per_s`` counts items as the seeds do: images for ViT, images + texts for
  FLAVA (2 items per sample, the FLAVA blog's "items (text or image)").
* **Loss**: the mean over ranks of each rank's local loss, per step (this is the
  quantity DDP/FSDP minimise). Kept on the device during the loop.
* **Memory** (per rank, GPU only): ``active_bytes.all.peak`` and
  ``reserved_bytes.all.peak`` over the measured window (peaks are reset after
  warm-up), and ``num_alloc_retries`` / ``num_ooms`` counted within the window as
  differences — ``reset_peak_memory_stats`` does NOT reset those two counters.
* **MFU** = analytic model FLOPs per sample × samples/s ÷ world ÷ peak FLOP/s of
  one rank's device for the precision; **HFU** uses the FLOPs including AC
  recomputation. NaN where the peak is unknown (the CPU).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from scaleladder.precision import PrecisionPolicy


@dataclass
class Measurement:
    step_time_s: np.ndarray  # [steps], every step (warm-up included; the record says how many to drop)
    loss: np.ndarray  # [steps]
    window_s: float  # measured window, max over ranks
    measured_steps: int
    peak_active_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [world]
    peak_reserved_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    alloc_retries: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ooms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    warmup_peak_active_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class OOMDuringStep(RuntimeError):
    """Carries the step at which a rank ran out of memory."""

    def __init__(self, step: int, message: str):
        super().__init__(message)
        self.step = step


# TRAP: running out of GPU memory does not always raise torch.OutOfMemoryError. Only the
# caching allocator raises that. Allocations outside it fail as a plain RuntimeError:
# cuBLAS/hipBLAS creating its handle or workspace ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED
# when calling `cublasCreate(handle)`", typical of the first matmul of a rung that
# filled the GPU) and raw cudaMalloc/hipMalloc calls by NCCL or cuDNN ("CUDA error: out of
# memory"). A rung that did not fit must become an `oom` result, whichever of these it
# hit, not a failed job with no record.
_OOM_MESSAGE = re.compile(r"\b(CUDA|HIP)\b[^\n]*out of memory|(CU|HIP)BLAS_STATUS_ALLOC_FAILED")


def is_oom(e: BaseException) -> bool:
    """Is this exception the device running out of memory?"""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and _OOM_MESSAGE.search(str(e)) is not None)


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _injected_oom() -> tuple[int, str]:
    """Fault injection for the OOM path, which no CPU can reach for real:
    ``SCALELADDER_INJECT_OOM=RANK:STEP[:cublas]`` makes that rank raise, at that step, a
    genuine ``torch.OutOfMemoryError`` or (``:cublas``) the RuntimeError cuBLAS gives
    when it cannot allocate. Used by the tests; never set in profiles."""
    spec = os.environ.get("SCALELADDER_INJECT_OOM", "")
    if not spec:
        return -1, ""
    rank, step, *kind = spec.split(":")
    return (int(step) if int(rank) == dist.get_rank() else -1), (kind[0] if kind else "")


def _raise_injected(step: int, kind: str) -> None:
    if kind == "cublas":
        raise RuntimeError(f"CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)` (injected by SCALELADDER_INJECT_OOM at step {step})")
    raise torch.OutOfMemoryError(f"injected by SCALELADDER_INJECT_OOM at step {step}")


def _mem_counters(device: torch.device) -> tuple[int, int]:
    """(num_alloc_retries, num_ooms) since the process started: cumulative counters."""
    if device.type != "cuda":
        return 0, 0
    s = torch.cuda.memory_stats(device)
    return int(s.get("num_alloc_retries", 0)), int(s.get("num_ooms", 0))


def _mem_peaks(device: torch.device) -> tuple[int, int]:
    """(active, reserved) peak bytes since the last reset of the peak statistics."""
    if device.type != "cuda":
        return 0, 0
    s = torch.cuda.memory_stats(device)
    return int(s.get("active_bytes.all.peak", 0)), int(s.get("reserved_bytes.all.peak", 0))


def _gather_ints(values: list[int], device: torch.device) -> np.ndarray:
    """All ranks' values of each counter: returns [world, len(values)]."""
    t = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).cpu().numpy()


def train_loop(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[dict[str, Tensor]],
    steps: int,
    warmup: int,
    prec: PrecisionPolicy,
    device: torch.device,
    scaler: "torch.amp.GradScaler | None" = None,
) -> Measurement:
    if not 0 <= warmup < steps:
        raise ValueError(f"warm-up ({warmup}) must be smaller than steps ({steps})")
    cuda = device.type == "cuda"
    losses = torch.zeros(steps, device=device)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)] if cuda else []
    host_times = np.zeros(steps + 1)
    warm_peak = 0
    retries0 = ooms0 = 0
    t_window = 0.0
    model.train()
    it = iter(batches)
    inject, inject_kind = _injected_oom()
    for step in range(steps):
        if step == warmup:
            # The measured window starts here: every rank, device idle, peaks reset.
            if cuda:
                torch.cuda.synchronize(device)
                warm_peak = _mem_peaks(device)[0]
                torch.cuda.reset_peak_memory_stats(device)
            # reset_peak_memory_stats leaves these two counting from process start:
            # the window's counts are differences from here.
            retries0, ooms0 = _mem_counters(device)
            dist.barrier()
            t_window = time.perf_counter()
        batch = next(it)
        if not cuda or batch[next(iter(batch))].device != device:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if cuda:
            events[step].record()
        host_times[step] = time.perf_counter()
        try:
            if step == inject:
                _raise_injected(step, inject_kind)
            with prec.autocast(device):
                loss = model(batch)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        except Exception as e:
            if not is_oom(e):
                raise
            raise OOMDuringStep(step, first_line(e)) from None
        losses[step] = loss.detach().float()
    if cuda:
        events[steps].record()
        torch.cuda.synchronize(device)
    host_times[steps] = time.perf_counter()
    window = host_times[steps] - t_window

    if cuda:
        step_times = np.array([events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(steps)])
    else:
        step_times = np.diff(host_times)
    dist.all_reduce(losses)  # sum over ranks, then / world: the mean the wrappers optimise
    losses /= dist.get_world_size()
    window_t = torch.tensor([window], dtype=torch.float64, device=device)
    dist.all_reduce(window_t, op=dist.ReduceOp.MAX)

    m = Measurement(step_times, losses.cpu().numpy(), float(window_t.item()), steps - warmup)
    retries, ooms = _mem_counters(device)
    per_rank = [*_mem_peaks(device), retries - retries0, ooms - ooms0, warm_peak]
    g = _gather_ints(per_rank, device)
    m.peak_active_bytes, m.peak_reserved_bytes, m.alloc_retries, m.ooms, m.warmup_peak_active_bytes = (g[:, i] for i in range(5))
    return m
