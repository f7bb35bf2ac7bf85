"""`scaleladder spawn`: start N ranks on this machine, without torch in the launcher.

``torchrun --standalone`` is a Python process that imports torch (seconds per rung on a
small CPU: docs/performance.md, "Start-up") only to start N processes, hold a free port and
kill the rest when one fails. On one machine that is all a rung needs, so this does it with
the standard library: each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) plus ``SCALELADDER_LAUNCHER=spawn``,
so the record names the launcher that ran (rung/launch.py). Rank 0 hosts the rendezvous
store itself, as under srun.

Like torchrun: the first rank to fail stops the others (SIGTERM, then SIGKILL after
``--grace``), and its exit code is the launcher's; a SIGTERM or SIGINT to the launcher (a
Slurm time limit, Snakemake stopping) reaches every rank.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from scaleladder.spec import SpecError, parse_positive

POLL_S = 0.05  # how often the launcher looks at its ranks: a rung's start-up is seconds


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc-per-node", required=True, help="ranks to start on this machine")
    p.add_argument("--master-port", default=None, help="rendezvous port (default: a free one, as torchrun --standalone)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds the other ranks get after SIGTERM before SIGKILL")
    # TRAP: not dest "command": that is the CLI's own subcommand attribute (cli.py)
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="the rank program and its arguments, e.g. `scaleladder run --spec ...`")


def free_port() -> int:
    """A port no one listens on now. TRAP: another process may take it before rank 0 binds
    it (torchrun --standalone has the same window); rank 0's bind then fails naming the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rank_env(base: dict[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """torchrun's variables for one rank of a one-machine world."""
    return {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "ROLE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "SCALELADDER_LAUNCHER": "spawn"}


def stop(procs: Sequence[subprocess.Popen[Any]], grace: float) -> None:
    """SIGTERM to every rank still running, SIGKILL to any left after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def spawn(command: Sequence[str], nproc: int, port: int, grace: float = 10.0) -> int:
    """Run ``command`` as ``nproc`` ranks; 0 when all succeed, else the first failure's code."""
    base = dict(os.environ)
    if nproc > 1:
        base.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default too: N ranks must not each take every core
    procs = [subprocess.Popen(list(command), env=rank_env(base, r, nproc, port)) for r in range(nproc)]
    signalled: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        signalled.append(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            if signalled:
                stop(procs, grace)
                return 128 + signalled[0]
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                stop(procs, grace)
                code = failed[0]
                return code if code > 0 else 128 - code  # killed by a signal: the shell's convention
            if all(c == 0 for c in codes):
                return 0
            time.sleep(POLL_S)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def main(args: argparse.Namespace) -> int:
    nproc = parse_positive("nproc-per-node", args.nproc_per_node)
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise SpecError("spawn needs the rank program after its options, e.g. `scaleladder spawn --nproc-per-node 2 scaleladder run ...`")
    port = parse_positive("master-port", args.master_port) if args.master_port else free_port()
    return spawn(command, nproc, port, args.grace)
