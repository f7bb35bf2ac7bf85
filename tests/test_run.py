"""`scaleladder run` / `launch` end to end on the CPU: the record, bad input, OOM, interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from scaleladder.launch import detect, first_slurm_host

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "scaleladder"]


def sl(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scaleladder", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_record_schema(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "flava-debug/single/fp32/pre-lag/n1/b10", "--steps", "5", "--warmup", "2", "--out", str(out))
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        a = f.attrs
        assert a["status"] == "ok" and a["spec"] == "flava-debug/single/fp32/pre-lag/n1/b10"
        for key in ["model", "strategy", "precision", "knobs", "nodes", "batch", "steps", "warmup", "world_size", "params",
                    "fsdp_units", "ac_layers", "device_name", "torch_version", "cuda_version", "hip_version", "hosts",
                    "git_commit", "slurm_job_id", "container_image", "items_per_s", "samples_per_s", "mfu", "hfu",
                    "peak_active_gib", "peak_reserved_gib", "alloc_retries", "ooms", "flops_per_sample"]:
            assert key in a, key
        assert f["step_time_s"].shape == (5,) and f["loss"].shape == (5,)
        assert f["memory/peak_active_bytes"].shape == (1,) and f["memory/num_alloc_retries"].shape == (1,)
        assert np.all(f["step_time_s"][:] > 0) and np.all(np.isfinite(f["loss"][:]))
        # FLAVA items = image + text per sample; throughput counts the measured window only
        assert a["items_per_s"] == pytest.approx(2 * a["samples_per_s"])
        assert a["samples_per_s"] == pytest.approx(10 * 3 / a["window_s"])
        assert np.isnan(a["mfu"])  # no peak FLOP/s for a CPU: never a made-up number
    assert list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize(
    "args,culprit",
    [
        (["--model", "vit-nope", "--strategy", "ddp", "--batch", "4"], "vit-nope"),
        (["--model", "vit-debug", "--strategy", "zero3", "--batch", "4"], "zero3"),
        (["--model", "vit-debug", "--strategy", "ddp", "--batch", "0"], "batch"),
        (["--model", "vit-debug", "--strategy", "fsdp-hybrid2", "--batch", "4"], "does not divide"),
        (["--model", "vit-debug", "--strategy", "single", "--batch", "4", "--nodes", "2"], "n2"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--warmup", "5", "--steps", "5"], "warmup"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--data", "nowhere/manifest.json"], "nowhere"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/bmax"], "maxbatch"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--model", "vit-debug"], "either"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_no_file(tmp_path: Path, args: list[str], culprit: str) -> None:
    out = tmp_path / "x.h5"
    p = sl("run", *args, "--out", str(out), "--steps", "3", "--warmup", "1") if "--steps" not in args else sl("run", *args, "--out", str(out))
    assert p.returncode == 2, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and culprit in lines[0], p.stderr
    assert not list(tmp_path.iterdir())


def test_unknown_command_and_out_suffix(tmp_path: Path) -> None:
    assert sl("nonsense").returncode == 2
    p = sl("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--out", str(tmp_path / "x.txt"))
    assert p.returncode == 2 and ".h5" in p.stderr


def test_oom_in_one_process_is_a_result(tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    p = sl("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "4", "--warmup", "1", "--out", str(out),
           env={"SCALELADDER_INJECT_OOM": "0:2"})
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        assert f.attrs["status"] == "oom" and f.attrs["oom_step"] == 2 and "injected" in f.attrs["error"]
        assert "items_per_s" not in f.attrs


@pytest.mark.slow
def test_oom_on_one_rank_of_two_is_recorded_by_the_supervisor(tmp_path: Path) -> None:
    out = tmp_path / "o.h5"
    launcher = " ".join(TORCHRUN)
    p = sl("launch", "--launcher", launcher, "--spec", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", "--steps", "4",
           "--warmup", "1", "--out", str(out), env={"SCALELADDER_INJECT_OOM": "1:2"})
    assert p.returncode == 0, p.stderr[-2000:]
    with h5py.File(out) as f:
        assert f.attrs["status"] == "oom" and f.attrs["oom_step"] == 2 and f.attrs["world_size"] == 2
        assert f.attrs["oom_ranks"] == "[1]" and "injected" in f.attrs["error"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["o.h5"]  # markers cleaned up


@pytest.mark.slow
def test_launch_ok_and_failure_paths(tmp_path: Path) -> None:
    out = tmp_path / "ok.h5"
    p = sl("launch", "--launcher", " ".join(TORCHRUN), "--spec", "vit-debug/ddp/fp32/pre-lag/n1/b2", "--steps", "3",
           "--warmup", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert h5py.File(out).attrs["world_size"] == 2
    bad = tmp_path / "bad.h5"
    p = sl("launch", "--launcher", "false", "--spec", "vit-debug/ddp/fp32/pre-lag/n1/b2", "--out", str(bad))
    assert p.returncode != 0 and "no result written" in p.stderr
    assert not bad.exists()


def test_sigterm_leaves_no_partial_output(tmp_path: Path) -> None:
    out = tmp_path / "t.h5"
    proc = subprocess.Popen([sys.executable, "-m", "scaleladder", "run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4",
                             "--steps", "100000", "--warmup", "1", "--out", str(out)], stderr=subprocess.PIPE, text=True)
    time.sleep(12)  # past start-up, inside the loop
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)  # what Slurm sends at a time limit
    rc = proc.wait(timeout=60)
    assert rc != 0
    assert not list(tmp_path.iterdir())


def test_rank_variables_from_torchrun_slurm_or_nothing() -> None:
    t = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"})
    assert (t.rank, t.world, t.local_rank, t.nodes, t.master_addr, t.master_port, t.source) == (3, 8, 1, 2, "n1", 29500, "torchrun")
    s = detect({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_JOB_NUM_NODES": "2",
                "SLURM_NTASKS_PER_NODE": "8(x2)", "SLURM_JOB_NODELIST": "frontier[00012-00013]", "MASTER_ADDR": "frontier00012"})
    assert (s.rank, s.world, s.local_rank, s.local_world, s.nodes, s.master_port, s.source) == (9, 16, 1, 8, 2, 3442, "slurm")
    assert detect({}).source == "single" and detect({}).world == 1


def test_first_slurm_host_without_scontrol() -> None:
    assert first_slurm_host("frontier[00012-00015,00020]") in ("frontier00012",)
    assert first_slurm_host("nodeA,nodeB") == "nodeA"
