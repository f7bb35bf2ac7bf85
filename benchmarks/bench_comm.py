"""A link's alpha and beta per collective, measured with the calls FSDP and DDP make, and
whether communication overlaps compute at all.

Run it under the launcher whose link you want, e.g. on the 2-node CI Slurm
(`.ci/slurm-up --nodes 2`):

    srun -N2 -n2 -c1 python benchmarks/bench_comm.py --out inter.json   # one rank per node: the veth link
    srun -N1 -n2 -c1 python benchmarks/bench_comm.py --out intra.json   # two ranks in one node: loopback
    srun -N2 -n4 -c1 python benchmarks/bench_comm.py --out four.json    # the 2-node rungs' placement

Every rank times, for fp32 tensors from 4 KiB to ``--max-mib`` MiB (default 64: FSDP gathers a
whole 1,024-wide layer, 34 MB, and DDP all-reduces 25 MiB buckets; x4 steps to 4 MiB, x2 above):

* ``all_reduce(x)`` (DDP's buckets, NO_SHARD, HYBRID's replicate group),
* ``all_gather_single(out, shard)`` (torch 2.14's name for ``all_gather_into_tensor``: FSDP1's
  and FSDP2's unit gather),
* ``reduce_scatter_single(shard, x)`` (``reduce_scatter_tensor``: FSDP's gradient reduction),

``--repeats`` each after 2 untimed, a barrier before each, and keeps the fastest and the
median. Rank 0 fits each collective (alpha from the messages up to 64 KiB, beta from 16 MiB up:
``figures``) with the formula the backend runs (``planner/comm.py`` ``terms``: on gloo a reduce-scatter is an all-reduce of the whole
tensor) by least squares on relative error, and writes the figures as a profile's ``timing.links`` entry reads them.

Every run also times a memory-bound loop (and an in-cache matmul) on every rank at once against
rank 0 alone (the others asleep, not in a barrier): ``contention.factor``, how much slower a rank works under
this placement and the load of the moment (a CPU rung's ranks share the 2 cores and their memory
with each other and with everyone's).

``--overlap``: each rank times a compute loop alone (C), an async all-reduce alone (M), and
both at once (T: ``all_reduce(async_op=True)``, compute, ``wait()``); the overlap is
``(C + M - T) / min(C, M)``, 1 when the shorter one hides completely, 0 when they add.

gloo on CPU tensors only (the backend a CPU rank has); NCCL/RCCL on a GPU site would give
other figures, and a GPU site's links come from its datasheets until a run there measures
them. Torch is imported here, not in the planner.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

from scaleladder.planner.comm import COLLECTIVES, terms


ALPHA_UP_TO, BETA_FROM = 64 << 10, 16 << 20  # beta: the rungs' sizes (25 MiB DDP buckets, 34 MB FSDP units)


def figures(collective: str, n: int, sizes: list[float], times: list[float], backend: str = "gloo") -> dict[str, float]:
    """The link figures (alpha_us, gbps) of ``terms(collective, n)``: alpha from the messages up
    to 64 KiB (the median of their times over the latency terms), beta from those of 16 MiB and
    more (least squares on the absolute error of what alpha leaves). TRAP: gloo's time per byte is
    not one figure from 4 KiB to 64 MiB (an all-gather or a reduce-scatter allocates a fresh
    output or clone of the whole tensor, and from ~16 MiB on the first touch and the caches
    cost more per byte): one line through every size lets the small messages set a beta that
    FSDP's 34 MB units never see; the rungs move 1-64 MiB."""
    k_alpha, k_beta = terms(collective, n, backend)
    small = [t for s, t in zip(sizes, times) if s <= ALPHA_UP_TO] or [min(times)]
    alpha = statistics.median(small) / k_alpha
    big = [(s, t - k_alpha * alpha) for s, t in zip(sizes, times) if s >= BETA_FROM and t > k_alpha * alpha]
    big = big or [(s, t) for s, t in zip(sizes, times)]
    # y = per_byte * s by least squares on the absolute error: the largest messages, which take
    # most of a step, weigh most (round 1 fitted relative error, and 32 MiB gathers came out 6x short)
    per_byte = sum(s * y for s, y in big) / sum(s * s for s, _ in big)
    return {"alpha_us": round(alpha * 1e6, 1), "gbps": round(k_beta / per_byte / 1e9, 4)}


