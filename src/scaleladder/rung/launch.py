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
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from scaleladder.log import get_logger
from scaleladder.spec import SpecError

_log = get_logger(__name__)

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
    source: str  # "torchrun" | "spawn" (scaleladder spawn: torchrun's variables, no agent) | "slurm" | "single"

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
            # `scaleladder spawn` sets torchrun's variables and says so: its rank 0 hosts the store
            source="spawn" if env.get("SCALELADDER_LAUNCHER") == "spawn" else "torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and int(env["SLURM_NTASKS"]) > 1:
        world = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", 1)))
        local_world = int(env.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0] or 0) or max(1, world // nodes)
        addr = env.get("MASTER_ADDR") or first_slurm_host(env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", "localhost")))
        return DistEnv(int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", 0)), local_world, addr, port, "slurm")
    return DistEnv(0, 1, 0, 1, "127.0.0.1", port, "single")


def check_master(env: DistEnv, environ: Mapping[str, str] | None = None) -> None:
    """Bad rendezvous input as one line (a SpecError), before any process group exists.

    A launched rank's master address must resolve (under srun it is the first host of the
    job's nodelist: a name /etc/hosts or DNS does not know fails here, not after the
    600 s rendezvous timeout). Rank 0 under srun binds the store on MASTER_PORT itself, so
    it checks that no one listens there already: otherwise torch fails with a C++ trace
    (EADDRINUSE) and the other ranks wait for a store that never comes. Under torchrun the
    agent already holds the port, so it is not checked there.
    """
    if env.source == "single":
        return
    e = os.environ if environ is None else environ
    try:
        socket.getaddrinfo(env.master_addr, env.master_port, type=socket.SOCK_STREAM)
    except OSError as err:
        nodelist = e.get("SLURM_STEP_NODELIST", e.get("SLURM_JOB_NODELIST", ""))
        whence = (f" (the first host of the Slurm nodelist {nodelist!r})" if env.source == "slurm" and not e.get("MASTER_ADDR")
                  else " (MASTER_ADDR)")
        raise SpecError(f"master address {env.master_addr!r}{whence} does not resolve: {err.strerror or err}") from None
    if env.source in ("slurm", "spawn") and env.rank == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # SO_REUSEADDR as the store's own socket: a port in TIME_WAIT after the last
            # rung is free to it, only a listener holds it
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", env.master_port))
            except OSError as err:
                raise SpecError(f"master port {env.master_port} on {socket.gethostname()} is already in use ({err.strerror}): "
                                "another rung or process listens there; set MASTER_PORT in the site's env to a free port") from None


class NoGPUError(SpecError):
    """GPUs were expected (``--device cuda``, or a Slurm job that was allocated GPUs) and
    torch sees none. A SpecError, so the CLI prints it as one line and exits 2."""


# -- why torch sees no GPU ----------------------------------------------------------------
#
# TRAP: torch's PyPI wheels are CUDA 13 builds now (2.14.1+cu130). On a node whose NVIDIA
# driver is older than CUDA 13 needs, torch.cuda.is_available() is simply False, and
# `--device auto` used to train on the CPU and record that as the GPU site's result.
# Where GPUs are expected, no GPU is an error that names its cause.

# Minimum driver per CUDA major version ("CUDA minor version compatibility": any 13.x
# runtime works on a >= 580 driver, 12.x on >= 525, 11.x on >= 450). Source: NVIDIA, CUDA
# Compatibility, "Minor Version Compatibility", Table 1 "CUDA Toolkit 11.x, 12.x, and 13.x
# Driver Version Ranges" (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html).
CUDA_DRIVER_FLOORS: dict[int, int] = {13: 580, 12: 525, 11: 450}

# Slurm's variables that say the job or task was given GPUs. SLURM_GPUS_PER_TASK and
# SLURM_GPUS_ON_NODE are counts (the first may carry a type: "a100:4"); SLURM_JOB_GPUS is
# a list of GPU *ids* — "0" there is GPU number 0, not zero GPUs.
SLURM_GPU_VARS = ("SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS")
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"


def slurm_gpus(environ: Mapping[str, str]) -> str | None:
    """``VAR=value`` of the first Slurm variable saying GPUs were allocated, or None."""
    for var in SLURM_GPU_VARS:
        value = environ.get(var, "").strip()
        if not value:
            continue
        count = value.rsplit(":", 1)[-1]
        if var != "SLURM_JOB_GPUS" and count.isdigit() and int(count) == 0:
            continue
        return f"{var}={value}"
    return None


def gpu_expected(want: str, environ: Mapping[str, str]) -> str | None:
    """Why this rank must have a GPU, or None when the CPU is an acceptable answer."""
    if want == "cuda":
        return "--device cuda was given"
    if want == "auto":
        slurm = slurm_gpus(environ)
        if slurm:
            return f"--device auto in a Slurm job that was allocated GPUs ({slurm})"
    return None


def nvidia_driver_version(path: str = NVIDIA_DRIVER_FILE) -> str | None:
    """The loaded NVIDIA kernel driver's version ("580.65.06"), or None when there is none.

    /proc/driver/nvidia/version is the kernel module's own word and is visible inside
    containers; NVML (pynvml, when installed) is asked only when the file is absent.
    The file's first line reads "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05
    ..." (or "... Open Kernel Module for x86_64  580.65.06 ...").
    """
    try:
        text = Path(path).read_text()
    except OSError:
        text = ""
    m = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    if m:
        return m.group(1)
    try:
        import pynvml  # nvidia-ml-py: optional

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no pynvml, no libnvidia-ml, no driver: all "none found"
        return None


def _hides_every_device(value: str) -> bool:
    # CUDA/HIP stop at the first entry that names no device, so "" and a list that starts
    # with -1 hide them all; old Slurm sets CUDA_VISIBLE_DEVICES=NoDevFiles for a job
    # step with no GPUs.
    first = value.split(",")[0].strip()
    return first in ("", "-1") or value.strip() == "NoDevFiles"


def no_gpu_cause(
    environ: Mapping[str, str],
    cuda_version: str | None,
    hip_version: str | None,
    driver_version: Callable[[], str | None] | None = None,
    exists: Callable[[str], bool] = os.path.exists,
    torch_version: str = torch.__version__,
) -> str:
    """Why torch sees no GPU, as one line. Every input is a parameter (the environment,
    ``torch.version.cuda``/``.hip``, the driver reader — :func:`nvidia_driver_version` when
    None —, the file test), so each branch is tested on a machine without a GPU."""
    read_driver = driver_version or nvidia_driver_version
    if not cuda_version and not hip_version:
        return (f"torch {torch_version} is a CPU-only build (torch.version.cuda and torch.version.hip are both None): "
                "install a CUDA or ROCm build of torch")
    causes: list[str] = []
    names = ("CUDA_VISIBLE_DEVICES",) if cuda_version else ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    for var in names:
        if var in environ and _hides_every_device(environ[var]):
            causes.append(f"{var}={environ[var]!r} hides every device")
    slurm = slurm_gpus(environ)
    if causes and slurm:
        causes.append(f"although Slurm allocated GPUs ({slurm}): the job step got none (wrong --gpus-per-task or --gres on srun?)")
    if cuda_version:
        driver = read_driver()
        major = int(cuda_version.split(".")[0])
        floor = CUDA_DRIVER_FLOORS.get(major)
        if driver is None:
            causes.append(f"no NVIDIA driver found (no {NVIDIA_DRIVER_FILE}, no NVML): not a GPU node, or the container "
                          "does not see the driver (apptainer --nv, docker --gpus)")
        elif floor is not None and int(driver.split(".")[0]) < floor:
            causes.append(f"the NVIDIA driver {driver} is too old for this torch's CUDA {cuda_version}: CUDA {major}.x needs "
                          f"driver >= {floor} (update the driver, or install a torch built for an older CUDA)")
    elif not exists("/dev/kfd"):
        causes.append("ROCm torch needs /dev/kfd, which is missing here (docker: --device /dev/kfd --device /dev/dri; "
                      "apptainer: --rocm)")
    if not causes and slurm:
        causes.append(f"Slurm allocated GPUs ({slurm}) but none is visible to this task (wrong --gpus-per-task or --gres, "
                      "or a container without --nv/--rocm?)")
    if not causes:
        build = f"CUDA {cuda_version}" if cuda_version else f"ROCm {hip_version}"
        causes.append(f"torch {torch_version} ({build}) finds no device and no cause was found here: check nvidia-smi or rocm-smi")
    return "; ".join(causes)


def pick_device(env: DistEnv, want: str = "auto", environ: Mapping[str, str] | None = None) -> torch.device:
    """One GPU per rank (CUDA and ROCm both appear as 'cuda'), else the CPU.

    The CPU only where it is an acceptable answer: ``--device cpu``, or ``--device auto``
    outside a Slurm job that was allocated GPUs. Where GPUs are expected and torch sees
    none, :class:`NoGPUError` names the cause (:func:`no_gpu_cause`).
    """
    if want == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        env_vars = os.environ if environ is None else environ
        expected = gpu_expected(want, env_vars)
        # A GPU node (a driver is loaded) where `auto` falls back to the CPU is legal
        # outside Slurm, but never silent.
        gpu_node = nvidia_driver_version() is not None or os.path.exists("/dev/kfd")
        if expected or gpu_node:
            why = no_gpu_cause(env_vars, torch.version.cuda, getattr(torch.version, "hip", None))
            if expected:
                raise NoGPUError(f"{expected}, but torch sees no GPU: {why}")
            _log.warning(f"scaleladder: warning: --device auto trains on the CPU although this node has a GPU driver: {why}")
        return torch.device("cpu")
    # With --gpus-per-task=1 (Frontier) each rank sees exactly one device: index 0.
    index = env.local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init(env: DistEnv, device: torch.device, timeout_s: int = 600) -> None:
    """Start the process group: NCCL (RCCL on ROCm) on GPUs, gloo on the CPU.

    Always ``env://``: under torchrun the workers must join the agent's store
    (TORCHELASTIC_USE_AGENT_STORE); a ``tcp://`` URL would make rank 0 bind the
    port torchrun already holds. A single process is still a real one-rank group,
    so rung/parallelize.py never special-cases "no process group".
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
