"""Who am I? Rank, world and master address from torchrun, Slurm, or nothing.

torchrun exports RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT. Under
``srun`` (Frontier's recommended launcher: the OLCF guide measured 10 s against
10 min for torchrun) we read SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID and take
the master as the first host of SLURM_JOB_NODELIST. A plain process is rank 0
of 1. Precedence: torchrun's variables win, because ``srun torchrun`` sets both
and torchrun's are the ones that describe the worker.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# torch.distributed's usual default. A site whose port differs (OLCF's examples use
# 3442) sets MASTER_PORT in its profile; nothing site-specific belongs here.
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" | "slurm" | "single"

    @property
    def nodes(self) -> int:
        return max(1, self.world // max(1, self.local_world))


def first_slurm_host(nodelist: str) -> str:
    """First hostname of a Slurm nodelist ("frontier[00012-00015,0020]" -> "frontier00012")."""
    try:  # scontrol knows every nodelist syntax; it exists wherever srun does
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        pass
    # Fallback for the common forms: "a,b", "pre[01-04,07]suffix"
    head = nodelist.split(",")[0] if "[" not in nodelist.split(",")[0] else nodelist
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    first = rest.split("]")[0].split(",")[0].split("-")[0]
    return prefix + first


def detect(environ: dict[str, str] | None = None) -> DistEnv:
    env = os.environ if environ is None else environ
    port = int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT))
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=int(env["RANK"]),
            world=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port,
            source="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", 1)))
        local_world = int(env.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0] or 0) or max(1, world // nodes)
        addr = env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", "localhost")))
        return DistEnv(int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", 0)), local_world, addr, port, "slurm")
    return DistEnv(0, 1, 0, 1, "127.0.0.1", port, "single")


def pick_device(env: DistEnv, want: str = "auto") -> torch.device:
    """One GPU per rank (CUDA and ROCm both appear as 'cuda'), else the CPU."""
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no GPU")
    # With --gpus-per-task=1 (Frontier) each rank sees exactly one device: index 0.
    index = env.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init(env: DistEnv, device: torch.device, timeout_s: int = 600) -> None:
    """Start the process group: NCCL (RCCL on ROCm) on GPUs, gloo on the CPU.

    Always ``env://``: under torchrun the workers must join the agent's store
    (TORCHELASTIC_USE_AGENT_STORE); a ``tcp://`` URL would make rank 0 bind the
    port torchrun already holds. A single process is still a real one-rank group,
    so the ladder never special-cases "no process group".
    """
    # A plain process picks a free port; a launched one (even one rank under torchrun,
    # whose agent already serves the store on MASTER_PORT) must use the port it was given.
    port = _free_port() if env.source == "single" else env.master_port
    os.environ.update(
        MASTER_ADDR=env.master_addr, MASTER_PORT=str(port), RANK=str(env.rank), WORLD_SIZE=str(env.world),
        LOCAL_RANK=str(env.local_rank),
    )
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method="env://",
        rank=env.rank,
        world_size=env.world,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
