"""The timed training loop: a step is forward + backward + optimizer step + zero_grad on one
local batch; the first ``warmup`` steps run but count in no figure, and the measured window's
length is the MAX over ranks.

Every number it returns (step time, throughput, loss, memory, compile_s, MFU/HFU) is defined
in docs/metrics.md, one row each; the tests check them. The harness makes no host sync
inside the window (docs/metrics.md, "Host syncs").
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from scaleladder.errors import SpecError
from scaleladder.log import get_logger
from scaleladder.rung.optim import LocalShardAdamW, MasterWeightAdamW, backward_and_step
from scaleladder.rung.precision import PrecisionPolicy

_log = get_logger(__name__)

# What rung.optim.make_optimizer returns: torch's fused AdamW, or a stand-in that steps one of its own.
RungOptimizer = torch.optim.Optimizer | MasterWeightAdamW | LocalShardAdamW


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
    peak_device_used_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # [world], see device_peak_used
    device_total_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    compile_s: float = float("nan")  # compiled rungs: the warm-up's excess over steady state, max over ranks
    compile_graphs: int = 0  # graphs Dynamo captured during this loop (compiled rungs)
    # [steps], this rank's host time to issue each step (docs/metrics.md, "Host-boundness")
    host_issue_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    host_boundness: float = float("nan")  # NaN on the CPU: no asynchronous device to wait for the host
    device_lag_s: float = float("nan")  # NaN on the CPU


class CompileError(SpecError):
    """A -compile rung that cannot compile as asked (a graph break under fullgraph, a
    backend failure, a recompile inside the measured window): one line, exit 2 — never
    an eager run recorded as compiled."""


class OOMDuringStep(RuntimeError):
    """Carries the step at which a rank ran out of memory."""

    def __init__(self, step: int, message: str):
        super().__init__(message)
        self.step = step


# TRAP: running out of GPU memory does not always raise torch.OutOfMemoryError. Only the
# caching allocator raises that. Allocations outside it fail as a plain RuntimeError:
# cuBLAS/hipBLAS creating its handle or workspace ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED
# when calling `cublasCreate(handle)`", typical of the first matmul of a rung that
# filled the GPU) and raw cudaMalloc/hipMalloc calls by cuDNN or the CUDA runtime ("CUDA
# error: out of memory"). NCCL's own allocations fail inside the communicator, and torch
# raises a DistBackendError (a RuntimeError) whose FIRST line says nothing of memory:
#   NCCL error in: .../ProcessGroupNCCL.cpp:3356, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3
#   ncclUnhandledCudaError: Call to CUDA function failed.
#   Last error:
#   Cuda failure 2 'out of memory'
# ("Cuda", not "CUDA"; older NCCL prints "Cuda failure 'out of memory'"; RCCL, NCCL
# hipified, keeps the ncclUnhandledCudaError name and prints "HIP failure 'out of memory'"
# or the HIP error name). So the pattern ignores case, looks at every line, and the
# record keeps the line that matched (:func:`oom_line`), not the message's first line,
# which maxbatch would otherwise fail to recognise in the record. A rung that did not
# fit must become an `oom` result, whichever of these it hit, not a failed job.
_OOM_MESSAGE = re.compile(
    r"\b(cuda|hip)\b[^\n]*\bout of memory"  # allocator, CUDA/HIP runtime, NCCL/RCCL "Cuda/HIP failure [2] 'out of memory'"
    r"|\b(cu|hip)blas_status_alloc_failed"
    r"|\b(cuda|hip)ErrorOutOfMemory\b|\bcudaErrorMemoryAllocation\b|\bCUDA_ERROR_OUT_OF_MEMORY\b",
    re.IGNORECASE,
)


def is_oom(e: BaseException) -> bool:
    """Is this exception the device running out of memory?"""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and _OOM_MESSAGE.search(str(e)) is not None)


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def oom_line(e: BaseException) -> str:
    """The line of an OOM's message that says so (see the TRAP above), else its first line."""
    for line in str(e).splitlines():
        if _OOM_MESSAGE.search(line):
            return line.strip()
    return first_line(e)