def _time(op: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(fastest, median) of ``repeats`` timed calls, a barrier before each."""
    import torch.distributed as dist

    for _ in range(2):
        op()
    out = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        out.append(time.perf_counter() - t0)
    return min(out), statistics.median(out)


def _ops(size: int, n: int, rank: int) -> dict[str, Callable[[], object]]:
    import torch
    import torch.distributed as dist

    whole, shard = torch.ones(size // 4), torch.ones(size // 4 // n)
    gathered, reduced = torch.empty(size // 4 // n * n), torch.empty(size // 4 // n)
    return {"all_reduce": lambda: dist.all_reduce(whole),
            "all_gather": lambda: dist.all_gather_single(gathered, shard),
            "reduce_scatter": lambda: dist.reduce_scatter_single(reduced, whole)}


def _compute_loop(kind: str = "matmul") -> Callable[[], None]:
    """A loop of at least 100 ms as rank 0 timed it, the same count on every rank: ``matmul``
    (256x256 fp32, in cache) or ``stream`` (x = 0.5x + y over two 64 MiB tensors: what a b1 rung
    of a wide flavor mostly does, streaming its weights, gradients and AdamW state)."""
    import torch
    import torch.distributed as dist

    if kind == "matmul":
        a = torch.randn(256, 256)

        def once() -> None:
            a @ a
    else:
        x, y = torch.ones(16 << 20), torch.ones(16 << 20)

        def once() -> None:
            x.mul_(0.5).add_(y)
    reps = 1
    for _ in range(3):  # warm first; under contention the first pass runs slow
        once()
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            once()
        if time.perf_counter() - t0 > 0.1:
            break
        reps *= 2
    n = torch.tensor([reps])
    dist.broadcast(n, 0)
    count = int(n)

    def compute() -> None:
        for _ in range(count):
            once()

    return compute


def _together_and_alone(compute: Callable[[], None], repeats: int) -> dict[str, float]:
    import torch.distributed as dist

    _, together = _time(compute, repeats)
    alone = []
    for _ in range(repeats):
        dist.barrier()
        if dist.get_rank() == 0:
            t0 = time.perf_counter()
            compute()
            alone.append(time.perf_counter() - t0)
        else:
            # TRAP: waiting in gloo's barrier is not idle: with 4 ranks on 2 cores rank 0 "alone"
            # ran 3.6x slower than on 2 ranks (317 against 88 ms). Sleep past rank 0's work
            # (alone <= together) before joining the barrier, so rank 0 really works alone.
            time.sleep(2 * together + 0.05)
        dist.barrier()
    a = statistics.median(alone) if alone else float("nan")
    return {"alone_s": a, "together_s": together, "factor": round(together / a, 3) if alone else float("nan")}


def contention(repeats: int) -> dict[str, float | dict[str, float]]:
    """How much slower a rank works when every rank of this placement works at once than when
    rank 0 works alone (the others asleep): the share of the shared cores and memory
    a rung's rank gets, under the load of the moment. ``factor`` is the memory-bound loop's (a b1
    step of vit-debug-wide streams ~0.7 GB and computes ~0.5 GFLOP: memory-bound); the in-cache
    matmul's is kept beside it."""
    stream = _together_and_alone(_compute_loop("stream"), repeats)
    return {**stream, "matmul": _together_and_alone(_compute_loop("matmul"), repeats)}


def overlap(repeats: int, nbytes: int = 16 << 20) -> dict[str, float]:
    """Does an async all-reduce hide behind compute on this device? (module docstring) Each of
    ``3 x repeats`` rounds times the three back to back (C, M, T), so that the load's drift
    falls on all three alike; the median of the rounds' overlaps."""
    import torch
    import torch.distributed as dist

    x = torch.ones(nbytes // 4)
    compute = _compute_loop()

    def both() -> None:
        work = dist.all_reduce(x, async_op=True)
        compute()
        work.wait()

    rounds = []
    for _ in range(3 * repeats):
        c = _time(compute, 1)[0]
        m = _time(lambda: dist.all_reduce(x, async_op=True).wait(), 1)[0]
        t = _time(both, 1)[0]
        rounds.append((c, m, t, (c + m - t) / min(c, m)))
    med = statistics.median(r[3] for r in rounds)
    return {"compute_s": statistics.median(r[0] for r in rounds), "comm_s": statistics.median(r[1] for r in rounds),
            "both_s": statistics.median(r[2] for r in rounds), "overlap": round(med, 3),
            "overlap_quartiles": [round(q, 3) for q in statistics.quantiles([r[3] for r in rounds], n=4)],
            "bytes": nbytes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--max-mib", type=float, default=64.0, help="largest tensor (MiB, default 64)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--overlap", action="store_true", help="also measure whether comm overlaps compute")
    args = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    from scaleladder.files import atomic_write_text
    from scaleladder.rung.launch import detect

    env = detect()
    if env.world < 2:
        print("bench_comm: needs at least 2 ranks (run it under srun -n2 or torchrun)", file=sys.stderr)
        return 2
    dist.init_process_group("gloo", init_method=f"tcp://{env.master_addr}:{env.master_port}", rank=env.rank,
                            world_size=env.world)
    n, load0 = env.world, os.getloadavg()
    sizes: list[float] = []
    fastest: dict[str, list[float]] = {c: [] for c in COLLECTIVES}
    median: dict[str, list[float]] = {c: [] for c in COLLECTIVES}
    size = 4096
    while size <= args.max_mib * 2**20:
        for c, op in _ops(size, n, env.rank).items():
            f, m = _time(op, args.repeats)
            fastest[c].append(f)
            median[c].append(m)
        sizes.append(float(size))
        size *= 4 if size < 4 << 20 else 2  # x2 from 4 MiB: the rungs' sizes (25 MiB buckets, 34 MB units)
    ov = overlap(args.repeats) if args.overlap else None
    cont = contention(args.repeats)
    dist.barrier()
    if env.rank == 0:
        out = {
            "ranks": n, "nodes": env.nodes, "backend": "gloo", "torch": torch.__version__,
            "load_average": [round(x, 2) for x in (*load0, *os.getloadavg())],
            "sizes_bytes": sizes, "fastest_s": fastest, "median_s": median,
            "fit_fastest": {c: figures(c, n, sizes, fastest[c]) for c in COLLECTIVES},
            "fit_median": {c: figures(c, n, sizes, median[c]) for c in COLLECTIVES},
        }
        out["contention"] = cont
        if ov is not None:
            out["overlap"] = ov
        atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
        print(json.dumps({k: out[k] for k in ("ranks", "nodes", "load_average", "fit_fastest", "fit_median", "contention", *(
            ["overlap"] if ov else []))}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
