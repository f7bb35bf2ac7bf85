"""Where and with what a rung ran: everything a reader needs to trust or redo it."""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaleladder.gitinfo import git_commit  # git (-dirty), else the image's SCALELADDER_GIT_COMMIT, else ""
from scaleladder.results.record import Placement, Provenance


def hosts() -> list[str]:
    """Every rank's hostname, deduplicated in rank order (a collective: call on all ranks)."""
    names: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return list(dict.fromkeys(n for n in names if n))


def local_address(master_addr: str, master_port: int) -> str:
    """The address this host uses to reach the master: the source address of a UDP socket
    "connected" to it (no packet is sent). On one machine it is 127.0.0.1; across nodes it
    is this node's own address on the network the ranks share. "" when the master does not
    resolve (checked before the group exists: launch.check_master)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, master_port))
            return str(s.getsockname()[0])
    except OSError:
        return ""


def node_index(env: Any, environ: Mapping[str, str] | None = None) -> int | None:
    """This rank's node index as its launcher numbers nodes: SLURM_NODEID under srun,
    GROUP_RANK (torchrun's node rank) under torchrun; None when neither says."""
    e = os.environ if environ is None else environ
    value = e.get("GROUP_RANK") if env.source == "torchrun" else e.get("SLURM_NODEID")
    if value is None and env.source == "torchrun":
        value = e.get("SLURM_NODEID")  # `srun torchrun`: torchrun's agent is one task per node
    return int(value) if value is not None and value.strip().isdigit() else None


def rank_placement(env: Any) -> dict[str, Any]:
    """Where every rank ran (a collective: call on all ranks), as record attributes:
    ``rank_placement``, one ``{rank, host, addr, node, local_rank}`` per rank in rank order,
    and the rendezvous used: ``master_host`` (as the launcher named it), ``master_addr``
    (what it resolved to here) and ``master_port``. ``node`` is the launcher's node index;
    where no launcher said, hosts are numbered in order of their first rank."""
    try:
        master_addr = socket.gethostbyname(env.master_addr)
    except OSError:
        master_addr = ""
    mine = {"rank": env.rank, "host": socket.gethostname(), "addr": local_address(master_addr or env.master_addr, env.master_port),
            "node": node_index(env), "local_rank": env.local_rank}
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    order = list(dict.fromkeys(r["host"] for r in ranks))
    for r in ranks:
        if r["node"] is None:
            r["node"] = order.index(r["host"])
    return {Placement.rank_placement: ranks, Placement.master_host: env.master_addr, Placement.master_addr: master_addr,
            Placement.master_port: env.master_port}


def collect(device_name: str) -> dict[str, str]:
    """The software and job a record was made with (results/record.py, Provenance)."""
    container = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER") or os.environ.get("SCALELADDER_IMAGE", "")
    p = Provenance
    return {
        Placement.device_name: device_name,
        p.torch_version: torch.__version__,
        p.cuda_version: torch.version.cuda or "",
        p.hip_version: getattr(torch.version, "hip", None) or "",
        p.python_version: sys.version.split()[0],
        p.git_commit: git_commit(),
        p.slurm_job_id: os.environ.get("SLURM_JOB_ID", ""),
        p.container_image: container,
        p.created_utc: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        p.command: shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def peak_attrs(device: torch.device, precision: str, peak_tflops: float | None) -> dict[str, Any]:
    """Which part the rank's device is and what peak it was credited with, as record
    attributes: ``device_sm_count`` (multiprocessors, CUs on ROCm; 0 on the CPU),
    ``device_power_limit_w`` (NaN when NVML could not say) and ``peak_note`` (why MFU is
    NaN — a MIG slice, a different part, a power cap — or what was not checked; "" when
    the table's peak applies in full). Same inputs as the runner's ``rank_device_peak_flops``."""
    from scaleladder.rung.device_peak import peak_info

    return peak_info(device, precision, peak_tflops).attrs()