def _injected_oom() -> tuple[int, str]:
    """Fault injection for the OOM path, which no CPU can reach for real:
    ``SCALELADDER_INJECT_OOM=RANK:STEP[:KIND]`` makes that rank raise, at that step, a
    genuine ``torch.OutOfMemoryError``, or with KIND the error another part raises when
    it cannot allocate: ``cublas`` (cuBLAS's RuntimeError), ``nccl`` / ``rccl`` (torch's
    DistBackendError carrying NCCL's or RCCL's report, as :data:`INJECTED_MESSAGES`).
    Used by the tests; never set in profiles."""
    spec = os.environ.get("SCALELADDER_INJECT_OOM", "")
    if not spec:
        return -1, ""
    rank, step, *kind = spec.split(":")
    return (int(step) if int(rank) == dist.get_rank() else -1), (kind[0] if kind else "")


# What each part reports when the device is full, in the form it reaches Python. The NCCL
# text is torch's DistBackendError around ncclGetLastError(): the memory line comes last.
INJECTED_MESSAGES = {
    "cublas": "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "nccl": ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error "
             "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
             "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 2 'out of memory'"),
    "rccl": ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error "
             "(run with NCCL_DEBUG=INFO for details), NCCL version 2.22.3+hip6.4\n"
             "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nHIP failure 'out of memory'"),
}


def _raise_injected(step: int, kind: str) -> None:
    note = f" (injected by SCALELADDER_INJECT_OOM at step {step})"
    if kind == "cublas":
        raise RuntimeError(INJECTED_MESSAGES[kind] + note)
    if kind in ("nccl", "rccl"):
        raise dist.DistBackendError(INJECTED_MESSAGES[kind] + note)
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


def device_peak_used(used_now: int, reserved_now: int, reserved_peak: int) -> int:
    """Bytes the DEVICE had in use at the window's peak, from what can be read at its end.

    ``torch.cuda.memory_stats`` sees only the caching allocator. What actually runs out
    is the device: the allocator's reservations plus what lies outside it (the CUDA/HIP
    context, NCCL/RCCL buffers, cuBLAS workspaces, other processes on the device).
    ``mem_get_info`` reads the device's use only as it is now, not its peak, so: the use
    outside the allocator now (``used_now - reserved_now``, which is flat after warm-up:
    communicators and workspaces are made in the first steps) plus the allocator's peak
    reservation in the window.
    """
    return max(0, used_now - reserved_now) + reserved_peak


def _device_memory(device: torch.device) -> tuple[int, int, int]:
    """(device bytes in use now, allocator bytes reserved now, device total bytes)."""
    if device.type != "cuda":
        return 0, 0, 0
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free), int(torch.cuda.memory_reserved(device)), int(total)


def _gather_ints(values: list[int], device: torch.device) -> np.ndarray:
    """All ranks' values of each counter: returns [world, len(values)]."""
    t = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).cpu().numpy()


def _graphs_captured() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _compile_failure(e: BaseException) -> bool:
    """Did torch.compile fail (not the model, not memory)? Dynamo's own exceptions, and
    the recompile limit (made an error by rung.parallelize._compile_blocks)."""
    import torch._dynamo.exc as dynamo_exc

    return isinstance(e, (dynamo_exc.TorchDynamoException, dynamo_exc.FailOnRecompileLimitHit))


#: Seconds between two progress lines (``run --progress-s``, a profile's profiling.progress_s; 0: none).
PROGRESS_EVERY_S = 30.0


