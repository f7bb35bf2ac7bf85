"""Where GPUs are expected, no GPU is a one-line error naming the cause — never a CPU run
recorded as the GPU site's result.

torch >= 2.9 wheels are CUDA 13 builds: on a driver older than 580, torch.cuda.is_available()
is just False, and `--device auto` used to train on the CPU. Every branch of the diagnosis is
driven here with its inputs as parameters (environment, torch build versions, driver reader,
file test), so a machine without a GPU tests them all; the workflow half checks that the GPU
sites ask for `--device cuda` on every rung and max-batch command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import workflow_copy
from scaleladder.rung import launch
from scaleladder.rung.launch import DistEnv, NoGPUError, gpu_expected, no_gpu_cause, nvidia_driver_version, pick_device, slurm_gpus
from scaleladder.spec import SpecError
from test_profiles import dry_run, job_counts, shell_of

ONE = DistEnv(0, 1, 0, 1, "127.0.0.1", 29500, "single")


def driver(version: str | None) -> Callable[[], str | None]:
    return lambda: version


def cause(environ: dict[str, str] | None = None, cuda: str | None = "13.0", hip: str | None = None,
          drv: str | None = "580.65.06", kfd: bool = True) -> str:
    return no_gpu_cause(environ or {}, cuda, hip, driver(drv), lambda p: kfd, torch_version="2.14.1")


# -- the cause ------------------------------------------------------------------------------


def test_a_cpu_only_build_is_named() -> None:
    c = cause(cuda=None, hip=None)
    assert c.startswith("torch 2.14.1 is a CPU-only build (torch.version.cuda and torch.version.hip are both None)")


@pytest.mark.parametrize(
    "cuda,drv,floor",
    [("13.0", "535.104.05", 580), ("13.1", "575.57.08", 580), ("12.4", "470.239.06", 525), ("11.8", "440.33.01", 450)],
)
def test_a_driver_too_old_for_this_torchs_cuda_is_named(cuda: str, drv: str, floor: int) -> None:
    c = cause(cuda=cuda, drv=drv)
    assert f"the NVIDIA driver {drv} is too old for this torch's CUDA {cuda}" in c
    assert f"CUDA {cuda.split('.')[0]}.x needs driver >= {floor}" in c


@pytest.mark.parametrize("cuda,drv", [("13.0", "580.65.06"), ("12.1", "535.104.05"), ("12.8", "580.82.07"), ("11.8", "525.60.13")])
def test_a_new_enough_driver_is_not_blamed(cuda: str, drv: str) -> None:
    assert "too old" not in cause(cuda=cuda, drv=drv)


def test_no_driver_at_all_is_named() -> None:
    c = cause(drv=None)
    assert c.startswith("no NVIDIA driver found (no /proc/driver/nvidia/version, no NVML)")
    assert "--nv" in c  # the container case


@pytest.mark.parametrize("value", ["", "-1", "-1,0", "NoDevFiles"])
def test_cuda_visible_devices_hiding_everything_is_named(value: str) -> None:
    c = cause({"CUDA_VISIBLE_DEVICES": value})
    assert c.startswith(f"CUDA_VISIBLE_DEVICES={value!r} hides every device")


def test_a_visible_device_list_is_not_blamed() -> None:
    assert "hides" not in cause({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "hides" not in cause({"CUDA_VISIBLE_DEVICES": "GPU-6482a92e"})


@pytest.mark.parametrize("var", ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"])
def test_rocm_visibility_variables_are_named(var: str) -> None:
    c = cause({var: ""}, cuda=None, hip="7.0.51831")
    assert c.startswith(f"{var}='' hides every device")


def test_rocm_without_dev_kfd_is_named() -> None:
    c = cause(cuda=None, hip="7.0.51831", kfd=False)
    assert c.startswith("ROCm torch needs /dev/kfd, which is missing here") and "--rocm" in c
    assert "/dev/kfd" not in cause(cuda=None, hip="7.0.51831", kfd=True)


def test_slurm_allocated_gpus_but_the_task_sees_none() -> None:
    c = cause({"SLURM_GPUS_ON_NODE": "8"})
    assert c.startswith("Slurm allocated GPUs (SLURM_GPUS_ON_NODE=8) but none is visible to this task")
    assert "--gpus-per-task" in c
    # the step's own view hides them: both facts, in one line
    c = cause({"SLURM_JOB_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": ""})
    assert c == ("CUDA_VISIBLE_DEVICES='' hides every device; although Slurm allocated GPUs (SLURM_JOB_GPUS=0,1,2,3): "
                 "the job step got none (wrong --gpus-per-task or --gres on srun?)")


def test_causes_add_up_on_one_line() -> None:
    c = cause({"CUDA_VISIBLE_DEVICES": "-1"}, drv="535.54.03")
    assert "hides every device" in c and "too old" in c and "\n" not in c


def test_no_known_cause_still_says_what_was_checked() -> None:
    c = cause()
    assert c.startswith("torch 2.14.1 (CUDA 13.0) finds no device and no cause was found here")


@pytest.mark.parametrize(
    "text,version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
         "GCC version:  gcc version 11.4.0\n", "535.104.05"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)\n", "580.65.06"),
        ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15  Tue Mar  5 19:15:58 UTC 2024\n", "550.54.15"),
    ],
)
def test_the_driver_version_is_read_from_proc(tmp_path: Path, text: str, version: str) -> None:
    f = tmp_path / "version"
    f.write_text(text)
    assert nvidia_driver_version(str(f)) == version


# -- when GPUs are expected -------------------------------------------------------------------


@pytest.mark.parametrize(
    "environ,allocated",
    [
        ({}, None),
        ({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "16"}, None),  # a CPU job
        ({"SLURM_GPUS_ON_NODE": "0"}, None),
        ({"SLURM_GPUS_PER_TASK": "a100:0"}, None),
        ({"SLURM_GPUS_ON_NODE": ""}, None),
        ({"SLURM_GPUS_PER_TASK": "1"}, "SLURM_GPUS_PER_TASK=1"),
        ({"SLURM_GPUS_PER_TASK": "a100:4"}, "SLURM_GPUS_PER_TASK=a100:4"),
        ({"SLURM_GPUS_ON_NODE": "8"}, "SLURM_GPUS_ON_NODE=8"),
        ({"SLURM_JOB_GPUS": "0"}, "SLURM_JOB_GPUS=0"),  # GPU id 0, not zero GPUs
    ],
)
def test_which_slurm_jobs_were_allocated_gpus(environ: dict[str, str], allocated: str | None) -> None:
    assert slurm_gpus(environ) == allocated
    assert (gpu_expected("auto", environ) is not None) is (allocated is not None)


def test_cuda_always_expects_a_gpu_and_cpu_never() -> None:
    assert gpu_expected("cuda", {}) == "--device cuda was given"
    assert gpu_expected("cpu", {"SLURM_GPUS_ON_NODE": "8"}) is None


def test_device_cuda_without_a_gpu_is_a_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGPUError, match=r"^--device cuda was given, but torch sees no GPU: ") as e:
        pick_device(ONE, "cuda", environ={})
    assert isinstance(e.value, SpecError) and "\n" not in str(e.value)  # the CLI's one line, exit 2


def test_auto_in_a_slurm_gpu_job_without_a_gpu_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGPUError, match=r"^--device auto in a Slurm job that was allocated GPUs \(SLURM_GPUS_ON_NODE=4\)"):
        pick_device(ONE, "auto", environ={"SLURM_GPUS_ON_NODE": "4"})


@pytest.mark.parametrize("environ", [{}, {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "0"}])
def test_auto_without_a_gpu_and_without_slurm_gpus_still_picks_the_cpu(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device(ONE, "auto", environ=environ) == torch.device("cpu")
    assert pick_device(ONE, "cpu", environ={"SLURM_GPUS_ON_NODE": "8"}) == torch.device("cpu")


def test_auto_on_a_gpu_node_without_a_gpu_warns(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Legal outside Slurm (a workstation), but a loaded driver torch cannot use is said aloud."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(launch, "nvidia_driver_version", lambda path=launch.NVIDIA_DRIVER_FILE: "535.104.05")
    assert pick_device(ONE, "auto", environ={}) == torch.device("cpu")
    assert "warning: --device auto trains on the CPU although this node has a GPU driver" in capsys.readouterr().err


@pytest.mark.process
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_run_with_device_cuda_on_a_machine_without_gpu_exits_2_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    p = subprocess.run([sys.executable, "-m", "scaleladder", "run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b2",
                        "--steps", "3", "--warmup", "1", "--device", "cuda", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaleladder run: error: --device cuda was given, but torch sees no GPU: ")
    assert "CUDA_VISIBLE_DEVICES='' hides every device" in lines[0] or "CPU-only build" in lines[0]
    assert not out.exists()


# -- the GPU sites ask for GPUs -------------------------------------------------------------


@pytest.fixture(scope="module")
def wf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workflow_copy(tmp_path_factory.mktemp("gpu-expected") / "wf")


@pytest.mark.process
def test_frontier_rungs_run_and_finalize_with_device_cuda(wf: Path) -> None:
    rung = "results/rungs/vit-5b/fsdp-hybrid2/bf16-mixed/pre-lag/n2/b32.h5"
    cmd = shell_of(dry_run(wf, "frontier", rung, SCALELADDER_SLURM_ACCOUNT="abc123"), "rung", rung)
    assert " scaleladder run --device cuda --spec vit-5b/fsdp-hybrid2/bf16-mixed/pre-lag/n2/b32 " in cmd
    assert " finalize --rc $rc --device cuda --spec " in cmd


@pytest.mark.process
def test_a100_rungs_and_max_batch_search_run_with_device_cuda(wf: Path) -> None:
    fixed = "results/rungs/flava-2.7b/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8.h5"
    mx = "results/rungs/flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax.h5"
    out = dry_run(wf, "a100", fixed, mx)
    assert " torchrun --nnodes 1 --nproc-per-node 8 --rdzv-backend c10d " in shell_of(out, "rung", fixed)
    assert " -m scaleladder' --ranks-per-node 8 --device cuda --spec flava-2.7b/" in shell_of(out, "rung", fixed)
    # maxbatch forwards its run arguments (RunConfig.argv, --device included) to every probe
    # (a rung the site's time limit shortens says so after its device: --shortened-from)
    assert " --ranks-per-node 8 --device cuda --shortened-from 1000 --spec flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax " in shell_of(out, "rung_max", mx)


@pytest.mark.process
def test_the_local_and_ci_profiles_do_not_force_a_device(wf: Path) -> None:
    out = dry_run(wf, "local")
    assert job_counts(out)["rung"] > 0 and "--device" not in out  # auto: the runner's default
    assert "--device" not in dry_run(wf, "slurm-localhost")


@pytest.mark.process
def test_a_bad_site_device_fails_before_any_job(wf: Path) -> None:
    from conftest import snakemake

    site = wf / "profiles" / "local" / "site.yaml"
    original = site.read_text()
    try:
        site.write_text(original.replace("  device: auto", "  device: gpu"))
        bad = snakemake(wf, "--profile", "profiles/local", "-n", check=False)
    finally:
        site.write_text(original)
    assert bad.returncode != 0 and "config key 'site.device'" in bad.stdout + bad.stderr


def test_maxbatch_and_launch_forward_device_to_run() -> None:
    """`--device` reaches every `run` the supervisors start: they rebuild its argv from
    the same RunConfig."""
    import argparse

    from scaleladder.rung.run_config import add_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg = config_from_args(p.parse_args(["--spec", "vit-debug/ddp/fp32/pre-lag/n1/b2", "--device", "cuda", "--out", "x.h5"]))
    argv = cfg.argv(out=Path("probe.h5"))
    assert argv[argv.index("--device") + 1] == "cuda"
