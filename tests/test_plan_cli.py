"""`scaleladder plan` beyond the fixed devices and synthetic data, and the two charts the workflow draws.

* ``--device-gib G``: plan for any device (named by ``--device``); bad sizes exit 2.
* ``--data``: the input batches the runner keeps on the device depend on it.
* ``--fits-chart`` and ``--vs-measured`` (from an aggregated ``ladder.h5`` or rung
  files), in PNG and PDF: the commands the workflow calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scaleladder.cli import main as cli
from scaleladder.planner.memory import GIB, InputBatches, input_batches
from scaleladder.site.plan import DEVICES, custom_device, predict
from scaleladder.spec import RunSpec

SPEC = "vit-huge/ddp/bf16-mixed/pre-lag/n1/b16"


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert cli(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_custom_device_is_planned_with_its_own_memory(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "--spec", SPEC, "--device", "rtx-4090", "--device-gib", "23.5")
    assert d["device"] == "rtx-4090" and d["capacity_bytes"] == int(23.5 * GIB)
    spec = RunSpec.from_path(SPEC)
    assert d["max_batch"] == predict(spec, 8, 8, custom_device("rtx-4090", 23.5)).max_batch
    # the same device by its key and by its size give the same max batch
    same = predict(spec, 8, 8, custom_device("x", DEVICES["a100-80gb"] / GIB)).max_batch  # type: ignore[operator]
    assert same == predict(spec, 8, 8, "a100-80gb").max_batch
    # smaller device, smaller batch; an unnamed one gets a name that says its size
    small = _json(capsys, "--spec", SPEC, "--device-gib", "18")
    assert small["device"] == "custom-18gib" and 0 < small["max_batch"] < d["max_batch"]


@pytest.mark.parametrize("gib", ["0", "-3", "abc", "nan", "inf", ""])
def test_bad_device_sizes_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], gib: str) -> None:
    assert cli(["plan", "--spec", SPEC, "--device", "my-gpu", "--device-gib", gib]) == 2
    err = capsys.readouterr().err.strip()
    assert "device memory" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv,culprit", [
    (["--spec", SPEC], "give --device"),
    (["--spec", SPEC, "--device", "a100-40gb", "--device-gib", "24"], "known device"),
    (["--fits-chart", "fits.jpg", "--device", "a100-40gb"], "must end in .png, .pdf, .svg"),
    (["--vs-measured", "vs.png", "--device", "a100-40gb"], "either --ladder"),
    (["--vs-measured", "vs.png", "--device", "a100-40gb", "--ladder", "nope.h5"], "no such file: nope.h5"),
    (["--spec", "flava-debug/single/fp32/pre-lag/n1/b4", "--device", "cpu", "--flava-impl", "bogus"],
     "--flava-impl 'bogus': unknown FLAVA implementation"),
])
def test_bad_chart_and_device_arguments_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], culprit: str) -> None:
    assert cli(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert culprit in err and len(err.splitlines()) == 1


def test_the_data_mode_sets_the_input_batches_on_the_device(capsys: pytest.CaptureFixture[str]) -> None:
    # The runner: synthetic keeps its pool resident; a loader holds one batch, two for a moment.
    assert input_batches("synthetic") == InputBatches(2, 0)
    assert input_batches("shards/manifest.json") == InputBatches(1, 1)
    spec = "vit-base/ddp/bf16-mixed/pre-lag/n1/b64"
    syn = _json(capsys, "--spec", spec, "--device", "a100-40gb")
    ldr = _json(capsys, "--spec", spec, "--device", "a100-40gb", "--data", "shards/manifest.json")
    one_batch = 64 * (3 * 224 * 224 * 4 + 8)  # fp32 images and int64 labels
    assert syn["data"] == "synthetic" and ldr["data"] == "shards/manifest.json"
    assert syn["breakdown"]["inputs"] == 2 * one_batch and ldr["breakdown"]["inputs"] == one_batch
    assert ldr["peak_bytes"] == syn["peak_bytes"] - one_batch and ldr["max_batch"] > syn["max_batch"]


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF-")])
def test_fits_chart_for_a_device_and_node_count(tmp_path: Path, suffix: str, magic: bytes) -> None:
    chart = tmp_path / f"fits{suffix}"
    assert cli(["plan", "--fits-chart", str(chart), "--device", "mi250x-gcd", "--nodes", "2", "--gpus-per-node", "8",
                "--batch", "32"]) == 0
    assert chart.read_bytes()[:len(magic)] == magic and chart.stat().st_size > 5_000


def _ladder(tmp_path: Path) -> Path:
    """A ladder file as `scaleladder aggregate` writes it: an ok rung, a max-batch rung, an OOM."""
    from scaleladder.results.store import write_record

    rungs = tmp_path / "results" / "rungs"
    recs = {
        "vit-1b/fsdp-full/bf16-mixed/pre-lag/n1/b32": {"status": "ok", "batch": "32", "world_size": 8, "ranks_per_node": 8,
                                                      "peak_active_gib": 5.0, "data": "synthetic"},
        "vit-huge/ddp/bf16-mixed/pre-lag/n2/bmax": {"status": "ok", "batch": "40", "world_size": 16, "ranks_per_node": 8,
                                                   "peak_active_gib": 30.0, "data": "shards/manifest.json"},
        "vit-15b/ddp/bf16-mixed/pre-lag/n1/b32": {"status": "oom", "batch": "32", "world_size": 8},
    }
    files = []
    for spec, attrs in recs.items():
        f = rungs / f"{spec}.h5"
        f.parent.mkdir(parents=True, exist_ok=True)
        write_record(f, {"spec": spec, **attrs})
        files.append(str(f))
    ladder = tmp_path / "results" / "ladder.h5"
    assert cli(["aggregate", *files, "--out", str(ladder)]) == 0
    return ladder


@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF-")])
def test_predicted_vs_measured_from_an_aggregated_ladder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         suffix: str, magic: bytes) -> None:
    ladder = _ladder(tmp_path)
    capsys.readouterr()
    chart = tmp_path / f"vs{suffix}"
    assert cli(["plan", "--vs-measured", str(chart), "--device", "a100-80gb", "--ladder", str(ladder), "--json"]) == 0
    points = {p["label"]: p for p in json.loads(capsys.readouterr().out)}
    assert chart.read_bytes()[:len(magic)] == magic
    assert set(points) == {"vit-1b/fsdp-full/bf16-mixed/pre-lag/n1/b32", "vit-huge/ddp/bf16-mixed/pre-lag/n2/bmax"}  # no OOM
    # each prediction is for what ran: the max-batch rung at the batch it settled on, its world and data
    huge = predict(RunSpec.from_path("vit-huge/ddp/bf16-mixed/pre-lag/n2/bmax"), 16, 8, "a100-80gb", batch=40,
                   data="shards/manifest.json")
    assert points["vit-huge/ddp/bf16-mixed/pre-lag/n2/bmax"]["predicted_gib"] == huge.peak_bytes / GIB
    assert points["vit-huge/ddp/bf16-mixed/pre-lag/n2/bmax"]["measured_gib"] == 30.0
    # the same points from the rung files themselves
    files = sorted(str(p) for p in (tmp_path / "results" / "rungs").rglob("*.h5"))
    assert cli(["plan", "--vs-measured", str(tmp_path / "r.png"), "--device", "a100-80gb", "--rungs", *files, "--json"]) == 0
    assert {p["label"]: p for p in json.loads(capsys.readouterr().out)} == points


def test_the_issue_10_command_vit_15b_fits_on_4_gcds(capsys: pytest.CaptureFixture[str]) -> None:
    # docs/planner.md quotes this command's output: with the runner's fused AdamW (no foreach
    # temporaries) ViT-15B fits on 4 MI250X GCDs at the ViT seed's local batch 32.
    d = _json(capsys, "--spec", "vit-15b/fsdp-hybrid4-ac/bf16-mixed/pre-lag/n1/b32", "--gpus-per-node", "4",
              "--device", "mi250x-gcd")
    assert d["fits"] and d["phase"] == "backward:vit.layer" and d["max_batch"] == 67
    assert round(d["peak_bytes"] / GIB, 2) == 57.90 and round(d["required_bytes"] / GIB, 2) == 61.79
    gib = {k: round(v / GIB, 2) for k, v in d["breakdown"].items()}
    assert gib == {"params": 13.64, "grads": 13.93, "optimizer": 27.28, "activations": 1.86, "buffers": 1.15,
                   "inputs": 0.04, "overhead": 3.89}


def test_bf16_true_plans_fp32_masters_and_their_gradient_copies(capsys: pytest.CaptureFixture[str]) -> None:
    # bf16-true: 2 B params and grads, 12 B of optimizer state (fp32 master, exp_avg, exp_avg_sq) and,
    # in the step, an fp32 copy of every gradient: the optimizer entry at an optimizer peak is 16 B
    # per local trainable element (+ a 512-byte block per step counter).
    from scaleladder.planner.inventory import inventory
    from scaleladder.planner.static import ALLOC_BLOCK_BYTES, local_counts
    from scaleladder.spec import parse_strategy

    d = _json(capsys, "--spec", "vit-1b/fsdp-full-ac/bf16-true/pre-lag/n1/b1", "--device", "a100-40gb")
    c = local_counts(inventory("vit-1b"), parse_strategy("fsdp-full-ac"), "bf16-true", 8)
    assert d["phase"] == "optimizer"
    assert d["breakdown"]["optimizer"] == 16 * c.trainable + ALLOC_BLOCK_BYTES * c.tensors
    assert d["breakdown"]["params"] == 2 * c.params


def test_plan_follows_the_flava_implementation_the_rung_builds(capsys: pytest.CaptureFixture[str]) -> None:
    # A rung runs FLAVA on SDPA unless told --flava-impl torchmultimodal; `plan` takes the same
    # option and plans that model's memory. TorchMultimodal's layer returns its T x T attention
    # weights out of a checkpointed layer, so FLAVA-10B under FSDP + AC fits 8 x A100-40GB at b8
    # only on SDPA (the planner follows what is resident).
    argv = ("--spec", "flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8", "--gpus", "8",
            "--device", "a100-40gb", "--flava-impl")
    sdpa, tm = _json(capsys, *argv, "sdpa"), _json(capsys, *argv, "torchmultimodal")
    assert sdpa["fits"] and not tm["fits"]
    assert tm["peak_bytes"] > 2 * sdpa["peak_bytes"]