class Progress:
    """Rank 0's sign of life in the log: a line when the loop starts, one after the first step
    (which holds the allocator's and cuDNN's warm-up, or a compile), then one every
    ``every`` seconds, never more: a 2-hour rung must not look hung, and a Slurm log must not
    fill up. Plain lines, no ``\\r`` redraws (a log file keeps every one of them).

    Steps/s and ETA come from the host clock between two lines: the host runs at most a
    step or two ahead of the device (each step's loss lands in a device tensor, and the
    optimizer waits on the queue), so over 30 s that is close, and costs no sync."""

    def __init__(self, label: str, steps: int, warmup: int, device: torch.device, every: float = PROGRESS_EVERY_S) -> None:
        self.every = every
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.on = rank == 0 and self.every > 0
        self.label, self.steps, self.warmup, self.device = label, steps, warmup, device
        self.t0 = self.t_last = time.perf_counter()
        self.step_last = 0

    def say(self, text: str) -> None:
        _log.info(f"scaleladder run: {self.label}: {text}")

    def start(self) -> None:
        if self.on:
            self.say(f"training {self.steps} steps ({self.warmup} warm-up) ...")

    def memory(self) -> str:
        if self.device.type == "cuda":
            return f"peak reserved {torch.cuda.max_memory_reserved(self.device) / 2**30:.2f} GiB"
        import resource

        return f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"  # KiB on Linux

    def done(self, step: int) -> None:
        """Step ``step`` (0-based) has been issued."""
        if not self.on:
            return
        now = time.perf_counter()
        if step > 0 and now - self.t_last < self.every:
            return
        n = step + 1
        if step == 0:
            self.say(f"step 1/{self.steps} after {now - self.t0:.1f} s (start-up of the loop: warm-up, compile); "
                     f"{self.memory()}")
        else:
            rate = (n - self.step_last) / (now - self.t_last)
            eta = (self.steps - n) / rate if rate > 0 else float("nan")
            self.say(f"step {n}/{self.steps}, {rate:.2f} steps/s, ETA {_duration(eta)}, {self.memory()}")
        self.t_last, self.step_last = now, n


def _duration(seconds: float) -> str:
    if not seconds == seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def train_loop(
    model: nn.Module,
    optimizer: RungOptimizer,
    batches: Iterable[dict[str, Tensor]],
    *,
    steps: int,
    warmup: int,
    prec: PrecisionPolicy,
    device: torch.device,
    scaler: torch.amp.GradScaler | None = None,
    compiled: bool = False,
    label: str = "",
    progress_s: float = PROGRESS_EVERY_S,
) -> Measurement:
    """Run ``steps`` steps of ``model`` on ``batches``, the first ``warmup`` untimed: the
    module docstring says what each number of the returned :class:`Measurement` means.

    Keyword-only after ``batches``: ``steps`` and ``warmup`` are both ints and were once
    easy to swap at a call; the callers already hold each value, so keywords name them
    without a config object to build at every call. ``label`` (the rung's path) turns on
    rank 0's progress lines, one every ``progress_s``; ``compiled`` makes a recompile in the window an error.
    """
    if not 0 <= warmup < steps:
        raise ValueError(f"warm-up ({warmup}) must be smaller than steps ({steps})")
    if compiled and warmup < 1:
        raise CompileError("a -compile rung needs warmup >= 1: its first step compiles, and compile time must stay out of the measured window")
    progress = Progress(label, steps, warmup, device, every=progress_s if label else 0.0)  # no label: silent (converge's chunks)
    if not compiled:
        return _train_loop(model, optimizer, batches, steps=steps, warmup=warmup, prec=prec, device=device,
                           scaler=scaler, compiled=False, progress=progress)
    from torch._dynamo import config as dynamo_config  # not `import torch._dynamo`: it would make `torch` local

    recompile_was = dynamo_config.error_on_recompile
    try:
        return _train_loop(model, optimizer, batches, steps=steps, warmup=warmup, prec=prec, device=device,
                           scaler=scaler, compiled=True, progress=progress)
    finally:
        dynamo_config.error_on_recompile = recompile_was  # the window's rule only


