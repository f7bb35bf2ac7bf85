"""Put a loader's host batches on the device one step ahead, off the compute stream.

The fault this fixes: the timed loop used to copy each loader batch to the GPU on the
compute stream, inside the step (``v.to(device, non_blocking=True)``), and bf16-true
converted images to bf16 on the host, into unpinned memory, which makes that copy
synchronous. For ViT-Base at batch 128 that is 77 MB of fp32 images a step, about 3-7%
of an H100 step, charged to the model.

:class:`DeviceFeed` on a GPU:

* copies batch ``k+1`` from pinned host memory on a side stream while the compute
  stream runs step ``k`` (the host issues the copy when the loop asks for batch ``k``);
* converts floating tensors to the run's dtype ON THE DEVICE, after the copy (the host
  batch stays fp32 and pinned, so the copy stays asynchronous);
* makes the compute stream wait for the copy with an event-style ``wait_stream`` — a
  device-side dependency, no host sync — and calls ``record_stream`` on each tensor so
  the caching allocator does not hand its memory to another tensor while the compute
  stream may still read it (TRAP: without it, a tensor allocated on the side stream and
  freed after the step can be reused by the next copy before the step's kernels ran).

The time the host waits for the loader's next batch is measured per step
(``wait_s``): zero when the loader keeps up. It is host time before the step's kernels
are issued; on a GPU it is hidden while the device still has queued work.

On the CPU there is no copy: batches are converted where the copy would be and handed
on. Synthetic batches are made on the device before the loop and need no feed.

The loader's batches arrive as uint8 images (or encoded JPEGs); the ``decoder`` given here
(``ShardLoader.device_transform``: data/devnorm.py or data/devdecode.py) copies them from
pinned memory with ``non_blocking`` copies and normalises them in float32 on the device,
on the side stream; :func:`to_device` then casts to the rung's dtype.

Beside the wait, the record keeps the loader's host cost: the workers' CPU seconds per
batch (``loader_cpu_s_per_batch``, the timed steps' mean; data/loader.py measures it in
each worker), so that a slow step caused by the workers' load on the rank's cores shows up
as that, even when the step never waited.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

Batch = dict[str, Tensor]


def to_device(batch: Batch, device: torch.device, dtype: torch.dtype) -> Batch:
    """Copy (asynchronously from pinned memory), then convert floats on the device."""
    out = {}
    for k, v in batch.items():
        v = v.to(device, non_blocking=True)
        out[k] = v.to(dtype) if v.is_floating_point() and v.dtype != dtype else v
    return out


# A rung is called input-bound when its steps waited for the loader for more than this
# fraction of the timed window's step time: 3% is above the noise of a host clock read
# per step and well below what changes a throughput comparison.
INPUT_BOUND_FRACTION = 0.03


class DeviceFeed:
    """Iterate ``batches`` as device batches of ``dtype``, prefetching one ahead on a GPU.

    ``decoder`` (the loader's ``decode="gpu"`` path, data/devdecode.py): called on each
    host batch where the copy would be, on the side stream, so the JPEG decode and the
    image transforms run on the device one step ahead, like the copy.
    """

    def __init__(self, batches: Iterable[Batch], device: torch.device, dtype: torch.dtype, steps: int,
                 decoder: Callable[[Batch], Batch] | None = None) -> None:
        self.batches, self.device, self.dtype, self.decoder = batches, device, dtype, decoder
        self.wait_s = np.zeros(steps)  # host seconds spent waiting for the loader, per batch handed out

    def record_attrs(self, step_time_s: np.ndarray, warmup: int) -> dict[str, Any]:
        """After the run: the loader's own rate, and whether the timed steps waited for it.

        ``step_time_s`` are the timed steps (after ``warmup``); ``wait_s`` holds every step.
        """
        waited = float(self.wait_s[warmup:warmup + len(step_time_s)].sum())
        fraction = waited / max(float(np.sum(step_time_s)), 1e-12)
        attrs: dict[str, Any] = {"loader_wait_fraction": fraction, "input_bound": bool(fraction > INPUT_BOUND_FRACTION)}
        rate = getattr(self.batches, "samples_per_s", None)
        if rate is not None:
            attrs["loader_samples_per_s"] = float(rate)
        cpu = np.asarray(getattr(self.batches, "cpu_s", []), dtype=float)[warmup:warmup + len(step_time_s)]
        if len(cpu) and np.isfinite(cpu).any():
            attrs["loader_cpu_s_per_batch"] = float(np.nanmean(cpu))
        if self.decoder is not None and hasattr(self.decoder, "record_attrs"):
            # what actually decoded: host fallbacks counted, decode_path corrected (data/devdecode.py)
            attrs.update(self.decoder.record_attrs())
        return attrs

    def __len__(self) -> int:
        return len(self.wait_s)

    def _next_host(self, it: Iterator[Batch], i: int) -> Batch | None:
        t = time.perf_counter()
        batch = next(it, None)
        if i < len(self.wait_s):
            self.wait_s[i] = time.perf_counter() - t
        return batch

    def __iter__(self) -> Iterator[Batch]:
        it = iter(self.batches)
        if self.device.type != "cuda":
            i = 0
            while (b := self._next_host(it, i)) is not None:
                yield self._convert(b)
                i += 1
            return
        side = torch.cuda.Stream(self.device)
        i = 0
        ahead = self._stage(self._next_host(it, 0), side)
        while ahead is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(side)
            for v in ahead.values():
                v.record_stream(compute)
            current = ahead
            i += 1
            ahead = self._stage(self._next_host(it, i), side)  # copy k+1 while step k runs
            yield current

    def _stage(self, batch: Batch | None, side: torch.cuda.Stream) -> Batch | None:
        if batch is None:
            return None
        with torch.cuda.stream(side):
            return self._convert(batch)

    def _convert(self, batch: Batch) -> Batch:
        if self.decoder is not None:
            batch = self.decoder(batch)  # the images made on the device (from pinned host bytes)
        return to_device(batch, self.device, self.dtype)
