"""The rank's cores belong to the rank: which cores the loader's workers may run on, and ``--workers auto``.

On an H100, 14 workers decoding beside the rank slowed its kernel launches (its vit-base b128
step went from 49 to 62 ms; docs/performance.md). The rank's launch thread must keep a core.

* The cores start from ``os.sched_getaffinity(0)``: what Slurm bound this task to
  (``--cpus-per-task``, ``--cpu-bind``), not the machine's ``os.cpu_count()``. Where ranks
  share one set (torchrun's ranks inherit one; a workstation), each takes its own slice of
  it by local rank.
* :data:`RANK_CORES` of them (the first) stay the rank's; the workers are bound to the rest
  (:func:`bind_worker`, each DataLoader worker at its start). With fewer than two cores there
  is nothing to keep apart, and the workers share them.
* ``--workers auto``: as many workers as it takes to feed :data:`DEMAND_SAMPLES_PER_S` at
  :data:`PER_WORKER_SAMPLES_PER_S`, and no more than the cores left over.

Slurm profiles keep ``--cpus-per-task`` = OMP threads + workers, which `scaleladder doctor`'s
``threads`` check verifies (doctor_checks.py); with ``workers: auto`` the check counts what
:func:`auto_workers` would choose on that many cores.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from scaleladder.log import get_logger

_log = get_logger(__name__)

RANK_CORES = 1  # the rank's own: its launch thread (the pin-memory thread is light with uint8 batches)

# Samples one loader worker makes per CPU-second at 224 px from 300-900 px JPEG shards, vit-base
# transforms, uint8 transport; per decode path. Measured with benchmarks/bench_data.py on dev-cpu
# (docs/performance.md, "The loader's own rate": 135-147 with CPU decode, 573-641 for the workers'
# part of GPU decode: tar, JPEG header, crop draw), the lower figure of each, rounded down: CPU
# time, so it holds on that busy VM; a quiet server core is faster, so this is a floor.
PER_WORKER_SAMPLES_PER_S = {"cpu": 135.0, "gpu": 570.0}
# What one rank may ask of its loader: vit-base b128 on one H100 ran 2,603 samples/s on
# synthetic data (docs/gpu-check-h100/), the fastest per-GPU rate any rung measured.
DEMAND_SAMPLES_PER_S = 2600.0


@dataclass(frozen=True)
class CorePlan:
    """One rank's cores: its own, and those its loader's workers may use."""

    cores: tuple[int, ...]  # this rank's share of the affinity set
    rank_cores: tuple[int, ...]
    worker_cores: tuple[int, ...]
    shared: int  # ranks sharing the affinity set this share was cut from (1: bound by Slurm)
    bound: bool  # SLURM_CPUS_PER_TASK was set: the count is Slurm's

    def describe(self) -> str:
        how = "SLURM_CPUS_PER_TASK" if self.bound else "sched_getaffinity"
        share = f", 1/{self.shared} of the set (local ranks share it)" if self.shared > 1 else ""
        return f"{len(self.cores)} core(s) per rank ({how}{share}), {len(self.rank_cores)} kept for the rank"


def plan_cores(local_rank: int = 0, local_world: int = 1, affinity: set[int] | None = None,
               env: dict[str, str] | None = None) -> CorePlan:
    """This rank's cores, from its affinity set; split by local rank where the ranks share it."""
    env = dict(os.environ) if env is None else env
    allowed = sorted(affinity if affinity is not None else os.sched_getaffinity(0))
    bound = bool(env.get("SLURM_CPUS_PER_TASK", "").isdigit())
    shared = 1
    per_task = int(env["SLURM_CPUS_PER_TASK"]) if bound else 0
    # one set for several ranks (torchrun under one srun task, or no binding): a slice each
    if local_world > 1 and (not bound or len(allowed) >= local_world * per_task):
        shared = local_world
        n = max(len(allowed) // local_world, 1)
        allowed = allowed[local_rank * n:(local_rank + 1) * n] or allowed[-n:]
    mine = tuple(allowed)
    if len(mine) < 2:
        return CorePlan(mine, mine, mine, shared, bound)
    return CorePlan(mine, mine[:RANK_CORES], mine[RANK_CORES:], shared, bound)


def auto_workers(cores_per_rank: int, decode: str = "cpu") -> int:
    """``--workers auto``: enough to feed the demand at the measured per-worker rate, at most
    the cores the rank does not keep (none where it has one core: the main process loads)."""
    spare = max(cores_per_rank - RANK_CORES, 0)
    needed = math.ceil(DEMAND_SAMPLES_PER_S / PER_WORKER_SAMPLES_PER_S.get(decode, PER_WORKER_SAMPLES_PER_S["cpu"]))
    return min(spare, needed)


def auto_note(plan: CorePlan, workers: int, decode: str) -> str:
    """What ``--workers auto`` chose and from what (the record keeps it; a one-line note where
    the CPU count was not set by Slurm and the count is an assumption)."""
    rate = PER_WORKER_SAMPLES_PER_S.get(decode, PER_WORKER_SAMPLES_PER_S["cpu"])
    return (f"--workers auto: {workers} worker(s) from {plan.describe()} and {rate:.0f} samples/s per worker "
            f"(decode {decode}; benchmarks/bench_data.py) against {DEMAND_SAMPLES_PER_S:.0f} samples/s")


def bind_worker(cores: tuple[int, ...], worker_id: int = 0) -> None:
    """In a DataLoader worker (its ``worker_init_fn``, called with the worker's id): run on
    ``cores`` only (the rank's own kept free). Silently nothing where the platform cannot
    bind (no sched_setaffinity) or the set is gone."""
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError:
            pass  # a core taken away since (cgroup change): the worker runs where it may


def loader_workers(workers: int | str, local_rank: int, local_world: int, decode: str,
                   speak: bool) -> tuple[int, tuple[int, ...], dict[str, Any]]:
    """A rank's loader workers: (count, the cores they are bound to, record attributes).

    ``workers="auto"`` resolves here (:func:`auto_workers`). Where Slurm did not set the CPU
    count (``SLURM_CPUS_PER_TASK``), what ``auto`` assumed is said in one line (``speak``:
    rank 0). The workers are bound off the rank's own cores whenever there are two or more."""
    plan = plan_cores(local_rank, local_world)
    attrs: dict[str, Any] = {}
    if workers == "auto":
        count = auto_workers(len(plan.cores), decode)
        attrs["loader_workers_auto"] = auto_note(plan, count, decode)
        if speak and not plan.bound:
            _log.info(f"scaleladder: note: --workers auto: SLURM_CPUS_PER_TASK is not set; assumed {plan.describe()}: "
                      f"{count} worker(s)")
    else:
        count = int(workers)
    bind = plan.worker_cores if count > 0 and len(plan.cores) >= 2 else ()
    attrs["loader_worker_cores"] = len(bind)
    return count, bind, attrs