class _StepClock:
    """Where each step starts (and the last one ends): CUDA events recorded on the compute
    stream on a GPU, read once after the loop; the host clock always (the window's ends),
    and where the host finished issuing each step (:meth:`issued`: host-boundness).
    ``event`` makes the device's events (a test passes a fake one)."""

    def __init__(self, device: torch.device, steps: int, event: Any = None) -> None:
        cuda = device.type == "cuda" or event is not None
        make = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.events = [make() for _ in range(steps + 1)] if cuda else []
        self.host_times = np.zeros(steps + 1)
        self.issued_times = np.zeros(steps)

    def mark(self, step: int) -> None:
        if self.events:
            self.events[step].record()
        self.host_times[step] = time.perf_counter()

    def issued(self, step: int) -> None:
        """The host has issued every kernel of ``step`` (its last call returned; no sync)."""
        self.issued_times[step] = time.perf_counter()

    def host_issue_s(self) -> np.ndarray:
        return self.issued_times - self.host_times[:-1]

    def host_figures(self, warmup: int) -> tuple[float, float]:
        """(host_boundness, device_lag_s) of the measured steps; NaN without device events.

        host_boundness: the median host time to issue a step over the median event-timed
        step. device_lag_s: the median, over the measured steps after the first, of how far
        the device was behind the host where the host began the step: the device's clock is
        the events', set against the host's at the window's first step, which starts on an
        idle device (_open_window synchronises). Near 0: the device had finished the step
        before and waited for the host. TRAP: a host far ahead of a slow device blocks in
        the launch (a full launch queue) or in a sync, and its issue time then grows to the
        device's step: host_boundness near 1 with a large lag is a device-bound rung.
        """
        if not self.events or len(self.host_times) - 1 <= warmup:
            return float("nan"), float("nan")
        issue = self.host_issue_s()[warmup:]
        device_step = self.step_times()[warmup:]
        boundness = float(np.median(issue) / np.median(device_step))
        device_at = self.host_times[warmup] + np.concatenate([[0.0], np.cumsum(device_step)])[1:-1]
        lag = device_at - self.host_times[warmup + 1:-1]
        return boundness, float(np.median(lag)) if lag.size else float("nan")

    def stop(self, device: torch.device) -> None:
        """After the last step: its end, with the device drained."""
        if self.events:
            self.events[-1].record()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.host_times[-1] = time.perf_counter()

    def step_times(self) -> np.ndarray:
        if self.events:
            return np.array([a.elapsed_time(b) / 1e3 for a, b in zip(self.events[:-1], self.events[1:])])
        return np.diff(self.host_times)


@dataclass
class _WindowStart:
    """What the loop reads where the measured window starts, after the warm-up."""

    time: float = 0.0
    warmup_peak_active: int = 0
    alloc_retries: int = 0
    ooms: int = 0
    graphs: int = 0  # graphs Dynamo captured in the warm-up (compiled rungs)


def _open_window(device: torch.device, warmup: int, compiled: bool, graphs_before: int) -> _WindowStart:
    """The measured window starts here: every rank, device idle, peaks reset."""
    start = _WindowStart()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start.warmup_peak_active = _mem_peaks(device)[0]
        torch.cuda.reset_peak_memory_stats(device)
    # reset_peak_memory_stats leaves these two counting from process start:
    # the window's counts are differences from here.
    start.alloc_retries, start.ooms = _mem_counters(device)
    if compiled:
        start.graphs = _graphs_captured() - graphs_before
        if start.graphs == 0:  # fullgraph and no suppression leave only this: nothing was compiled
            raise CompileError(f"the -compile rung's {warmup} warm-up step(s) compiled no graph: torch.compile did not run")
        from torch._dynamo import config as dynamo_config

        # From here a recompile would put compile time into the throughput: an error.
        dynamo_config.error_on_recompile = True
    dist.barrier()
    start.time = time.perf_counter()
    return start


#: A rung is host-bound at this host_boundness or above, with the device's lag under a tenth of a step.
HOST_BOUND_AT = 0.9


def host_attrs(m: Measurement, warmup: int) -> dict[str, Any]:
    """The record's host-boundness attributes (docs/metrics.md, "Host-boundness"): none on
    the CPU, where no asynchronous device waits for the host (absent, not NaN)."""
    from scaleladder.results.record import Host

    if not m.host_boundness == m.host_boundness:  # NaN: no device events
        return {}
    step = float(np.median(m.step_time_s[warmup:]))
    return {
        Host.host_issue_median_s: float(np.median(m.host_issue_s[warmup:])),
        Host.host_boundness: m.host_boundness,
        Host.device_lag_median_s: m.device_lag_s,
        Host.host_bound: bool(m.host_boundness >= HOST_BOUND_AT and m.device_lag_s < 0.1 * step),
    }


