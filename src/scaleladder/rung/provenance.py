"""Where and with what a rung ran: everything a reader needs to trust or redo it."""

from __future__ import annotations

import datetime as _dt
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def git_commit() -> str:
    """The commit of the scaleladder checkout (empty when installed from a wheel)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10)
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("SCALELADDER_GIT_COMMIT", "")  # baked into container images


def hosts() -> list[str]:
    """Every rank's hostname, deduplicated in rank order (a collective: call on all ranks)."""
    names: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(names, socket.gethostname())
    return list(dict.fromkeys(n for n in names if n))


def collect(device_name: str) -> dict[str, str]:
    container = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER") or os.environ.get("SCALELADDER_IMAGE", "")
    return {
        "device_name": device_name,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "hip_version": getattr(torch.version, "hip", None) or "",
        "python_version": sys.version.split()[0],
        "git_commit": git_commit(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        "container_image": container,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def peak_attrs(device: torch.device, precision: str, peak_tflops: float | None) -> dict[str, Any]:
    """Which part the rank's device is and what peak it was credited with, as record
    attributes: ``device_sm_count`` (multiprocessors, CUs on ROCm; 0 on the CPU),
    ``device_power_limit_w`` (NaN when NVML could not say) and ``peak_note`` (why MFU is
    NaN — a MIG slice, a different part, a power cap — or what was not checked; "" when
    the table's peak applies in full). Same inputs as the runner's ``peak_flops``."""
    from scaleladder.rung.devices import peak_info

    return peak_info(device, precision, peak_tflops).attrs()
