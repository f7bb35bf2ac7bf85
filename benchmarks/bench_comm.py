"""A link's alpha and beta per collective, measured with the calls FSDP and DDP make, and
whether communication overlaps compute at all (issue 32, part 4b).

Run it under the launcher whose link you want, e.g. on the 2-node CI Slurm
(`.ci/slurm-up --nodes 2`):

    srun -N2 -n2 -c1 python benchmarks/bench_comm.py --out inter.json   # one rank per node: the veth link
    srun -N1 -n2 -c1 python benchmarks/bench_comm.py --out intra.json   # two ranks in one node: loopback
    srun -N2 -n4 -c1 python benchmarks/bench_comm.py --out four.json    # the 2-node rungs' placement

Every rank times, for fp32 tensors from 4 KiB to ``--max-mib`` MiB (default 64: FSDP gathers a
whole 1,024-wide layer, 34 MB, and DDP all-reduces 25 MiB buckets):

* ``all_reduce(x)`` (DDP's buckets, NO_SHARD, HYBRID's replicate group),
* ``all_gather_single(out, shard)`` (torch 2.14's name for ``all_gather_into_tensor``: FSDP1's
  and FSDP2's unit gather),
* ``reduce_scatter_single(shard, x)`` (``reduce_scatter_tensor``: FSDP's gradient reduction),

``--repeats`` each after 2 untimed, a barrier before each, and keeps the fastest and the
median. Rank 0 fits each collective with the formula the backend runs (``planner/comm.py``
``terms``: on gloo a reduce-scatter is an all-reduce of the whole tensor) by least squares on
relative error, and writes the figures as a profile's ``timing.links`` entry reads them.

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


def _fit(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """Least squares t = a + b·S on RELATIVE error (weights 1/t²) -> (a, b). TRAP: plain least
    squares lets the largest message set the intercept (its noise is milliseconds, alpha is
    microseconds), and on a shared machine the intercept then comes out at any value."""
    w = [1 / t**2 for t in times]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, sizes)), sum(wi * y for wi, y in zip(w, times))
    sxx, sxy = sum(wi * x * x for wi, x in zip(w, sizes)), sum(wi * x * y for wi, x, y in zip(w, sizes, times))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - b * sx) / sw, b


def figures(collective: str, n: int, sizes: list[float], times: list[float], backend: str = "gloo") -> dict[str, float]:
    """The link figures (alpha_us, gbps) that make ``terms(collective, n)`` fit ``times``."""
    a, b = _fit(sizes, times)
    k_alpha, k_beta = terms(collective, n, backend)
    return {"alpha_us": round(max(a, 0.0) / k_alpha * 1e6, 1), "gbps": round(k_beta / b / 1e9, 4)}


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


def overlap(repeats: int, nbytes: int = 16 << 20) -> dict[str, float]:
    """Does an async all-reduce hide behind compute on this device? (module docstring)"""
    import torch
    import torch.distributed as dist

    a, x = torch.randn(256, 256), torch.ones(nbytes // 4)
    reps = 1
    while True:  # a compute loop of about the all-reduce's length
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ a
        took = time.perf_counter() - t0
        if took > 0.05:
            break
        reps *= 2

    def compute() -> None:
        for _ in range(reps):
            a @ a

    def both() -> None:
        work = dist.all_reduce(x, async_op=True)
        compute()
        work.wait()

    _, c = _time(compute, repeats)
    _, m = _time(lambda: dist.all_reduce(x, async_op=True).wait(), repeats)
    _, t = _time(both, repeats)
    return {"compute_s": c, "comm_s": m, "both_s": t, "overlap": round((c + m - t) / min(c, m), 3), "bytes": nbytes}


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
        size *= 4
    ov = overlap(args.repeats) if args.overlap else None
    dist.barrier()
    if env.rank == 0:
        out = {
            "ranks": n, "nodes": env.nodes, "backend": "gloo", "torch": torch.__version__,
            "load_average": [round(x, 2) for x in (*load0, *os.getloadavg())],
            "sizes_bytes": sizes, "fastest_s": fastest, "median_s": median,
            "fit_fastest": {c: figures(c, n, sizes, fastest[c]) for c in COLLECTIVES},
            "fit_median": {c: figures(c, n, sizes, median[c]) for c in COLLECTIVES},
        }
        if ov is not None:
            out["overlap"] = ov
        atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
        print(json.dumps({k: out[k] for k in ("ranks", "nodes", "load_average", "fit_fastest", "fit_median", *(
            ["overlap"] if ov else []))}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
