"""`make gpu-check` (benchmarks/gpu_check.py): end to end on the CPU, and its reporting rules.

The end-to-end test is the driver's `--device cpu --smoke` form: every section, fewest rungs,
debug flavors, real subprocesses (a few minutes on the 2-core dev VM, hence `slow`). The other
tests build the report from hand-made records, in process: an OOM is a row, an attribute a
runner does not write yet is "n/a", the planner device is picked by chip AND capacity.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conftest import REPO, write_rung

DRIVER = REPO / "benchmarks" / "gpu_check.py"
HEADINGS = ("## Targets", "## Strategies at a fixed batch", "## Max batch", "## Harness overhead",
            "## Loader against synthetic data", "## Precision", "## Planner against measurement", "## Figures",
            "## Time per section", "## Commands")


def _driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", DRIVER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


gc = _driver()


def _run(out: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DRIVER), "--device", "cpu", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.slow
def test_cpu_smoke_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "gc"
    proc = _run(out, "--smoke")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    md = (out / "gpu-check.md").read_text()
    for h in HEADINGS:
        assert h in md, h
    summary = json.loads((out / "gpu-check.json").read_text())
    assert summary["status"] == "complete" and summary["smoke"] is True

    # A row per strategy asked for, every rung ok, every rung's file kept.
    sel = gc.SMOKE
    rungs = summary["rungs"]
    for role, strategy in sel.strategies:
        spec = f"{gc.CPU.flavors[role]}/{strategy}/bf16-mixed/pre-lag/n1/b{gc.CPU.batches[role]}"
        assert f"| {role} | `{spec}` | ok |" in md, spec
    assert [r["spec"].split("/")[1] for r in rungs if r["section"] == "maxbatch"] == [s for _, s in sel.maxbatch]
    assert {r["spec"].split("/")[2] for r in rungs if r["section"] == "precision"} == set(sel.precisions)
    assert {r["status"] for r in rungs} == {"ok"}, [r for r in rungs if r["status"] != "ok"]
    for r in rungs:
        assert (out / r["file"]).is_file(), r
    # Each measuring section spent time and ran; the targets are reported with a verdict each.
    assert set(summary["sections_s"]) >= {"environment", *gc.SECTIONS, "planner", "figures"}
    assert len(summary["targets"]) == 5
    assert summary["harness"] and math.isfinite(summary["harness"][0]["ratio"])
    assert summary["loader_ratio"] is not None and summary["loader_ratio"] > 0
    # The planner is asked about every rung that ran (one per file); the CPU measures no memory.
    assert len(summary["planner"]) == len({r["file"] for r in rungs})
    assert "no predicted-vs-measured figure" in md
    if importlib.util.find_spec("matplotlib"):
        assert (out / "throughput.png").stat().st_size > 0 and (out / "precision.png").is_file()
    # The exact commands, with their logs; the report is never left half-written.
    assert md.count("-m scaleladder run --spec") >= len(sel.strategies)
    assert "benchmarks/bench_rung.py" in md and "-m scaleladder maxbatch" in md and "-m scaleladder shard" in md
    assert not list(out.glob(".*tmp*"))
    assert "time per section" in proc.stdout


@pytest.mark.slow
def test_spent_budget_skips_every_section_but_reports(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--budget-min", "0", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "gpu-check.md").read_text()
    for section in gc.SECTIONS:
        assert f"| {section} | 0.0 s | skipped: the time budget (0 min) was spent" in md, section
    assert "-m scaleladder run" not in md  # nothing started after the budget
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    assert summary["rungs"] == [] and summary["status"] == "complete"


def _check(tmp_path: Path, smoke: bool = False) -> Any:
    args = argparse.Namespace(device="cuda", out=str(tmp_path), smoke=smoke, budget_min=18.0, sections="")
    c = gc.Check(args)
    c.env_info = {"name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "hip": "",
                  "driver": "580.159.04", "commit": "abc", "commit_from": "git", "date": "2026-11-23T00:00:00+00:00",
                  "total_bytes": 85_000_000_000, "count": 1}
    return c


def test_oom_and_missing_attributes_are_rows_not_crashes(tmp_path: Path) -> None:
    c = _check(tmp_path)
    ok = write_rung(tmp_path, "vit-huge/single/bf16-mixed/pre-lag/n1/b32", items_per_s=400.0, mfu=0.52, batch="32",
                    world_size=1, ranks_per_node=1, gpus_per_node=1)  # no peak_device_used_gib: an older runner
    oom = write_rung(tmp_path, "vit-huge/single-ac/bf16-mixed/pre-lag/n1/b32", status="oom")
    log = tmp_path / "died.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    died = gc.Command("x", ["x"], 1, 3.0, log)
    c.rungs = [c.judge("strategies", "vit-huge", "vit-huge/single/bf16-mixed/pre-lag/n1/b32", died, ok),
               c.judge("strategies", "vit-huge", "vit-huge/single-ac/bf16-mixed/pre-lag/n1/b32", died, oom),
               c.judge("strategies", "vit-huge", "vit-huge/ddp/bf16-mixed/pre-lag/n1/b32", died, tmp_path / "none.h5"),
               c.judge("strategies", "vit-huge", "vit-huge/ddp-ac/bf16-mixed/pre-lag/n1/b32",
                       gc.Command("y", ["y"], None, 600.0, log), tmp_path / "none.h5")]
    assert [r.status for r in c.rungs] == ["ok", "oom", "oom", "timeout"]
    assert math.isnan(c.rungs[0].mem("peak_device_used_gib"))
    md = c.markdown("complete")
    assert "| vit-huge | `vit-huge/single-ac/bf16-mixed/pre-lag/n1/b32` | **oom**: CUDA out of memory |" in md
    assert "| vit-huge | `vit-huge/ddp/bf16-mixed/pre-lag/n1/b32` | **oom**: exit 1:" in md
    assert "**timeout**" in md
    # The OOM'd AC rung gives no AC cost; the MFU target reads the ok rung, as measured.
    assert c.ac_costs() == {}
    assert "| ViT-H/14 bf16-mixed MFU | >= 50% | 52.0% best (vit-huge/single/bf16-mixed/pre-lag/n1/b32)" in md
    assert "| 10.00 | 12.00 | n/a |" in md  # peak active, reserved, device used (absent: n/a)
    c.write("complete")
    written = (tmp_path / "gpu-check.md").read_text()
    assert written.startswith("# make gpu-check: NVIDIA H100 80GB HBM3") and "**oom**: CUDA out of memory" in written
    assert json.loads((tmp_path / "gpu-check.json").read_text())["rungs"][1]["status"] == "oom"
    assert not list(tmp_path.glob(".gpu-check*tmp*"))


def test_planner_device_by_chip_and_capacity() -> None:
    gib = 2**30
    assert gc.plan_device_args("NVIDIA H100 80GB HBM3", int(79.2 * gib))[1] == "h100-80gb"
    assert gc.plan_device_args("NVIDIA H200", int(139.8 * gib))[1] == "h200-141gb"
    assert gc.plan_device_args("AMD Instinct MI250X", 64 * gib)[1] == "mi250x-gcd"
    nvl, key, _ = gc.plan_device_args("NVIDIA H100 NVL", int(93.1 * gib))  # an H100, but not 80 GB
    assert key is None and nvl[:2] == ["--device", "this-gpu"] and nvl[3] == "93.10"
    assert gc.plan_device_args("NVIDIA L40S", 44 * gib)[1] is None
    assert gc.plan_device_args("cpu", None)[1] == "cpu"


def test_bad_sections_is_one_line() -> None:
    with pytest.raises(SystemExit) as e:
        gc.parse_args(["--sections", "strategies,nope"])
    assert e.value.code == 2


def test_same_strategy_rows_are_marked_not_shown_as_different_strategies(tmp_path: Path) -> None:
    # issue 22: on one GPU FSDP1's full, grad-op and no-shard all run as NO_SHARD. The records say so
    # (sharding_ran, read from the wrapped model); the report marks the later rows and keeps them out
    # of the AC-cost and planner targets. The one-GPU selection does not run them at all.
    assert not {s for _, s in gc.FULL.strategies} & set(gc.ONE_RANK_SAME)
    c = _check(tmp_path)
    made = []
    for strategy, ips, ran in (("fsdp-full", 100.0, "fsdp1:NO_SHARD"), ("fsdp-full-ac", 80.0, "fsdp1:NO_SHARD"),
                               ("fsdp-no-shard", 101.0, "fsdp1:NO_SHARD"), ("fsdp-no-shard-ac", 50.0, "fsdp1:NO_SHARD"),
                               ("fsdp2-full", 90.0, "fsdp2:shard1:reshard"), ("ddp", 99.0, "ddp")):
        spec = f"vit-base/{strategy}/bf16-mixed/{'pf0' if strategy.startswith('fsdp2') else 'pre-lag'}/n1/b128"
        f = write_rung(tmp_path, spec, items_per_s=ips, batch="128", world_size=1, gpus_per_node=1, sharding_ran=ran)
        made.append(c.judge("strategies", "vit-base", spec, gc.Command("x", ["x"], 0, 1.0, f), f))
    c.rungs = made
    assert [getattr(c.same_as(r), "spec", None) for r in made] == [
        None, None, made[0].spec, made[1].spec, None, None]
    assert set(c.ac_costs()) == {"vit-base/fsdp-full-ac/bf16-mixed/pre-lag/n1/b128"}  # no-shard-ac's 50% is not a pair
    c.planner = [{"rung": r.spec, "section": "strategies", "batch": "128", "data": "synthetic", "same_as": getattr(c.same_as(r), "spec", ""),
                  "measured_active_gib": 10.0, "measured_reserved_gib": 12.0, "measured_device_used_gib": math.nan,
                  "predicted_gib": 10.0 * (2.0 if c.same_as(r) else 1.0), "required_gib": math.nan,
                  "error": 1.0 if c.same_as(r) else 0.0} for r in made]
    md = c.markdown("complete")
    assert "| vit-base | `vit-base/fsdp-no-shard/bf16-mixed/pre-lag/n1/b128` | ok | fsdp1:NO_SHARD (same strategy as `fsdp-full`) |" in md
    assert "| vit-base | `vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b128` | ok | fsdp1:NO_SHARD |" in md
    assert "4 of 4 rungs within" in md  # the two same-strategy planner rows are not counted
