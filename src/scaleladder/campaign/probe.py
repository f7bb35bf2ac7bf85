"""`scaleladder doctor --probe OUT`: what one tiny job sees on a compute node, per rank.

Started by ``scaleladder doctor --compute`` through the site's own launcher (srun or torchrun,
inside the image where the site uses one), so it meets every fault a rung would: the GPUs the
rank sees against those Slurm gave it, the driver against the image's CUDA/ROCm build, and the
network: a 2-rank all-reduce whose bus bandwidth says whether NCCL/RCCL found the fast network
(tens of GB/s) or fell back to TCP sockets (a few GB/s at best, usually far less); and what a
``-compile`` rung builds with (``campaign/toolchain.py``: a C extension built and imported).

Rank 0 writes one JSON object to OUT (atomically), which the doctor reads back; nothing else
is written. On the CPU the ranks use gloo, so the CI's one-node Slurm exercises the whole path.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

#: all-reduce payload: large enough to be bandwidth-bound, small enough for a 2-core CI node
PAYLOAD_BYTES = 32 * 2**20
ITERS = 5


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """NCCL-tests' bus bandwidth of an all-reduce (bytes/s): algorithm bandwidth x 2(n-1)/n,
    the traffic each link carries in a ring, so figures compare across world sizes."""
    return nbytes / seconds * 2 * (world - 1) / world if seconds > 0 and world > 1 else 0.0


def driver_versions() -> dict[str, str | None]:
    """The kernel drivers this node runs: NVIDIA's (its own file) and AMD's amdgpu module."""
    from scaleladder.rung.launch import nvidia_driver_version

    amd = None
    try:
        amd = Path("/sys/module/amdgpu/version").read_text().strip() or None
    except OSError:
        pass
    return {"nvidia_driver": nvidia_driver_version(), "amdgpu_driver": amd}


def run(out: str, want: str = "auto") -> dict[str, Any]:
    """The probe on this rank; rank 0 writes ``out`` and returns what it wrote."""
    import torch
    import torch.distributed as dist

    from scaleladder.files import atomic_file
    from scaleladder.rung.launch import detect, gpu_expected, init, slurm_gpus

    env = detect()
    seen = int(torch.cuda.device_count())
    report: dict[str, Any] = {
        "world": env.world,
        "nodes": env.nodes,
        "launcher": env.source,
        "hostname": os.uname().nodename,
        "gpus_seen": seen,
        "gpus_slurm": slurm_gpus(os.environ),
        "gpu_expected": gpu_expected(want, os.environ),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "hip_version": getattr(torch.version, "hip", None),
        "nccl_net": os.environ.get("NCCL_NET"),
        "nccl_net_plugin": os.environ.get("NCCL_NET_PLUGIN"),
        **driver_versions(),
    }
    if env.rank == 0:
        # what a -compile rung needs (a C/C++ compiler, Python.h), built with HERE: inside the
        # image, on the compute node; the login node's compilers say nothing about either
        from scaleladder.campaign.toolchain import probe as toolchain_probe

        report["toolchain"] = toolchain_probe()
    device = torch.device("cuda", env.local_rank % seen) if seen else torch.device("cpu")
    if seen:
        torch.cuda.set_device(device)
    init(env, device, timeout_s=300)
    try:
        x = torch.ones(PAYLOAD_BYTES // 4, dtype=torch.float32, device=device)
        dist.all_reduce(x)  # warm-up: connections are made on the first call
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / ITERS
        hosts: list[Any] = [None] * env.world
        dist.all_gather_object(hosts, report["hostname"])
        report |= {
            "backend": dist.get_backend(),
            "allreduce_bytes": PAYLOAD_BYTES,
            "allreduce_s": seconds,
            "busbw_gbps": bus_bandwidth(PAYLOAD_BYTES, seconds, env.world) / 1e9,
            "hosts": sorted(set(hosts)),
            # every rank added ones: the sum must be the world size, or the network corrupts data
            "allreduce_ok": bool(torch.all(x == env.world ** (ITERS + 1)).item()),
        }
    finally:
        dist.destroy_process_group()
    if env.rank == 0:
        with atomic_file(out) as tmp:
            tmp.write_text(json.dumps(report, sort_keys=True))
    return report
