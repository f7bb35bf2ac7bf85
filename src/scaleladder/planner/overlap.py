"""What a step's communication hides behind its compute: one GPU compute stream, one network
channel, and the order the wrapper issues collectives in.

A step is a list of :class:`Stage` in execution order (the forward's units, then the
backward's in reverse). A stage may need a collective to finish before its compute starts
(``before_s``: FSDP's all-gather of the unit) and may start one when its compute ends
(``after_s``: FSDP's reduce-scatter, a DDP bucket's all-reduce). Collectives run one at a
time on the channel (one NCCL/RCCL communicator serialises them), in the order they become
ready. A stage's ``depth`` is how far ahead its gather may be issued:

* ``depth = 1``: the gather of stage i starts once stage i-1's compute has started — FSDP1's
  ``limit_all_gathers`` (at most the current and the next unit gathered) and BACKWARD_PRE,
  FSDP2's implicit prefetch; a unit's gather hides behind the previous unit's compute;
* ``depth = k > 1``: FSDP2's explicit prefetch ``pf(k-1)``;
* ``depth = None``: no limit (FSDP1 ``-nolag``: the CPU issues gathers as fast as it runs);
* ``depth = 0``: no prefetch (FSDP1's backward ``none``/``post``: the gather waits for the previous
  compute to end). ``gather_first``: the gather goes on the channel before reductions that
  became ready at the same moment (BACKWARD_POST issues the next gather before the reduce).

What is exposed is the makespan less the compute: ``exposed_s = total_s - compute_s``.

Whether the device can overlap at all is the calibration's ``overlap`` (``rates.Rates``): the
share of what the replay hides that really hides, 1 on a GPU (its compute stream and the
NCCL/RCCL channel run side by side), 0 on a CPU rank with gloo. TRAP (measured,
``benchmarks/bench_comm.py --overlap``, docs/planner-internals.md "CPU ranks and gloo"): on the 2-core VM an
async gloo all-reduce beside a matmul loop took as long as the two one after the other, since
gloo's thread copies and sums on the same cores; and FSDP1 on a CPU issues its gathers and
reduce-scatters synchronously (no streams) anyway. ``total_s`` is then the replay's makespan
moved towards ``compute_s + comm_s`` by ``1 - overlap``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    compute_s: float
    before_s: float = 0.0  # a collective that must end before the compute starts
    after_s: float = 0.0  # a collective that starts when the compute ends
    depth: int | None = 1  # how many stages ahead its gather may be issued (None: no limit)
    gather_first: bool = False  # its gather precedes reductions ready when it is issued


@dataclass(frozen=True)
class Schedule:
    total_s: float
    compute_s: float
    comm_s: float

    @property
    def exposed_s(self) -> float:
        return max(self.total_s - self.compute_s, 0.0)


def _gather_ready(i: int, depth: int | None, starts: list[float], ends: list[float]) -> float:
    if depth is None or i == 0:
        return 0.0
    if depth == 0:
        return ends[i - 1]
    return starts[i - depth] if i - depth >= 0 else 0.0


def schedule(stages: Sequence[Stage], overlap: float = 1.0) -> Schedule:
    """Replay ``stages`` on one compute stream and one channel (see the module docstring); with
    ``overlap`` < 1 only that share of what the replay hides stays hidden."""
    channel = gpu = 0.0
    starts: list[float] = []
    ends: list[float] = []
    pending: list[tuple[float, float]] = []  # (ready, duration) of after-collectives, in ready order

    def drain(until: float, strict: bool = False) -> None:
        nonlocal channel
        while pending and (pending[0][0] < until or (not strict and pending[0][0] == until)):
            ready, took = pending.pop(0)
            channel = max(channel, ready) + took

    for i, s in enumerate(stages):
        gathered = 0.0
        if s.before_s > 0:
            ready = _gather_ready(i, s.depth, starts, ends)
            drain(ready, strict=s.gather_first)  # collectives ready before this gather was issued go first
            channel = max(channel, ready) + s.before_s
            gathered = channel
        start = max(gpu, gathered)
        gpu = start + s.compute_s
        starts.append(start)
        ends.append(gpu)
        if s.after_s > 0:
            pending.append((gpu, s.after_s))
    drain(float("inf"))
    compute = sum(s.compute_s for s in stages)
    comm = sum(s.before_s + s.after_s for s in stages)
    replay, serial = max(gpu, channel), compute + comm
    if overlap >= 1.0:  # a GPU: the replay as it is (not the blend's rounding of it)
        return Schedule(replay, compute, comm)
    return Schedule(serial - max(overlap, 0.0) * (serial - replay), compute, comm)
