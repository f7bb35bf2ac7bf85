"""The machine: what the environment probe (a child process, the only one that asks torch) reports,
the driver, the commit, and which planner device this GPU is."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder.gitinfo import commit_and_source

from .config import GIB, REPO

if TYPE_CHECKING:
    from .runner import Check

# Run in a child: this driver never touches the GPU itself (see gpu_check.py's docstring).
_PROBE = r"""
import json, os, platform, sys
import torch
import scaleladder
d = {"torch": torch.__version__, "cuda": torch.version.cuda or "", "hip": getattr(torch.version, "hip", None) or "",
     "python": platform.python_version(), "gpu": torch.cuda.is_available(),
     "scaleladder_from": os.path.dirname(scaleladder.__file__)}
if sys.argv[1] == "cuda" and torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    d.update(name=torch.cuda.get_device_name(0), total_bytes=int(p.total_memory), count=torch.cuda.device_count(),
             capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count)
print("PROBE " + json.dumps(d))
"""
#: What `make gpu-wheels` writes beside the wheels: the commit they were built from.
WHEEL_STAMP = REPO / ".whl" / "COMMIT"


def probe_env(c: Check) -> None:
    """Fill ``c.env_info`` (device, versions, commit, host, date) and pick the planner device."""
    cmd = c.sh("probe", [sys.executable, "-c", _PROBE, c.device], 300)
    m = re.search(r"^PROBE (.*)$", cmd.tail(), re.MULTILINE)
    if cmd.rc != 0 or not m:
        raise SystemExit(f"gpu-check: the environment probe failed: {cmd.last_line()} (see {cmd.log})")
    info: dict[str, Any] = json.loads(m.group(1))
    if c.device == "cuda" and not info.get("gpu"):
        raise SystemExit("gpu-check: --device cuda, but torch sees no GPU (use --device cpu for the CPU form)")
    commit, commit_from = tree_commit()
    # provenance.git_commit falls back to this variable where the package has no .git. When the
    # package is the wheel from .whl/ (not this tree's src/), the code that runs is the wheel's:
    # its records must name the commit it was built from, which may not be the tree's.
    if not Path(str(info["scaleladder_from"])).resolve().is_relative_to(REPO) and WHEEL_STAMP.is_file():
        info["wheel_commit"] = WHEEL_STAMP.read_text().strip()
    c.child_env["SCALELADDER_GIT_COMMIT"] = str(info.get("wheel_commit", commit))
    info.update(commit=commit, commit_from=commit_from, host=socket.gethostname(), cores=cores(),
                date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    if c.device == "cuda":
        info["driver"] = driver_version(bool(info.get("hip")))
        c.plan_args, c.plan_key, info["plan_device"] = plan_device_args(str(info["name"]), int(info["total_bytes"]))
    else:
        info.update(name=f"cpu ({cpu_model()})", driver="n/a (CPU)", plan_device="cpu (no capacity)")
    c.env_info = info
    print(f"gpu-check: {info['name']}, torch {info['torch']}, commit {commit}", flush=True)


def tree_commit() -> tuple[str, str]:
    """(commit, where it came from). The GPU machine may hold a copy of the tree without .git:
    then the commit `make gpu-wheels` wrote beside the wheels is the best there is."""
    commit, source = commit_and_source(REPO, WHEEL_STAMP, ".whl/COMMIT (the tree the wheels were built from)")
    return (commit, source) if commit else ("unknown", "no git, no SCALELADDER_GIT_COMMIT, no .whl/COMMIT")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def driver_version(hip: bool) -> str:
    """The GPU driver's version from the vendor tool (empty when there is none)."""
    try:
        if not hip:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        p = Path("/sys/module/amdgpu/version")
        if p.is_file():
            return "amdgpu " + p.read_text().strip()
        out = subprocess.run(["rocm-smi", "--showdriverversion"], capture_output=True, text=True, timeout=30)
        m = re.search(r"Driver version:\s*(\S+)", out.stdout)
        return m.group(1) if m else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def plan_device_args(name: str, total_bytes: int | None) -> tuple[list[str], str | None, str]:
    """(`scaleladder plan` device arguments, the key for `maxbatch --plan-device` or None, a description).

    A table entry only when the chip matches AND its capacity is within 5% of what torch
    reports: an H100 NVL (94 GB) or an H100 with memory taken by MIG is not `h100-80gb`.
    Any other GPU is planned as a custom device of its measured size (`--device-gib`).
    """
    from scaleladder.site.plan import DEVICES

    if total_bytes is None:
        return ["--device", "cpu"], "cpu", "cpu (no capacity: nothing is predicted not to fit)"
    low = name.lower()
    for key, cap in DEVICES.items():
        if cap and key.split("-")[0] in low and abs(cap - total_bytes) <= 0.05 * cap:
            return ["--device", key], key, f"{key} (the planner's table; torch reports {total_bytes / GIB:.1f} GiB)"
    gib = f"{total_bytes / GIB:.2f}"
    return (["--device", "this-gpu", "--device-gib", gib], None,
            f"custom, {gib} GiB as torch reports it (no table entry matches {name!r})")
