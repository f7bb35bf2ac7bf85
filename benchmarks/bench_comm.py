"""A link's alpha and beta, measured with the collectives the planner models (issue 32, part 4b).

Run it under the launcher whose link you want, e.g. on the 2-node CI Slurm
(`.ci/slurm-up --nodes 2`):

    srun -N2 -n2 -c1 python benchmarks/bench_comm.py --out inter.json   # one rank per node: the veth link
    srun -N1 -n2 -c1 python benchmarks/bench_comm.py --out intra.json   # two ranks in one node: loopback

Every rank times ``all_reduce`` and ``all_gather`` of fp32 tensors from 4 KiB to ``--max-mib``
MiB (``--repeats`` each after 3 untimed, a barrier before each; the median), rank 0 fits the
planner's own formulas (planner/comm.py) by least squares and writes them as the profile's
``timing.links`` entry would read:

* all-reduce (ring): t = 2(n-1)·alpha + 2(n-1)/n · S/beta
* all-gather (ring): t = (n-1)·alpha + (n-1)/n · S/beta     (S: the gathered bytes)

gloo on CPU tensors only (the backend a CPU rank has); NCCL/RCCL on a GPU site would give
other figures, and a GPU site's links come from its datasheets until a run there measures
them. Torch is imported here, not in the planner.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def _fit(sizes: list[float], times: list[float]) -> tuple[float, float]:
    """Least squares t = a + b·S on RELATIVE error (weights 1/t²) -> (a, b). TRAP: plain least
    squares lets the largest message set the intercept (its noise is milliseconds, alpha is
    microseconds), and on a shared machine the intercept then comes out at any value."""
    w = [1 / t**2 for t in times]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, sizes)), sum(wi * y for wi, y in zip(w, times))
    sxx, sxy = sum(wi * x * x for wi, x in zip(w, sizes)), sum(wi * x * y for wi, x, y in zip(w, sizes, times))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return (sy - b * sx) / sw, b


def _time(op, repeats: int) -> float:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    for _ in range(3):
        op()
    out = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        out.append(time.perf_counter() - t0)
    # the fastest repeat: on a shared machine the others wait for a core, not for the link
    return min(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--max-mib", type=float, default=16.0, help="largest tensor (MiB, default 16)")
    p.add_argument("--repeats", type=int, default=15)
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
    n = env.world
    sizes, ar, ag = [], [], []
    size = 4096
    while size <= args.max_mib * 2**20:
        x = torch.ones(size // 4)
        parts = [torch.empty(size // 4 // n) for _ in range(n)]
        mine = torch.ones(size // 4 // n)
        ar.append(_time(lambda: dist.all_reduce(x), args.repeats))
        ag.append(_time(lambda: dist.all_gather(parts, mine), args.repeats))
        sizes.append(float(size))
        size *= 4
    dist.barrier()
    if env.rank == 0:
        a, b = _fit(sizes, ar)
        ga, gb = _fit(sizes, ag)
        out = {
            "ranks": n, "nodes": env.nodes, "backend": "gloo", "torch": torch.__version__,
            "sizes_bytes": sizes, "all_reduce_s": ar, "all_gather_s": ag,
            "all_reduce": {"alpha_us": a / (2 * (n - 1)) * 1e6, "gbps": 2 * (n - 1) / n / b / 1e9},
            "all_gather": {"alpha_us": ga / (n - 1) * 1e6, "gbps": (n - 1) / n / gb / 1e9},
        }
        atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
        print(json.dumps({k: out[k] for k in ("ranks", "nodes", "all_reduce", "all_gather")}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
