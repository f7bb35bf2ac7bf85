"""`make gpu-check` (benchmarks/gpu_check.py, its parts in benchmarks/gpucheck/): end to end on the CPU, and its reporting rules.

The end-to-end test is the driver's `--device cpu --smoke` form: every section, fewest rungs,
debug flavors, real subprocesses (a few minutes on the 2-core dev VM, hence `slow`). The other
tests build the report from hand-made records, in process: an OOM is a row, an attribute a
runner does not write yet is "n/a", the planner device is picked by chip AND capacity.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, write_rung

DRIVER = REPO / "benchmarks" / "gpu_check.py"
sys.path.insert(0, str(REPO / "benchmarks"))
from gpucheck import machine, report, rows  # noqa: E402
from gpucheck.config import CPU, FULL, GPU, ONE_RANK_SAME, ROLES, SECTIONS, SMOKE  # noqa: E402
from gpucheck.rows import Command, judge  # noqa: E402
from gpucheck.runner import Check, parse_args  # noqa: E402

HEADINGS = ("## Targets", "## Strategies at a fixed batch", "## Max batch", "## Harness overhead",
            "## Loader against synthetic data", "## Precision", "## Planner against measurement", "## Figures",
            "## Time per section", "## Commands")


def _run(out: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DRIVER), "--device", "cpu", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.process
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
    sel = SMOKE
    rungs = summary["rungs"]
    for role, strategy in sel.strategies:
        spec = f"{CPU.flavors[role]}/{strategy}/bf16-mixed/pre-lag/n1/b{CPU.batches[role]}"
        assert f"| {role} | `{spec}` | ok |" in md, spec
    assert [r["spec"].split("/")[1] for r in rungs if r["section"] == "maxbatch"] == [s for _, s in sel.maxbatch]
    assert {r["spec"].split("/")[2] for r in rungs if r["section"] == "precision"} == set(sel.precisions)
    assert {r["status"] for r in rungs} == {"ok"}, [r for r in rungs if r["status"] != "ok"]
    for r in rungs:
        assert (out / r["file"]).is_file(), r
    # Each measuring section spent time and ran; the targets are reported with a verdict each.
    assert set(summary["sections_s"]) >= {"environment", *SECTIONS, "planner", "figures"}
    assert len(summary["targets"]) == 6
    assert summary["harness"] and math.isfinite(summary["harness"][0]["ratio"])
    assert summary["loader_ratio"] is not None and summary["loader_ratio"] > 0
    # The planner is asked about every rung that ran (one per file); the CPU measures no memory.
    assert len(summary["planner"]) == len({r["file"] for r in rungs})
    # ... and its step time is held against each rung's measured median step (on any device)
    for p in summary["planner"]:
        assert p["predicted_step_ms"] > 0 and p["measured_step_ms"] > 0 and math.isfinite(p["step_error"]), p
    assert "| planner step time vs measured | within 20% |" in md
    assert "no predicted-vs-measured figure" in md
    if importlib.util.find_spec("matplotlib"):
        assert (out / "throughput.png").stat().st_size > 0 and (out / "precision.png").is_file()
    # The exact commands, with their logs; the report is never left half-written.
    assert md.count("-m scaleladder run --spec") >= len(sel.strategies)
    assert "benchmarks/bench_rung.py" in md and "-m scaleladder maxbatch" in md and "-m scaleladder shard" in md
    assert not list(out.glob("*tmp*")) and not list(out.glob(".*tmp*"))
    assert "time per section" in proc.stdout


@pytest.mark.process
@pytest.mark.slow
def test_spent_budget_skips_every_section_but_reports(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--budget-min", "0", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (tmp_path / "gpu-check.md").read_text()
    for section in SECTIONS:
        assert f"| {section} | 0.0 s | skipped: the time budget (0 min) was spent" in md, section
    assert "-m scaleladder run" not in md  # nothing started after the budget
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    assert summary["rungs"] == [] and summary["status"] == "complete"


def _check(tmp_path: Path, smoke: bool = False) -> Any:
    args = argparse.Namespace(device="cuda", out=str(tmp_path), smoke=smoke, budget_min=18.0, sections="")
    c = Check(args)
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
    died = Command("x", ["x"], 1, 3.0, log)
    c.rungs = [judge("strategies", "vit-huge", "vit-huge/single/bf16-mixed/pre-lag/n1/b32", died, ok),
               judge("strategies", "vit-huge", "vit-huge/single-ac/bf16-mixed/pre-lag/n1/b32", died, oom),
               judge("strategies", "vit-huge", "vit-huge/ddp/bf16-mixed/pre-lag/n1/b32", died, tmp_path / "none.h5"),
               judge("strategies", "vit-huge", "vit-huge/ddp-ac/bf16-mixed/pre-lag/n1/b32",
                       Command("y", ["y"], None, 600.0, log), tmp_path / "none.h5")]
    assert [r.status for r in c.rungs] == ["ok", "oom", "oom", "timeout"]
    assert math.isnan(c.rungs[0].mem("peak_device_used_gib"))
    md = report.markdown(c, "complete")
    assert "| vit-huge | `vit-huge/single-ac/bf16-mixed/pre-lag/n1/b32` | **oom**: CUDA out of memory |" in md
    assert "| vit-huge | `vit-huge/ddp/bf16-mixed/pre-lag/n1/b32` | **oom**: exit 1:" in md
    assert "**timeout**" in md
    # The OOM'd AC rung gives no AC cost; the MFU target reads the ok rung, as measured.
    assert report.ac_costs(c) == {}
    assert "| ViT-H/14 bf16-mixed MFU | >= 50% | 52.0% best (vit-huge/single/bf16-mixed/pre-lag/n1/b32)" in md
    assert "| 10.00 | 12.00 | n/a |" in md  # peak active, reserved, device used (absent: n/a)
    report.write(c, "complete")
    written = (tmp_path / "gpu-check.md").read_text()
    assert written.startswith("# make gpu-check: NVIDIA H100 80GB HBM3") and "**oom**: CUDA out of memory" in written
    assert json.loads((tmp_path / "gpu-check.json").read_text())["rungs"][1]["status"] == "oom"
    assert not list(tmp_path.glob("*gpu-check*tmp*"))


def test_planner_device_by_chip_and_capacity() -> None:
    gib = 2**30
    assert machine.plan_device_args("NVIDIA H100 80GB HBM3", int(79.2 * gib))[1] == "h100-80gb"
    assert machine.plan_device_args("NVIDIA H200", int(139.8 * gib))[1] == "h200-141gb"
    assert machine.plan_device_args("AMD Instinct MI250X", 64 * gib)[1] == "mi250x-gcd"
    nvl, key, _ = machine.plan_device_args("NVIDIA H100 NVL", int(93.1 * gib))  # an H100, but not 80 GB
    assert key is None and nvl[:2] == ["--device", "this-gpu"] and nvl[3] == "93.10"
    assert machine.plan_device_args("NVIDIA L40S", 44 * gib)[1] is None
    assert machine.plan_device_args("cpu", None)[1] == "cpu"


def test_bad_sections_is_one_line() -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(["--sections", "strategies,nope"])
    assert e.value.code == 2


def test_same_strategy_rows_are_marked_not_shown_as_different_strategies(tmp_path: Path) -> None:
    # on one GPU FSDP1's full, grad-op and no-shard all run as NO_SHARD. The records say so
    # (sharding_ran, read from the wrapped model); the report marks the later rows and keeps them out
    # of the AC-cost and planner targets. The one-GPU selection does not run them at all.
    assert not {s for _, s in FULL.strategies} & set(ONE_RANK_SAME)
    c = _check(tmp_path)
    made = []
    for strategy, ips, ran in (("fsdp-full", 100.0, "fsdp1:NO_SHARD"), ("fsdp-full-ac", 80.0, "fsdp1:NO_SHARD"),
                               ("fsdp-no-shard", 101.0, "fsdp1:NO_SHARD"), ("fsdp-no-shard-ac", 50.0, "fsdp1:NO_SHARD"),
                               ("fsdp2-full", 90.0, "fsdp2:shard1:reshard"), ("ddp", 99.0, "ddp")):
        spec = f"vit-base/{strategy}/bf16-mixed/{'pf0' if strategy.startswith('fsdp2') else 'pre-lag'}/n1/b128"
        f = write_rung(tmp_path, spec, items_per_s=ips, batch="128", world_size=1, gpus_per_node=1, sharding_ran=ran)
        made.append(judge("strategies", "vit-base", spec, Command("x", ["x"], 0, 1.0, f), f))
    c.rungs = made
    assert [getattr(rows.same_as(c.rungs, r), "spec", None) for r in made] == [
        None, None, made[0].spec, made[1].spec, None, None]
    assert set(report.ac_costs(c)) == {"vit-base/fsdp-full-ac/bf16-mixed/pre-lag/n1/b128"}  # no-shard-ac's 50% is not a pair
    c.planner = [{"rung": r.spec, "section": "strategies", "batch": "128", "data": "synthetic", "same_as": getattr(rows.same_as(c.rungs, r), "spec", ""),
                  "measured_active_gib": 10.0, "measured_reserved_gib": 12.0, "measured_device_used_gib": math.nan,
                  "predicted_gib": 10.0 * (2.0 if rows.same_as(c.rungs, r) else 1.0), "required_gib": math.nan,
                  "error": 1.0 if rows.same_as(c.rungs, r) else 0.0,
                  "predicted_step_ms": 100.0, "step_bound": "host", "measured_step_ms": 100.0 if rows.same_as(c.rungs, r) else 110.0,
                  "step_error": 0.0 if rows.same_as(c.rungs, r) else 100 / 110 - 1} for r in made]
    md = report.markdown(c, "complete")
    assert "| vit-base | `vit-base/fsdp-no-shard/bf16-mixed/pre-lag/n1/b128` | ok | fsdp1:NO_SHARD (same strategy as `fsdp-full`) |" in md
    assert "| vit-base | `vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b128` | ok | fsdp1:NO_SHARD |" in md
    assert "4 of 4 rungs within" in md  # the two same-strategy planner rows are not counted
    assert "| planner step time vs measured | within 20% | 4 of 4 rungs within; worst -9.1% (" in md  # nor in the step's
    assert "| 100.0 | host | 110.0 | -9.1% |" in md


# -- every section starts, at a GPU's start-up cost -------------------------------------------
# The simulated cost of each command on one GPU, in seconds. Start-up per rung process: dev-cpu measured
# a vit-debug rung's `startup_s` at 5.9 s (imports 2.6 s, process group 3.2 s; `scaleladder run --spec
# vit-debug/fsdp-full/fp32/pre-lag/n1/b4 --steps 3 --warmup 1 --device cpu`); a GPU adds the CUDA
# context, the NCCL communicator and a full-size model build, so 20 s is ASSUMED per rung (no GPU was
# lent to measure it; the records' startup_s will say), and 90 s more for an inductor compile of the
# blocks. Steps at 0.3 s (vit-huge b32 on an H100 at ~40% MFU is ~0.25 s).
SIM_STARTUP_S, SIM_COMPILE_S, SIM_STEP_S, SIM_PLAN_S, SIM_SHARD_S, SIM_PROBES = 20.0, 90.0, 0.3, 5.0, 60.0, 6


def _sim_cost(c: Any, name: str, argv: list[str]) -> float:
    p = c.profile
    if name.startswith("plan"):
        return SIM_PLAN_S
    if name == "loader shard":
        return SIM_SHARD_S
    if name.startswith("harness"):
        _, _, steps, repeats = p.harness[0]
        return SIM_STARTUP_S + 2 * steps * repeats * SIM_STEP_S  # bare and harness loops, one process
    if name.startswith("maxbatch"):
        return SIM_PROBES * (SIM_STARTUP_S + p.probe_steps * SIM_STEP_S)
    steps = int(argv[argv.index("--steps") + 1])
    return SIM_STARTUP_S + steps * SIM_STEP_S + (SIM_COMPILE_S if "-compile/" in argv[argv.index("--spec") + 1] else 0.0)


def test_every_section_starts_at_a_gpus_start_up_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A simulated clock (the driver's monotonic clock, for the duration of this test) that each
    # simulated command advances by its cost: the whole FULL check on one GPU in a fraction of a second.
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    args = argparse.Namespace(device="cuda", out=str(tmp_path), smoke=False, budget_min=18.0, sections="")
    c = Check(args)
    c.env_info = _check(tmp_path).env_info
    c.probe_env = lambda: None  # no GPU here: the machine is given
    c.draw = lambda: None

    starts: list[tuple[str, float]] = []

    def simulated(name: str, argv: list[str], timeout: float) -> Any:
        starts.append((name, now[0]))
        cost = _sim_cost(c, name, argv)
        took = min(cost, timeout)
        now[0] += took
        c.logs.mkdir(parents=True, exist_ok=True)
        log = c.logs / f"{len(c.commands) + 1:03d}.log"
        log.write_text("$ " + " ".join(argv) + "\n")
        cmd = Command(name, argv, 0 if cost <= timeout else None, took, log)
        c.commands.append(cmd)
        if c.section_name and not name.startswith("plan"):
            c.section_took.append(took)
        if cost <= timeout and "--out" in argv and "run" in argv:  # a rung that finished leaves its record
            import h5py

            with h5py.File(argv[argv.index("--out") + 1], "w") as f:
                f.attrs.update({"status": "ok", "batch": argv[argv.index("--spec") + 1].rsplit("/b", 1)[1],
                                "data": "synthetic", "items_per_s": 100.0, "gpus_per_node": 1})
        return cmd

    c.sh = simulated
    assert c.run() == 0
    started = {s: [cmd for cmd in c.commands if cmd.name.startswith(s) and not cmd.name.startswith("plan")] for s in SECTIONS}
    started["strategies"] = [cmd for cmd in c.commands if cmd.name.startswith("strategies")]
    for section in SECTIONS:
        assert started[section], (section, c.notes)
    # every section's key rows first: each model's AC pair, every model's ddp max-batch search
    ran = [cmd.argv[cmd.argv.index("--spec") + 1].split("/")[:2] for cmd in started["strategies"]]
    for role in ROLES:
        flavor = GPU.flavors[role]
        assert [flavor, "single"] in ran and [flavor, "single-ac"] in ran, ran
    assert [GPU.flavors["vit-base"], "single-compile"] in ran, ran  # compiled rungs early, not last
    searched = [cmd.name.split()[1].split("/")[:2] for cmd in started["maxbatch"] if cmd.rc == 0]  # finished
    assert all([GPU.flavors[r], "ddp"] in searched for r in ROLES), searched
    assert all(cmd.rc == 0 for cmd in started["harness"][:1] + started["loader"][:3] + started["strategies"][:6])
    assert len(started["loader"]) >= 3  # shards, the synthetic rung and the first loader-fed twin: the ratio
    # nothing starts after the budget, and the last command ends within a minute of it
    measuring = [(n, t) for n, t in starts if n.split()[0].split("-")[0] in SECTIONS]
    assert measuring and all(t < c.budget_s for _, t in measuring), measuring[-3:]
    assert sum(cmd.seconds for cmd in c.commands if cmd.name.split()[0].split("-")[0] in SECTIONS) <= c.budget_s + 60
    print(f"simulated: {c.elapsed() / 60:.1f} min; per section " +
          ", ".join(f"{k} {v / 60:.1f} min ({len(started.get(k, []))} commands)" for k, v in c.section_s.items()))


def test_the_loader_section_runs_both_decoders_and_both_worker_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--sections loader` on one GPU (simulated clock, the start-up costs above) shards
    300-900 px JPEGs and runs the synthetic rung, then CPU and GPU decode with 14 and 6 workers, in
    under 5 minutes; the report's table has a row each with its ratio to synthetic."""
    def record(argv: list[str]) -> None:
        if "--out" in argv and "run" in argv:
            import h5py

            data = argv[argv.index("--data") + 1]
            with h5py.File(argv[argv.index("--out") + 1], "w") as f:
                f.attrs.update({"status": "ok", "data": data, "items_per_s": 100.0 if data == "synthetic" else 98.0,
                                "step_time_mean_s": 0.05, "gpus_per_node": 1, "loader_transport": "uint8" if data != "synthetic" else ""})

    c = simulated_check(tmp_path, monkeypatch, "loader", 5.0, record)
    c.profile = dataclasses.replace(GPU, shard_samples=16)  # the JPEG folder is written for real: keep it small
    assert c.run() == 0
    shard = next(cmd for cmd in c.commands if cmd.name == "loader shard")
    assert "--images" in shard.argv
    fed = [(cmd.argv[cmd.argv.index("--decode") + 1], cmd.argv[cmd.argv.index("--workers") + 1])
           for cmd in c.commands if cmd.name.startswith("loader") and "--decode" in cmd.argv]
    assert fed == [("cpu", "14"), ("gpu", "14"), ("cpu", "6"), ("gpu", "6")], fed
    assert c.elapsed() <= 5 * 60
    md = (tmp_path / "gpu-check.md").read_text()
    assert "JPEGs of 300-900 px" in md and md.count("| shards, `--decode") == 4 and "| 0.980 |" in md
    assert report.loader_ratio(c) == pytest.approx(0.98)


