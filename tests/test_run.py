"""`scaleladder run` / `launch` end to end on the CPU: the record, bad input, OOM, interruption."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import in_process
from scaleladder.cli import build_parser
from scaleladder.flavors import get_flavor
from scaleladder.models.build import build_model, count_parameters
from scaleladder.rung.launch import detect, first_slurm_host

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "scaleladder"]


def sl(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scaleladder", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def assert_bad_input(p: subprocess.CompletedProcess[str], culprit: str, folder: Path) -> None:
    """Exit 2, one line naming the culprit, and nothing written."""
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and culprit in lines[0], p.stderr
    assert not list(folder.iterdir())


@pytest.mark.process
def test_record_schema(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "flava-debug/single/fp32/pre-lag/n1/b10", "--steps", "5", "--warmup", "2", "--out", str(out))
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        a = f.attrs
        assert a["status"] == "ok" and a["spec"] == "flava-debug/single/fp32/pre-lag/n1/b10"
        for key in ["model", "strategy", "precision", "knobs", "nodes", "batch", "steps", "warmup", "world_size", "params",
                    "ranks_per_node", "gpus_per_node", "fsdp_units", "fsdp_layer_units", "ac_layers", "device_name",
                    "torch_version", "cuda_version", "hip_version", "hosts",
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
        assert a["ranks_per_node"] == 1 and a["gpus_per_node"] == 0  # a CPU rank owns no GPU
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
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--seed", "abc"], "seed"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--seed", "-1"], "seed"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--workers", "x"], "workers"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--data", "."], "no manifest.json"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--codebook-weights", "nowhere.pt"], "nowhere.pt"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--peak-tflops", "0"], "peak-tflops"),
        (["--spec", "vit-debug/fsdp-hybrid02/fp32/pre-lag/n1/b4"], "'fsdp-hybrid2'"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n01/b4"], "'n1'"),
        (["--model", "vit-debug", "--strategy", "fsdp-hybrid01", "--batch", "4"], "not canonical"),
        # FSDP2 and compile
        (["--spec", "vit-debug/fsdp2-full/fp32/pre-lag/n1/b4"], "FSDP1 knobs 'pre-lag' given for FSDP2"),
        (["--model", "vit-debug", "--strategy", "fsdp-full", "--knobs", "pf1", "--batch", "4"], "FSDP2 knobs 'pf1'"),
        (["--spec", "vit-debug/fsdp-full-compile/fp32/pre-lag/n1/b4"], "not offered with FSDP1"),
        (["--spec", "vit-debug/single-compile/fp32/pre-lag/n1/b4", "--steps", "3", "--warmup", "0"], "--warmup >= 1"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--compile-backend", "aot_eager"], "--compile-backend applies"),
        # -sac where it cannot go, a knob the wrapper does not have
        (["--spec", "vit-debug/ddp-ac-sac/fp32/pre-lag/n1/b4"], "one form of activation checkpointing at most"),
        (["--spec", "vit-debug/single-sac/fp32/pf1/n1/b4"], "FSDP knobs 'pf1' given for non-FSDP strategy 'single-sac'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line_and_no_file(tmp_path: Path, args: list[str], culprit: str) -> None:
    out = tmp_path / "x.h5"
    p = in_process("run", *args, "--out", str(out), "--steps", "3", "--warmup", "1") if "--steps" not in args else in_process("run", *args, "--out", str(out))
    assert_bad_input(p, culprit, tmp_path)


@pytest.mark.process
def test_unknown_command_and_out_suffix(tmp_path: Path) -> None:
    assert sl("nonsense").returncode == 2
    p = sl("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--out", str(tmp_path / "x.txt"))
    assert p.returncode == 2 and ".h5" in p.stderr


@pytest.mark.process
@pytest.mark.parametrize("kind", ["", ":cublas", ":nccl", ":rccl"])
def test_oom_in_one_process_is_a_result(tmp_path: Path, kind: str) -> None:
    # ":cublas": the RuntimeError cuBLAS raises when it cannot allocate, not a torch.OutOfMemoryError;
    # ":nccl"/":rccl": the communicator's own OOM, whose first line names no memory
    out = tmp_path / "o.h5"
    p = sl("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "4", "--warmup", "1", "--out", str(out),
           env={"SCALELADDER_INJECT_OOM": f"0:2{kind}"})
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        a = f.attrs
        assert a["status"] == "oom" and a["oom_step"] == 2 and "injected" in a["error"]
        assert kind in ("", ":cublas") or "failure" in a["error"] and "out of memory" in a["error"]
        assert "items_per_s" not in a
        # an OOM is a result: the same provenance as an ok record
        assert a["params"] == count_parameters(build_model(get_flavor("vit-debug"), "meta"))
        assert a["device_name"].startswith("cpu") and json.loads(a["hosts"]) == [socket.gethostname()]
        assert a["ranks_per_node"] == 1 and a["gpus_per_node"] == 0 and a["world_size"] == 1 and a["launcher"] == "single"
    assert list(tmp_path.iterdir()) == [out]


@pytest.mark.process
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
        assert f.attrs["ranks_per_node"] == 2 and f.attrs["gpus_per_node"] == 0 and f.attrs["launcher"] == "torchrun"
        assert json.loads(f.attrs["hosts"]) == [socket.gethostname()] and f.attrs["device_name"].startswith("cpu")
        assert f.attrs["params"] > 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["o.h5"]  # markers cleaned up


@pytest.mark.process
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


@pytest.mark.process
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
    assert (s.rank, s.world, s.local_rank, s.local_world, s.nodes, s.master_port, s.source) == (9, 16, 1, 8, 2, 29500, "slurm")
    assert detect({}).source == "single" and detect({}).world == 1


@pytest.mark.process
def test_first_slurm_host_without_scontrol() -> None:
    assert first_slurm_host("frontier[00012-00015,00020]") in ("frontier00012",)
    assert first_slurm_host("nodeA,nodeB") == "nodeA"


@pytest.mark.parametrize(
    "args,culprit",
    [
        # known before any rank starts: one line, exit 2, instead of a traceback per rank
        (["--spec", "vit-debug/fsdp-hybrid3/fp32/pre-lag/n1/b2", "--ranks-per-node", "2"], "hybrid group 3 does not divide the world size 2"),
        (["--spec", "vit-debug/single/fp32/pre-lag/n1/b2", "--ranks-per-node", "2"], "one process"),
        (["--spec", "vit-debug/ddp/fp32/pre-lag/n1/b2", "--ranks-per-node", "0"], "ranks-per-node"),
        # the planner must not silently assume one rank per node
        (["--spec", "vit-debug/ddp/fp32/pre-lag/n1/b2", "--plan-device", "a100-40gb"], "needs --ranks-per-node"),
        (["--spec", "vit-debug/fsdp-hybrid2/fp32/pre-lag/n1/b2", "--launcher", ""], "hybrid group 2 does not divide the world size 1"),
    ],
)
def test_launch_checks_the_world_before_starting_ranks(tmp_path: Path, args: list[str], culprit: str) -> None:
    out = tmp_path / "x.h5"
    launcher = [] if "--launcher" in args else ["--launcher", "false"]  # `false`: any launch would fail differently
    p = in_process("launch", *launcher, *args, "--out", str(out))
    assert_bad_input(p, culprit, tmp_path)


@pytest.mark.process
@pytest.mark.slow
def test_a_world_fault_under_torchrun_is_one_line_from_rank_0(tmp_path: Path) -> None:
    p = subprocess.run([*TORCHRUN, "run", "--spec", "vit-debug/fsdp-hybrid3/fp32/pre-lag/n1/b2", "--out", str(tmp_path / "x.h5")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("scaleladder run:")]
    assert ours == ["scaleladder run: error: hybrid group 3 does not divide the world size 2"], p.stderr
    assert "exitcode  : 2" in p.stderr  # what the ranks returned: bad input, not a crash
    assert not list(tmp_path.iterdir())


def _args(command: str, *argv: str) -> object:
    parser, _ = build_parser([command])
    return parser.parse_args([command, *argv])


def test_finalize_turns_markers_into_an_oom_record(tmp_path: Path) -> None:
    from scaleladder.campaign.supervise import finalize_main
    from scaleladder.rung.oom_record import oom_marker

    out = tmp_path / "r.h5"
    where = {"device_name": "NVIDIA H100 80GB HBM3", "hosts": ["n1", "n2"], "ranks_per_node": 2, "gpus_per_node": 2, "launcher": "slurm"}
    for rank, step in ((3, 5), (1, 4)):
        oom_marker(out, rank).write_text(json.dumps({"rank": rank, "world": 4, "step": step, "error": f"CUDA out of memory on {rank}",
                                                     "host": "n2" if rank > 1 else "n1", **where}))
    out.write_bytes(b"rank 0 finished before rank 1 ran out")  # the OOM wins over a result written first
    args = _args("finalize", "--spec", "vit-debug/fsdp-full/bf16-mixed/pre-lag/n2/b8", "--rc", "3", "--out", str(out))
    assert finalize_main(args) == 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.h5"]  # markers removed
    with h5py.File(out) as f:
        a = f.attrs
        assert a["status"] == "oom" and a["world_size"] == 4 and a["oom_step"] == 4 and a["error"] == "CUDA out of memory on 1"
        assert json.loads(a["oom_ranks"]) == [1, 3]
        assert a["device_name"] == "NVIDIA H100 80GB HBM3" and json.loads(a["hosts"]) == ["n1", "n2"]
        assert a["ranks_per_node"] == 2 and a["gpus_per_node"] == 2 and a["launcher"] == "slurm"
        assert a["params"] == count_parameters(build_model(get_flavor("vit-debug"), "meta"))
        assert a["spec"] == "vit-debug/fsdp-full/bf16-mixed/pre-lag/n2/b8"


def test_finalize_without_markers_keeps_or_refuses(tmp_path: Path) -> None:
    from scaleladder.campaign.supervise import finalize_main

    out = tmp_path / "r.h5"
    spec = ["--spec", "vit-debug/ddp/fp32/pre-lag/n1/b8", "--out", str(out)]
    assert finalize_main(_args("finalize", *spec, "--rc", "0")) == 1  # exit 0 but no file: not a result
    out.write_bytes(b"partial")
    assert finalize_main(_args("finalize", *spec, "--rc", "7")) == 7 and not out.exists()


def test_data_may_be_the_shard_directory(tmp_path: Path) -> None:
    from scaleladder.rung.run_config import config_from_args

    (tmp_path / "manifest.json").write_text("{}")  # the loader reads it; the CLI only finds it
    cfg = config_from_args(_args("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--data", str(tmp_path), "--out", "x.h5"))
    assert cfg.data == str(tmp_path) and cfg.seed == 0 and cfg.workers == 4


@pytest.mark.process
@pytest.mark.slow
def test_meta_init_with_codebook_weights_runs(tmp_path: Path) -> None:
    import torch

    weights = tmp_path / "dalle.pt"
    torch.save(build_model(get_flavor("flava-debug")).flava.image_codebook.encoder.state_dict(), weights)
    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "flava-debug/fsdp-full/fp32/pre-lag/n1/b10", "--steps", "3", "--warmup", "1", "--init", "meta",
           "--codebook-weights", str(weights), "--out", str(out))
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        # 5 layer units, the codebook's, the root, and FLAVA's 5 frozen heads and poolers (FSDP1,
        # use_orig_params=False: each an all-frozen unit of its own, rung/parallelize.py)
        assert f.attrs["init"] == "meta" and f.attrs["fsdp_layer_units"] == 5 and f.attrs["fsdp_units"] == 12


@pytest.mark.process
def test_a_rung_on_shards_records_its_tokenizer(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    p = sl("shard", "--out", str(shards), "--samples", "24", "--per-shard", "8", "--image-size", "64", "--quiet")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "flava-debug/single/fp32/pre-lag/n1/b4", "--steps", "3", "--warmup", "1",
           "--data", str(shards / "manifest.json"), "--workers", "0", "--out", str(out))
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        assert f.attrs["data"] == str(shards / "manifest.json")
        assert 0 < f.attrs["tokenizer_vocab_size"] <= get_flavor("flava-debug").vocab_size


def test_launch_plan_only_needs_a_device(tmp_path: Path) -> None:
    p = in_process("launch", "--plan-only", "--ranks-per-node", "8", "--spec", "vit-base/ddp/bf16-mixed/pre-lag/n1/b8",
                   "--out", str(tmp_path / "r.h5"))
    assert_bad_input(p, "--plan-only needs --plan-device", tmp_path)


@pytest.mark.parametrize("spec,recorded", [
    ("flava-10b/ddp/bf16-mixed/pre-lag/n1/b8", True),  # 10B replicated on a 40 GB A100: never
    ("flava-10b/ddp/bf16-mixed/pre-lag/n1/bmax", True),  # not even batch 1: the max rung too
    ("vit-base/ddp/bf16-mixed/pre-lag/n1/b8", False),  # fits: --plan-only refuses to record it
])
def test_launch_plan_only_records_the_planners_verdict(tmp_path: Path, spec: str, recorded: bool) -> None:
    out = tmp_path / "r.h5"
    p = in_process("launch", "--plan-only", "--plan-device", "a100-40gb", "--ranks-per-node", "8", "--spec", spec,
                   "--launcher", "false", "--out", str(out))
    if recorded:
        assert p.returncode == 0, p.stderr
        with h5py.File(out) as f:
            assert f.attrs["status"] == "predicted-oom" and f.attrs["plan_device"] == "a100-40gb"
            assert f.attrs["world_size"] == 8 and f.attrs["gpus_per_node"] == 8
            assert f.attrs["predicted_required_gib"] > 39.59
            assert f.attrs.get("max_batch", -1) == (0 if spec.endswith("bmax") else -1)
    else:
        assert_bad_input(p, "predicted to fit", tmp_path)


# -- FSDP2 and compiled rungs from the CLI ------------------------------------------


@pytest.mark.process
def test_an_fsdp2_rung_records_its_units_and_knobs(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "vit-debug/fsdp2-full/fp32/pf1/n1/b4", "--steps", "3", "--warmup", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        a = f.attrs
        assert a["status"] == "ok" and a["wrapper"] == "fsdp2" and a["knobs"] == "pf1" and a["knob_prefetch_layers"] == 1
        assert a["fsdp_layer_units"] == 2 and a["fsdp_units"] == 3  # each layer, and the root
        # read from the wrapped model; FSDP2 on one rank shards over 1 rank
        assert a["sharding_ran"] == "fsdp2:shard1:reshard" and a["param_shard_fraction"] == 1.0
        assert a["compile"] == False and a["compile_backend"] == "" and "compile_s" not in a  # noqa: E712
    # --strategy without --knobs takes the generation's default
    out2 = tmp_path / "r2.h5"
    p = sl("run", "--model", "vit-debug", "--strategy", "fsdp2-grad-op-ac", "--batch", "4", "--steps", "2", "--warmup", "1",
           "--out", str(out2))
    assert p.returncode == 0, p.stderr
    with h5py.File(out2) as f:
        assert f.attrs["spec"] == "vit-debug/fsdp2-grad-op-ac/fp32/pf0/n1/b4" and f.attrs["ac_layers"] == 2
        assert f.attrs["sharding_ran"] == "fsdp2:shard1:keep"
    # FSDP1 at world size 1 is NO_SHARD whatever the spec asked (torch switches with a warning)
    out3 = tmp_path / "r3.h5"
    p = sl("run", "--spec", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", "--steps", "2", "--warmup", "1", "--out", str(out3))
    assert p.returncode == 0, p.stderr
    with h5py.File(out3) as f:
        assert f.attrs["sharding"] == "full" and f.attrs["sharding_ran"] == "fsdp1:NO_SHARD"


def _compiled_record(out: Path, layers: int, units: int) -> None:
    with h5py.File(out) as f:
        a = f.attrs
        assert a["status"] == "ok" and a["compile"] == True and a["compile_backend"] == "inductor"  # noqa: E712
        assert a["compiled_layers"] == layers and a["fsdp_units"] == units and a["compile_graphs"] >= 1
        steps = f["step_time_s"][:]
        w = int(a["warmup"])
        # compile_s: the warm-up's time beyond steady state (rung/loop.py), max over ranks,
        # so at least this rank's; and never in the window that throughput is taken over
        assert a["compile_s"] >= steps[:w].sum() - w * np.median(steps[w:]) - 1e-9
        assert a["compile_s"] > 0.5 * steps[:w].sum()  # the first step is mostly compiling
        assert a["samples_per_s"] == pytest.approx(int(a["batch"]) * a["world_size"] * (len(steps) - w) / a["window_s"])
        assert a["window_s"] < steps.sum() - 0.5 * steps[0]  # the window starts after the compiling step


@pytest.mark.process
@pytest.mark.slow
def test_a_compiled_rung_runs_from_the_cli_in_one_process(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "vit-debug/single-ac-compile/fp32/pre-lag/n1/b4", "--steps", "4", "--warmup", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    _compiled_record(out, layers=2, units=0)
    with h5py.File(out) as f:
        assert f.attrs["ac_layers"] == 2


@pytest.mark.process
@pytest.mark.slow
def test_a_compiled_fsdp2_rung_runs_under_torchrun(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    p = subprocess.run([*TORCHRUN, "run", "--spec", "vit-debug/fsdp2-full-ac-compile/fp32/pf1/n1/b4", "--steps", "4",
                        "--warmup", "1", "--out", str(out)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    _compiled_record(out, layers=2, units=3)
    with h5py.File(out) as f:
        assert f.attrs["world_size"] == 2 and f.attrs["fsdp_layer_units"] == 2 and f.attrs["knobs"] == "pf1"
        assert np.all(np.isfinite(f["loss"][:]))


@pytest.mark.parametrize("spec", ["vit-base/ddp-compile/bf16-mixed/pre-lag/n1/b8", "vit-base/fsdp2-full-compile/bf16-mixed/pf0/n1/b8"])
def test_the_planner_says_in_one_line_what_it_does_not_model(tmp_path: Path, spec: str) -> None:
    # `plan` gives a compiled rung its eager rung's memory, said to be an upper bound ...
    p = in_process("plan", "--spec", spec, "--device", "a100-40gb")
    assert p.returncode == 0 and "upper bound" in p.stdout, p.stderr
    # ... which is no verdict to record a rung as predicted-oom by: --plan-only refuses, one line
    p = in_process("launch", "--plan-only", "--plan-device", "a100-40gb", "--ranks-per-node", "8", "--spec", spec,
                   "--launcher", "false", "--out", str(tmp_path / "r.h5"))
    assert_bad_input(p, "only an upper bound", tmp_path)


@pytest.mark.process
def test_a_trace_of_steps_after_warmup_is_written_beside_the_record_and_named(tmp_path: Path) -> None:
    # torch.profiler works on the CPU; the allocator snapshot is refused in one line
    import json

    out = tmp_path / "r.h5"
    p = sl("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "4", "--warmup", "1", "--trace-steps", "2",
           "--device", "cpu", "--out", str(out))
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        assert f.attrs["trace_file"] == "r.trace.json" and f.attrs["trace_steps"] == 2 and f.attrs["trace_first_step"] == 1
        assert "memory_snapshot_file" not in f.attrs
    events = json.loads((tmp_path / "r.trace.json").read_text())["traceEvents"]
    assert sorted({e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}) == ["ProfilerStep#1", "ProfilerStep#2"]
    assert not list(tmp_path.glob(".*tmp*"))
    # off by default: nothing beside a plain record
    plain = sl("run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "2", "--warmup", "1", "--device", "cpu",
               "--out", str(tmp_path / "plain.h5"))
    assert plain.returncode == 0 and sorted(x.name for x in tmp_path.iterdir() if x.name.startswith("plain")) == ["plain.h5"]
    with h5py.File(tmp_path / "plain.h5") as f:
        assert "trace_file" not in f.attrs
    # refusals, in one line, before anything runs (in process: the same parser and checks as the CLI)
    import argparse

    from scaleladder.rung import run_config as runmod
    from scaleladder.spec import SpecError

    parser = argparse.ArgumentParser()
    runmod.add_arguments(parser)

    def refused(*extra: str) -> str:
        a = parser.parse_args(["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "4", "--warmup", "1",
                               "--device", "cpu", "--out", str(tmp_path / "s.h5"), *extra])
        with pytest.raises(SpecError) as e:
            runmod.config_from_args(a)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "--memory-snapshot records the CUDA caching allocator's history; this rung runs on the CPU" in refused("--memory-snapshot")
    assert "--trace-steps 4: the run measures only 3 steps" in refused("--trace-steps", "4")
    assert "--progress-s must be a number of seconds, got 'soon'" in refused("--progress-s", "soon")
    assert "--progress-s must be >= 0, got '-1'" in refused("--progress-s", "-1")
    # a shorter run made from a rung (a max-batch probe) traces what it has, never refused
    a = parser.parse_args(["--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "8", "--warmup", "1",
                           "--device", "cpu", "--out", str(tmp_path / "e.h5"), "--trace-steps", "5"])
    cfg = runmod.config_from_args(a)
    assert cfg.trace_steps == 5 and cfg.argv()[-2:] == ["--trace-steps", "5"]
    probe = cfg.argv(steps=4, warmup=1)
    assert probe[probe.index("--trace-steps") + 1] == "3"
    assert runmod.config_from_args(parser.parse_args(probe)).trace_steps == 3