def _step_error(e: Exception, step: int, warmup: int, compiled: bool) -> Exception | None:
    """The error a failed step becomes (OOM, compile failure), or None: raise it as it is."""
    if is_oom(e):
        return OOMDuringStep(step, oom_line(e))
    if compiled and _compile_failure(e):
        where = "recompiled inside the measured window" if step >= warmup else "failed to compile"
        return CompileError(f"-compile rung {where} at step {step}: {type(e).__name__}: {first_line(e)}")
    return None


def _train_loop(
    model: nn.Module,
    optimizer: RungOptimizer,
    batches: Iterable[dict[str, Tensor]],
    *,
    steps: int,
    warmup: int,
    prec: PrecisionPolicy,
    device: torch.device,
    scaler: torch.amp.GradScaler | None,
    compiled: bool,
    progress: Progress,
) -> Measurement:
    graphs_before = _graphs_captured() if compiled else 0
    losses = torch.zeros(steps, device=device)
    clock = _StepClock(device, steps)
    window = _WindowStart()
    model.train()
    it = iter(batches)
    inject, inject_kind = _injected_oom()
    progress.start()
    for step in range(steps):
        if step == warmup:
            window = _open_window(device, warmup, compiled, graphs_before)
        try:
            # Already on the device: synthetic batches, or a DeviceFeed (rung/feed.py), whose
            # staging of the next batch allocates device memory and so may run out too.
            batch = next(it)
            clock.mark(step)
            if step == inject:
                _raise_injected(step, inject_kind)
            with prec.autocast(device):
                loss = model(batch)
            backward_and_step(loss, optimizer, scaler)
        except Exception as e:
            translated = _step_error(e, step, warmup, compiled)
            if translated is None:
                raise
            raise translated from None
        losses[step] = loss.detach().float()
        clock.issued(step)  # a host clock read: no sync
        progress.done(step)
    clock.stop(device)
    return _measure(clock, losses, window, steps=steps, warmup=warmup, compiled=compiled, device=device)


def _measure(clock: _StepClock, losses: Tensor, window: _WindowStart, *, steps: int, warmup: int, compiled: bool,
             device: torch.device) -> Measurement:
    """The loop's numbers, reduced over ranks (the module docstring defines each)."""
    window_s = clock.host_times[steps] - window.time
    step_times = clock.step_times()
    dist.all_reduce(losses)  # sum over ranks, then / world: the mean the wrappers optimise
    losses /= dist.get_world_size()
    # The warm-up's excess over steady state (the module docstring's compile_s), NaN unless compiled.
    excess = float(step_times[:warmup].sum() - warmup * np.median(step_times[warmup:])) if compiled else float("nan")
    window_t = torch.tensor([window_s, excess], dtype=torch.float64, device=device)
    dist.all_reduce(window_t, op=dist.ReduceOp.MAX)  # NaN stays NaN on every rank alike

    window_max, excess_max = window_t.tolist()
    m = Measurement(step_times, losses.cpu().numpy(), window_max, steps - warmup, compile_s=excess_max,
                    compile_graphs=window.graphs, host_issue_s=clock.host_issue_s())
    m.host_boundness, m.device_lag_s = clock.host_figures(warmup)
    retries, ooms = _mem_counters(device)
    active_peak, reserved_peak = _mem_peaks(device)
    used_now, reserved_now, total = _device_memory(device)
    per_rank = [active_peak, reserved_peak, retries - window.alloc_retries, ooms - window.ooms, window.warmup_peak_active,
                device_peak_used(used_now, reserved_now, reserved_peak) if total else 0, total]
    g = _gather_ints(per_rank, device)
    (m.peak_active_bytes, m.peak_reserved_bytes, m.alloc_retries, m.ooms, m.warmup_peak_active_bytes,
     m.peak_device_used_bytes, m.device_total_bytes) = (g[:, i] for i in range(7))
    return m
