"""`scaleladder rehearse`: every rung built and wrapped at its real world size on fake tensors, one of each
kind traced, seed panels left empty named; bad input in one line, exit 2 (campaign/rehearse.py)."""

from __future__ import annotations

import pytest

from scaleladder.campaign.rehearse import plan_representatives, seed_panels
from scaleladder.cli import main as cli
from scaleladder.spec import RunSpec

SLICE = "select={models: [vit-base], nodes: [1, 2], strategies: [fsdp-hybrid8, ddp, fsdp2-full-compile]}"


def test_one_representative_per_kind_at_its_largest_world() -> None:
    rungs = [(RunSpec.from_path(p), w) for p, w in [
        ("vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b32", 8), ("vit-base/fsdp-full/bf16-mixed/pre-lag/n8/b32", 64),
        ("vit-base/fsdp-full/bf16-mixed/post-lag/n8/b32", 64), ("vit-base/fsdp-full-ac/bf16-mixed/pre-lag/n2/b32", 16),
        ("vit-base/fsdp2-full-compile/bf16-mixed/pf0/n8/b32", 64), ("vit-15b/fsdp-full/bf16-mixed/pre-lag/n8/b32", 64)]]
    reps = plan_representatives(rungs, frozenset({"vit-15b/fsdp-full/bf16-mixed/pre-lag/n8/b32"}))
    assert reps["vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b32"] == "vit-base/fsdp-full/bf16-mixed/pre-lag/n8/b32"
    assert reps["vit-base/fsdp-full/bf16-mixed/post-lag/n8/b32"] == "vit-base/fsdp-full/bf16-mixed/pre-lag/n8/b32"
    assert reps["vit-base/fsdp-full-ac/bf16-mixed/pre-lag/n2/b32"] == "vit-base/fsdp-full-ac/bf16-mixed/pre-lag/n2/b32"
    assert "vit-base/fsdp2-full-compile/bf16-mixed/pf0/n8/b32" not in reps  # built and wrapped only
    assert "vit-15b/fsdp-full/bf16-mixed/pre-lag/n8/b32" not in reps  # predicted not to fit: it does not run


def test_a_seed_panel_whose_rungs_all_do_not_fit_is_named() -> None:
    blocks = [{"name": "weak scaling (ViT seed, Figures 2-3)", "models": ["vit-base", "vit-15b"],
               "strategies": ["fsdp-full"], "precisions": ["bf16-mixed"], "nodes": [1], "batches": [32]}]
    rungs = [RunSpec.from_path(f"{m}/fsdp-full/bf16-mixed/pre-lag/n1/b32") for m in ("vit-base", "vit-15b")]
    lines = seed_panels(blocks, rungs, frozenset({rungs[1].path}), lambda s: "why")
    assert lines == ["ViT seed, Figures 2-3: the vit-15b panel would be empty: all 1 of its rungs are predicted not to fit (why)"]
    assert seed_panels(blocks, rungs, frozenset(), lambda s: "why") == []


@pytest.mark.process
def test_rehearse_builds_and_wraps_a_slice_of_the_frontier_campaign(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["rehearse", "--profile", "frontier", "--no-trace", "--config", SLICE]) == 0
    out = capsys.readouterr().out
    assert "ok   vit-base/fsdp-hybrid8/bf16-mixed/pre-lag/n2/b32 at world 16: built and wrapped (13 FSDP units)" in out
    assert "ok   vit-base/ddp/bf16-mixed/pre-lag/n1/b32 at world 8: built and wrapped" in out
    assert "vit-base/fsdp2-full-compile/bf16-mixed/pf0/n2/b32 at world 16: built and wrapped (13 FSDP units, 12 compiled blocks)" in out
    assert "rehearse: 6 rungs built and wrapped, 0 traced, 0 failed" in out


@pytest.mark.process
@pytest.mark.slow
def test_rehearse_traces_a_representative_within_its_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    config = "select={models: [vit-base], nodes: [1, 2], strategies: [fsdp-hybrid8]}"
    assert cli(["rehearse", "--profile", "frontier", "--config", config]) == 0
    out = capsys.readouterr().out
    assert "as traced by vit-base/fsdp-hybrid8/bf16-mixed/pre-lag/n2/b32" in out
    assert "reduce_scatter" in out and "(planner +0.00%)" in out


@pytest.mark.parametrize("config,message", [
    ("ladders=[]", "has no ladder to rehearse"),
    ("select={models: [vit-nope]}", "matches no rung"),
    ("site={ranks_per_node: 4}", "at a world size the strategy cannot take"),
])
def test_bad_input_is_one_line_and_exit_2(config: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["rehearse", "--profile", "frontier", "--no-trace", "--config", config]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_doctor_rehearse_turns_each_failure_into_a_fatal_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from scaleladder.site import doctor

    def fake(profile: str, repo: object, out: object, jobs: int = 1) -> int:
        for line in ("ok   a at world 8: built and wrapped", "FAIL ViT seed, Figures 2-3: the vit-15b panel would be empty",
                     "rehearse: 1 rungs built and wrapped, 0 traced, 0 failed, 1 empty seed panel(s)"):
            out(line)  # type: ignore[operator]
        return 1

    monkeypatch.setattr(doctor, "rehearse_profile", fake)
    ctx = SimpleNamespace(profile=SimpleNamespace(name="frontier", repo="."))
    found = doctor.run_rehearse(ctx)  # type: ignore[arg-type]
    assert [f.level for f in found] == [doctor.FATAL, doctor.WARN]
    assert found[0].what == "rehearse: ViT seed, Figures 2-3: the vit-15b panel would be empty"
