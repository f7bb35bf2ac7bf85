"""A rung's per-step scalars as TensorBoard events, under ``<DIR>/<spec>/``.

Written by rank 0 from the record it has just written, after the timed window: the loop keeps
its losses on the device with no per-step sync (rung/loop.py), and a writer inside it would add
one per step. Every value is the record's own:

- ``loss``: the ``loss`` dataset, every step (warm-up included, as recorded);
- ``step_time_s``: the ``step_time_s`` dataset, every step;
- ``items_per_s``: items per step (local batch x world x items per sample) over that step's
  time, for the measured steps only (warm-up excluded, as from every statistic);
- ``memory/peak_active_gib``, ``memory/peak_reserved_gib``: the record's peaks, at the last step.

A rerun of the rung replaces its events (the folder is emptied first).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from scaleladder.results.record import Build, Memory, Settings, Spec, Throughput


def write(folder: str, spec: str, attrs: Mapping[str, object], datasets: Mapping[str, np.ndarray]) -> Path:
    """The events of one rung; the folder they are in."""
    from torch.utils.tensorboard import SummaryWriter

    logdir = Path(folder) / spec
    shutil.rmtree(logdir, ignore_errors=True)
    times = np.asarray(datasets["step_time_s"], dtype=np.float64)
    losses = np.asarray(datasets["loss"], dtype=np.float64)
    warmup = int(str(attrs.get(Settings.warmup, 0)))
    items_per_step = int(str(attrs[Spec.batch])) * int(str(attrs.get(Build.world_size, 1))) * int(str(attrs.get(Throughput.items_per_sample, 1)))
    writer = SummaryWriter(str(logdir))
    try:
        for step, (t, loss) in enumerate(zip(times, losses)):
            writer.add_scalar("loss", float(loss), step)
            writer.add_scalar("step_time_s", float(t), step)
            if step >= warmup and t > 0:
                writer.add_scalar("items_per_s", items_per_step / float(t), step)
        last = max(0, len(times) - 1)
        for key in (Memory.peak_active_gib, Memory.peak_reserved_gib):
            value = attrs.get(key)
            if isinstance(value, int | float | np.floating):
                writer.add_scalar(f"memory/{key}", float(value), last)
    finally:
        writer.close()
    return logdir
