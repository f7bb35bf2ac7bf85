"""When a number surprises, one run explains it: a ``torch.profiler`` trace of a few
steps after warm-up, and a CUDA caching-allocator memory snapshot, torchtitan-style.

Both are off by default. ``scaleladder run --trace-steps N`` traces the N steps right after
the warm-up (the first N of the measured window) into a Chrome trace; ``--memory-snapshot``
records the allocator's history (``torch.cuda.memory._record_memory_history``) from the
first step to the last and dumps it (``_dump_snapshot``; open it at pytorch.org/memory_viz).
A profile's ``profiling:`` block sets both for every rung of its ladder: the rung rules pass
them on as these arguments (workflow/schemas/config.schema.yaml, rows with ``run_arg``).

Files are written next to the record, by rank 0 only (the record's writer), each to a
temporary name and then renamed: ``<record>.trace.json`` and ``<record>.memory.pickle``; the
record names them (``trace_file``, ``trace_steps``, ``memory_snapshot_file``; relative to
the record's folder).

TRAP: the traced steps lie INSIDE the measured window and carry the profiler's overhead, and
recording the allocator's history slows every allocation: a rung run with either is for
explaining, not for the headline (its record says which steps were traced).

On the CPU the trace works (CPU activities only); the snapshot is refused in one line: the
CPU has no caching allocator to record.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from scaleladder.files import atomic_file
from scaleladder.spec import SpecError

#: Allocator events kept by the memory history (torchtitan's default is 100,000).
MEMORY_HISTORY_ENTRIES = 100_000


def check_profiling(trace_steps: int, memory_snapshot: bool, steps: int, warmup: int, device_type: str | None) -> None:
    """One line naming the culprit, before anything runs (``device_type`` None: not known yet)."""
    if trace_steps < 0:
        raise SpecError(f"--trace-steps must be >= 0, got {trace_steps}")
    if trace_steps > steps - warmup:
        raise SpecError(f"--trace-steps {trace_steps}: the run measures only {steps - warmup} steps after its "
                        f"{warmup} warm-up step(s); trace at most that many")
    if memory_snapshot and device_type is not None and device_type != "cuda":
        raise SpecError("--memory-snapshot records the CUDA caching allocator's history; this rung runs on the "
                        f"{device_type.upper()}, which has none (a --trace-steps trace works there)")


def trace_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".h5") + ".trace.json")


def snapshot_path(out: Path) -> Path:
    return out.with_name(out.name.removesuffix(".h5") + ".memory.pickle")


class StepProfiler:
    """Around the timed loop: ``with StepProfiler(...) as p: train_loop(m, opt, p.wrap(batches), steps=..., ...)``."""

    def __init__(self, trace_steps: int, memory_snapshot: bool, warmup: int, out: Path, device: Any, rank: int) -> None:
        self.trace_steps, self.memory_snapshot, self.warmup = trace_steps, memory_snapshot, warmup
        self.out, self.device, self.writer = Path(out), device, rank == 0
        self._prof: Any = None
        self.written: dict[str, Any] = {}

    def __enter__(self) -> StepProfiler:
        import torch

        if self.memory_snapshot and self.writer:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        if self.trace_steps and self.writer:
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            # prof.step() is called as each step takes its batch, so step k begins after k calls.
            # The profiler warms up on the last warm-up step (none without warm-up), then records
            # the first trace_steps steps of the measured window.
            warm = 1 if self.warmup >= 1 else 0
            self._prof = profile(activities=activities, record_shapes=True, profile_memory=True,
                                 schedule=schedule(wait=self.warmup - warm, warmup=warm, active=self.trace_steps, repeat=1),
                                 on_trace_ready=self._export)
            self._prof.__enter__()
        return self

    def wrap(self, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches``, stepping the profiler's schedule at each step boundary."""
        for i, b in enumerate(batches):
            if self._prof is not None and i > 0:
                self._prof.step()
            yield b

    def _export(self, prof: Any) -> None:
        path = trace_path(self.out)
        with atomic_file(path) as tmp:
            prof.export_chrome_trace(str(tmp))
        self.written["trace_file"] = path.name
        self.written["trace_steps"] = self.trace_steps
        self.written["trace_first_step"] = self.warmup

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        import torch

        if self._prof is not None:
            self._prof.__exit__(kind, exc, tb)  # flushes a schedule cut short by the end of the run
        if self.memory_snapshot and self.writer:
            # Dumped however the loop ended: after an out-of-memory error the snapshot is what
            # explains it (the OOM record does not name it; it lies at the same place).
            try:
                path = snapshot_path(self.out)
                with atomic_file(path) as tmp:
                    torch.cuda.memory._dump_snapshot(str(tmp))
                self.written["memory_snapshot_file"] = path.name
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)

    def attrs(self) -> dict[str, Any]:
        """What the record names: the files written (relative to its folder) and the traced steps."""
        return dict(self.written)