# -- the host section ----------------------------------------------------------------------


def test_kernel_busy_merges_overlapping_device_work() -> None:
    from gpucheck.host import kernel_busy

    k = [{"ph": "X", "cat": "kernel", "ts": 0, "dur": 4}, {"ph": "X", "cat": "kernel", "ts": 2, "dur": 4},  # overlap: 0-6
         {"ph": "X", "cat": "gpu_memcpy", "ts": 8, "dur": 2}, {"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 100}]
    assert kernel_busy(k) == pytest.approx(8 / 10)
    assert math.isnan(kernel_busy(k[3:]))  # a CPU trace has no device work


def _host_rung(row: Any, items: float, mfu: float = math.nan) -> Any:
    return rows.RungResult("host", row.role, f"{row.role}/{row.strategy}/bf16-mixed/pre-lag/n1/b{row.batch}", "ok", None,
                           {"gpu_check_row": row, "untraced_items_per_s": items, "untraced_mfu": mfu, "items_per_s": items})


def test_host_targets_from_the_section_rows(tmp_path: Path) -> None:
    """FSDP against single over the interleaved repeats (median), AC costs, MFUs; on the CPU:
    'not measured' with the command to run on a GPU."""
    from gpucheck import host
    from gpucheck.host import HostRow

    c = _check(tmp_path)
    c.args.sections = "host"
    vb, vh, fl = "vit-base", "vit-huge", "flava-350m"
    c.rungs = [_host_rung(HostRow(vb, "single", 128), 2600), _host_rung(HostRow(vb, "fsdp-full", 128), 2400),
               _host_rung(HostRow(vb, "single", 128, repeat=1), 2400), _host_rung(HostRow(vb, "fsdp-full", 128, repeat=1), 2200),
               _host_rung(HostRow(vb, "fsdp2-full", 128), 1500),
               _host_rung(HostRow(vh, "single", 128), 400), _host_rung(HostRow(vh, "single-ac", 128), 300),
               _host_rung(HostRow(vh, "single-sac", 128), 360), _host_rung(HostRow(fl, "single", 64, "sdpa"), 900, 0.22)]
    got = {t[0]: t[2:] for t in host.targets(c)}
    assert got["FSDP1 vs `single`, vit-base b128"] == ["0.92×", "met"]  # 2300 / 2500
    assert got["FSDP2 vs `single`, vit-base b128"] == ["0.60×", "NOT met"]
    assert got["`single-ac` cost, vit-huge b128"] == ["25.0%", "met"]
    assert got["`single-sac` cost, vit-huge b128"] == ["10.0%", "met"]
    assert got["flava-350m `single` b64 MFU"] == ["22.0%", "met"]
    assert got["ViT-H/14 `single-compile` b128 MFU"][1].startswith("not measured")
    md = "\n".join(host.markdown(c))
    assert "| vit-base fsdp-full b128 (repeat 2) |" in md and "0.92×" in md
    c.device = "cpu"
    assert all(t[3].startswith("not measured (no GPU: run `make gpu-check GPU_CHECK_ARGS=\"--sections host")
               for t in host.targets(c))


def simulated_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sections: str, budget_min: float,
                    record: Any = None) -> Any:
    """A cuda Check of ``sections`` whose commands only advance a simulated clock by their
    _sim_cost (the driver's monotonic clock, for the duration of the test); ``record(argv)``, when
    given, writes what a command that finished would leave (its rung's record)."""
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    c = Check(argparse.Namespace(device="cuda", out=str(tmp_path), smoke=False, budget_min=budget_min, sections=sections))
    c.env_info = _check(tmp_path).env_info
    c.probe_env = lambda: None
    c.draw = lambda: None

    def simulated(name: str, argv: list[str], timeout: float) -> Any:
        took = min(_sim_cost(c, name, argv), timeout)
        now[0] += took
        c.logs.mkdir(parents=True, exist_ok=True)
        cmd = Command(name, argv, 0, took, c.logs / f"{len(c.commands) + 1:03d}.log")
        cmd.log.write_text("")
        c.commands.append(cmd)
        if c.section_name and not name.startswith("plan"):
            c.section_took.append(took)
        if record is not None:
            record(argv)
        return cmd

    c.sh = simulated
    return c


def test_host_section_alone_fits_its_budget_key_rows_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--sections host --budget-min 6` on one GPU (simulated clock, the start-up costs above):
    the target rows run first, and everything, report included, ends within 9 minutes."""
    from gpucheck.host import GPU_ROWS

    c = simulated_check(tmp_path, monkeypatch, "host", 6.0)
    assert c.run() == 0
    ran = [cmd.argv[cmd.argv.index("--spec") + 1] for cmd in c.commands if cmd.name.startswith("host")]
    key = [f"{r.role}/{r.strategy}/bf16-mixed/{r.knobs or ('pf0' if r.strategy.startswith('fsdp2') else 'pre-lag')}/n1/b{r.batch}"
           for r in GPU_ROWS[:11]]  # the FSDP pairs, FSDP2's units of 1, 2 and 4 layers, the AC costs, FLAVA's MFU
    assert ran[:11] == key and len(ran) < len(GPU_ROWS)  # key rows first; the tail skipped with a note
    assert any("skipped from" in n for n in c.notes["host"])
    assert c.elapsed() <= 9 * 60 and all("--trace-steps" in cmd.argv for cmd in c.commands if cmd.name.startswith("host"))


def test_host_section_runs_fsdp2_units_of_2_and_4_layers_beside_1() -> None:
    """vit-base `fsdp2-full` b128 at a unit per layer, then units of 2 and 4 (knobs pf0-u2, pf0-u4),
    each its own rung and its own row; the FSDP2 target reads the unit-per-layer row only."""
    from gpucheck.host import GPU_ROWS

    fsdp2 = [r for r in GPU_ROWS if (r.role, r.strategy, r.batch) == ("vit-base", "fsdp2-full", 128)]
    assert [r.knobs for r in fsdp2] == ["", "pf0-u2", "pf0-u4"]
    i = GPU_ROWS.index(fsdp2[0])
    assert list(GPU_ROWS[i:i + 3]) == fsdp2  # side by side
    default = "vit-base/fsdp2-full/bf16-mixed/pf0/n1/b128"
    assert [r.spec(default) for r in fsdp2] == [default, "vit-base/fsdp2-full/bf16-mixed/pf0-u2/n1/b128",
                                                "vit-base/fsdp2-full/bf16-mixed/pf0-u4/n1/b128"]
    assert fsdp2[2].label() == "vit-base fsdp2-full pf0-u4 b128"


@pytest.mark.process
@pytest.mark.slow
def test_host_section_on_the_cpu(tmp_path: Path) -> None:
    """`--sections host --smoke` under --device cpu: the FSDP pair and FLAVA's two implementations,
    each in its own file, with a trace read and removed; the host targets 'not measured'."""
    proc = _run(tmp_path, "--sections", "host", "--smoke", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    md = (tmp_path / "gpu-check.md").read_text()
    summary = json.loads((tmp_path / "gpu-check.json").read_text())
    host_rungs = [r for r in summary["rungs"] if r["section"] == "host"]
    assert [r["status"] for r in host_rungs] == ["ok"] * 4 and len({r["file"] for r in host_rungs}) == 4
    assert all(r["untraced_items_per_s"] and r["untraced_items_per_s"] > 0 for r in host_rungs)
    assert not list((tmp_path / "rungs").glob("*.trace.json"))
    assert "### Host targets" in md and len(summary["host_targets"]) == 6
    assert all(t["verdict"].startswith("not measured") for t in summary["host_targets"])
    assert "| strategies | 0.0 s | not asked for" in md
