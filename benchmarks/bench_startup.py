"""A rung's start-up, phase by phase: where the seconds outside the measured window go.

Runs `scaleladder launch` for a few rungs, each REPEATS times in fresh processes, under each
launcher asked for, and prints the median of every phase the records carry (rung/startup.py,
docs/metrics.md "Start-up") beside the wall time of the whole command:

    python benchmarks/bench_startup.py                                   # spawn vs torchrun, 3 rungs, 3 repeats
    python benchmarks/bench_startup.py --launchers spawn --repeats 5 --rungs vit-debug/ddp/fp32/pre-lag/n1/b4

``outside`` is wall - (start-up + steps + tear-down): the supervisor, the launcher and the
processes' exit, which no rank can time. Numbers depend on the machine's load: run it quiet.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py

from scaleladder.markdown import row, rule

LAUNCHERS = {
    "spawn": "scaleladder spawn --nproc-per-node {ranks} scaleladder",
    "torchrun": "torchrun --standalone --nnodes 1 --nproc-per-node {ranks} -m scaleladder",
}
PHASES = ("startup_imports_s", "startup_group_s", "startup_build_s", "startup_first_batch_s", "window_s", "teardown_s")
DEFAULT_RUNGS = ["vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", "flava-debug/ddp/fp32/pre-lag/n1/b4"]


def one(spec: str, launcher: str, steps: int, warmup: int, out: Path) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    t0 = time.monotonic()
    subprocess.run(["scaleladder", "launch", "--launcher", launcher, "--spec", spec, "--steps", str(steps), "--warmup",
                    str(warmup), "--workers", "0", "--out", str(out)], env=env, check=True, capture_output=True)
    wall = time.monotonic() - t0
    with h5py.File(out) as f:
        row = {k: float(f.attrs[k]) for k in PHASES}
    out.unlink()
    row["wall_s"] = wall
    row["outside_s"] = wall - sum(row[k] for k in PHASES)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rungs", nargs="+", default=DEFAULT_RUNGS)
    p.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=list(LAUNCHERS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()
    cols = ["imports", "group", "build", "first batch", "steps", "teardown", "outside", "wall"]
    print(f"median of {a.repeats} run(s), seconds; load average {os.getloadavg()[0]:.1f} at the start")
    print(row(["rung", "launcher", *cols]))
    print(rule(len(cols) + 2))
    with tempfile.TemporaryDirectory() as tmp:
        for spec in a.rungs:
            for name in a.launchers:
                # interleaved repeats would be fairer under drift; each repeat is a fresh process either way
                rows = [one(spec, LAUNCHERS[name].format(ranks=a.ranks), a.steps, a.warmup, Path(tmp) / "r.h5")
                        for _ in range(a.repeats)]
                med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                vals = [med[k] for k in (*PHASES[:4], "window_s", "teardown_s", "outside_s", "wall_s")]
                print(row([spec, name, *(f"{v:.2f}" for v in vals)]), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
