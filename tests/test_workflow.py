"""The workflow on the workstation profile, for real: lint, config errors before any job,
the DAG from shards to report, and reruns: one rung by path, one model by --config
selection, a rung killed mid-run. Each test works in its own copy of the workflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest

from conftest import VENV_BIN, snakemake, snakemake_env, workflow_copy
from scaleladder.results.aggregate import read_ladder

pytestmark = [pytest.mark.slow, pytest.mark.process]

PROFILE = ("--profile", "profiles/local")
# A ladder of three rungs (two ViT strategies, one FLAVA) that trains in about a minute.
SMALL = """
steps: 4
warmup: 1
ladders:
  - models: [vit-debug]
    strategies: [ddp, fsdp-full]
    batches: [4]
  - models: [flava-debug]
    strategies: [ddp]
    batches: [4]
"""
RUNGS = [
    "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5",
    "results/rungs/vit-debug/fsdp-full/fp32/pre-lag/n1/b4.h5",
    "results/rungs/flava-debug/ddp/fp32/pre-lag/n1/b4.h5",
]
OUTPUTS = ["results/ladder.h5", "results/rungs.csv", "results/rungs.columns.csv", "results/report.html", "results/report.md", "results/plots/pareto.png",
           "results/plots/throughput_by_model.pdf"]


def small(wf: Path) -> tuple[str, ...]:
    """Profile + the small ladder on top of the profile's site.yaml. TRAP: --configfile,
    like --config and -R, takes every word after it, so targets must come first."""
    (wf / "small.yaml").write_text(SMALL)
    return (*PROFILE, "--configfile", "profiles/local/site.yaml", "small.yaml")


def jobs(out: str) -> dict[str, int]:
    if "Nothing to be done" in out:
        return {}
    table = out[out.index("Job stats:"):]
    import re

    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


def mtimes(wf: Path) -> dict[str, float]:
    return {r: (wf / r).stat().st_mtime_ns for r in RUNGS}


def test_lint_is_clean(wf: Path) -> None:
    for profile in ("local", "frontier", "a100", "slurm-localhost"):
        out = snakemake(wf, "--lint", "--profile", f"profiles/{profile}")
        assert "Lints for" not in out.stdout + out.stderr, out.stderr[-3000:]
        assert "good condition" in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("override", "messages"),
    [
        # the schema's errors are named all at once, so one run shows four (a snakemake start each
        # cost CI ~10 s); tests/test_workflow_logic.py holds each message alone
        (["steps=abc", "site={supervise: sometimes}", "ladders=[{models: [vit-debug], strategies: [ddp], batches: [0]}]",
          "maxbatch={probe_steps: 0}"],
         ["config key 'steps': 'abc' is not of type 'integer'",
          "config key 'site.supervise': 'sometimes' is not one of ['launch', 'finalize']",
          "config key 'ladders[0].batches[0]'", "config key 'maxbatch.probe_steps'"]),
        (["ladders=[{models: [vit-tiny], strategies: [ddp], batches: [4]}]"], ["config key 'ladders[0].models[0]': unknown model 'vit-tiny'"]),
        (["ladders=[{models: [vit-debug], strategies: [zero3], batches: [4]}]"], ["config key 'ladders[0].strategies[0]': unknown strategy 'zero3'"]),
        (["ladders=[{models: [vit-debug], strategies: [ddp], batches: [4], nodes: [2]}]"], ["config key 'ladders[0].nodes': 2 nodes"]),
        (["select={models: [vit-huge]}"], ["config key 'select.models[0]': 'vit-huge' matches no rung"]),
        (["select={models: [vit-debg]}"], ["'vit-debg' matches no rung of the ladder; did you mean 'vit-debug'?"]),
        (["steps=2", "warmup=5"], ["config key 'warmup': warmup must be in [0, steps)"]),
        (["site={plan_device: rtx4090}"], ["config key 'site.plan_device': unknown device 'rtx4090'"]),
    ],
)
def test_bad_config_fails_before_any_job_naming_the_key(wf: Path, override: list[str], messages: list[str]) -> None:
    out = snakemake(wf, *PROFILE, "-n", "--config", *override, check=False)  # -n: a config that passes runs nothing
    assert out.returncode != 0
    for message in messages:
        assert message in out.stdout + out.stderr, (out.stdout + out.stderr)[-3000:]
    assert not (wf / "results").exists()


def test_max_batch_refused_where_the_supervisor_cannot_launch(wf: Path) -> None:
    out = snakemake(wf, "--profile", "profiles/frontier", "-n", "--config",
                    "ladders=[{models: [vit-base], strategies: [ddp], batches: [max]}]", check=False)
    assert out.returncode != 0 and "config key 'ladders[0].batches': 'max'" in out.stdout + out.stderr


def test_without_a_profile_the_workstation_ladder_lints_and_plans(wf: Path) -> None:
    out = snakemake(wf, "--lint")
    assert "good condition" in out.stdout + out.stderr and "Lints for" not in out.stdout + out.stderr
    assert "rung_max" in snakemake(wf, "-n").stdout


def test_select_narrows_the_rungs_and_ends_with_their_ladder_and_report(wf: Path) -> None:
    out = snakemake(wf, "-n", *small(wf), "--config", "select={models: [flava-debug]}").stdout
    assert jobs(out) == {"shard": 1, "rung": 1, "aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1}
    assert RUNGS[2] in out and RUNGS[0] not in out


def test_a_failed_job_says_its_cause_on_the_console(wf: Path, tmp_path: Path) -> None:
    """An empty image folder passes the dry run and fails in the shard job: the console names
    the cause under the rule, and in a container the last log path lies in results/."""
    (tmp_path / "empty").mkdir()
    (wf / "one.yaml").write_text("steps: 4\nwarmup: 1\nladders:\n  - {models: [vit-debug], strategies: [ddp], batches: [4]}\n")
    out = snakemake(wf, *PROFILE, "--configfile", "profiles/local/site.yaml", "one.yaml",
                    "--config", f"data={{images: {tmp_path / 'empty'}}}", check=False, SCALELADDER_IN_CONTAINER="1")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"  rule shard:\n    scaleladder shard: error: {tmp_path / 'empty'}: no images found (" in text, text[-3000:]
    assert "'message: None' above only says that the rule has no message" in text
    last = [ln for ln in text.splitlines() if ln.startswith("Complete log(s): ")]
    assert len(last) == 1 and last[0].startswith("Complete log(s): results/logs/snakemake/"), last  # not .snakemake/ in the container
    assert (wf / last[0].split()[2]).is_file()


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small ladder, run to the end once; the rerun tests below start from it."""
    wf = workflow_copy(tmp_path_factory.mktemp("e2e") / "wf")
    snakemake(wf, *small(wf))
    return wf


def test_dag_from_shards_to_report(done: Path) -> None:
    for f in RUNGS + OUTPUTS:
        assert (done / f).stat().st_size > 0, f
    rungs, root = read_ladder(str(done / "results/ladder.h5"))
    assert sorted(r["spec"] for r in rungs) == sorted(f.removeprefix("results/rungs/").removesuffix(".h5") for f in RUNGS)
    assert all(r["status"] == "ok" and r["world_size"] == 2 for r in rungs)  # 2 CPU ranks, no GPU
    prov = json.loads(root["provenance"])
    assert prov["site"] == "local" and prov["steps"] == 4
    assert (done / "results/shards/32px/manifest.json").exists() and (done / "results/shards/64px/manifest.json").exists()
    for log in ("aggregate", "plots", "report"):
        assert (done / f"results/logs/{log}.log").exists()
    assert "Nothing to be done" in snakemake(done, "-n", *small(done)).stdout


def test_rerun_one_rung_by_path_then_reaggregate(done: Path) -> None:
    before = mtimes(done)
    digest = {r["spec"]: r["source_sha256"] for r in read_ladder(str(done / "results/ladder.h5"))[0]}
    # targets first: --forcerun (-R) would swallow them
    snakemake(done, RUNGS[1], "--forcerun", RUNGS[1], *small(done))
    after = mtimes(done)
    assert after[RUNGS[1]] > before[RUNGS[1]]
    assert after[RUNGS[0]] == before[RUNGS[0]] and after[RUNGS[2]] == before[RUNGS[2]]
    # the ladder is now older than one of its rungs: a plain run re-aggregates, and only that
    assert jobs(snakemake(done, "-n", *small(done)).stdout) == {"aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1}
    snakemake(done, *small(done))
    now = {r["spec"]: r["source_sha256"] for r in read_ladder(str(done / "results/ladder.h5"))[0]}
    changed = {s for s in now if now[s] != digest[s]}
    assert changed == {"vit-debug/fsdp-full/fp32/pre-lag/n1/b4"}
    assert mtimes(done) == after


def test_rerun_one_model_by_config_selection(done: Path) -> None:
    before = mtimes(done)
    out = snakemake(done, *small(done), "--config", "select={models: [flava-debug]}", "--forcerun", "rung")
    after = mtimes(done)
    assert after[RUNGS[2]] > before[RUNGS[2]]
    assert after[RUNGS[0]] == before[RUNGS[0]] and after[RUNGS[1]] == before[RUNGS[1]]
    # the select run ends with the ladder, figures and report of what it selected, and says so
    rungs, _ = read_ladder(str(done / "results/ladder.h5"))
    assert [r["spec"] for r in rungs] == ["flava-debug/ddp/fp32/pre-lag/n1/b4"]
    assert "flava-debug" in (done / "results/report.md").read_text() and (done / "results/plots/pareto.png").exists()
    assert "select kept 1 of 3 rungs: results/ladder.h5, results/plots/ and results/report.html hold those only" in out.stderr
    assert jobs(snakemake(done, "-n", *small(done)).stdout) == {"aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1}
    snakemake(done, *small(done))  # a plain run puts every rung back, running none
    rungs, _ = read_ladder(str(done / "results/ladder.h5"))
    assert len(rungs) == 3 and mtimes(done) == after


def test_forcerun_names_each_rule_a_rung_can_be(wf: Path) -> None:
    """docs/workflow.md: `--forcerun rung` reruns only the `rung` rule's jobs, never a `max`
    rung (a `rung_max` job); rerunning a model's whole ladder takes `--forcerun rung rung_max`.
    Shown on the local ladder (it has max rungs) with every output in place, as a dry run:
    the outputs exist, so only the forced rules are planned."""
    conf = ("--config", "data={source: synthetic}", "select={models: [flava-debug]}")
    listing = snakemake(wf, *PROFILE, "--summary", *conf).stdout
    # One mtime for every output: a select run ends with its ladder and report, so a
    # rung touched after results/ladder.h5 (the listing's order) would plan the aggregate again.
    stamp = time.time()
    for line in listing.splitlines()[1:]:
        f = wf / line.split("\t")[0]
        if line.startswith("results/"):
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
            os.utime(f, (stamp, stamp))
    assert "Nothing to be done" in snakemake(wf, *PROFILE, "-n", *conf).stdout
    only_rung = jobs(snakemake(wf, *PROFILE, "-n", *conf, "--forcerun", "rung").stdout)
    both = jobs(snakemake(wf, *PROFILE, "-n", *conf, "--forcerun", "rung", "rung_max").stdout)
    assert only_rung["rung"] > 0 and "rung_max" not in only_rung
    assert both["rung"] == only_rung["rung"] and both["rung_max"] > 0


def test_aggregation_is_idempotent(done: Path) -> None:
    ladder = done / "results/ladder.h5"

    def snapshot() -> dict[str, object]:
        with h5py.File(ladder, "r") as f:
            return {"attrs": {k: str(v) for k, v in f.attrs.items() if k != "created_utc"},
                    "groups": sorted(n for n in f["rungs"].keys())}

    first = snapshot()
    snakemake(done, "results/ladder.h5", "--forcerun", "aggregate", *small(done))
    assert snapshot() == first


def test_rung_killed_mid_run_leaves_nothing_and_is_rerun(done: Path) -> None:
    """As Slurm does at a time limit: SIGTERM to every process of the job, SIGKILL later.
    The signal goes after rank 0's first step (its "step 1/" line), so it always lands in
    training, never in the ranks' start-up (a fixed sleep did not, on a loaded machine)."""
    target, log = RUNGS[0], done / RUNGS[0].replace("results/rungs", "results/logs/rungs").replace(".h5", ".log")
    (done / target).unlink()
    log.unlink()
    # steps=100000 makes the rung long; it only reaches this one job (the target)
    proc = subprocess.Popen(
        [os.path.join(VENV_BIN, "snakemake"), target, *small(done), "--config", "steps=100000"],
        cwd=done, env=snakemake_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (log.exists() and ": step 1/" in log.read_text()):
            time.sleep(0.5)
        assert log.exists() and ": step 1/" in log.read_text(), "the rung never took its first step"
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert not (done / target).exists()
    assert not [p for p in (done / "results/rungs").rglob("*") if p.is_file() and not p.name.endswith(".h5")]
    assert not list((done / "results/rungs").rglob("*.oom-rank*"))
    # the next run does exactly what is missing: that rung, then the aggregate and its products
    plan = jobs(snakemake(done, "-n", *small(done)).stdout)
    assert plan == {"rung": 1, "aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1}
    # and the rung runs again to a whole record (the aggregate and its products: every rerun
    # test here runs them; not again, for CI time)
    others = {r: (done / r).stat().st_mtime_ns for r in RUNGS[1:]}
    snakemake(done, target, *small(done))
    with h5py.File(done / target, "r") as f:
        assert f.attrs["status"] == "ok" and f.attrs["steps"] == 4 and len(f["loss"]) == 4
    assert {r: (done / r).stat().st_mtime_ns for r in RUNGS[1:]} == others


def test_an_oom_rung_is_a_result_and_the_ladder_goes_on(done: Path) -> None:
    """No CPU runs out of memory, so rank 1 is made to raise a real torch.OutOfMemoryError
    at step 2 (SCALELADDER_INJECT_OOM): torchrun stops the other rank, `launch` records
    the rung as 'oom' and exits 0, and Snakemake goes on to aggregate, plot and report."""
    oom_rung = RUNGS[1]
    # the rung by its path (targets first), forced: rank 1 runs out of memory at step 2
    snakemake(done, oom_rung, "--forcerun", oom_rung, *small(done), SCALELADDER_INJECT_OOM="1:2")  # exit 0: a result
    # and the ladder goes on: the next plain run aggregates, plots and reports it
    assert jobs(snakemake(done, "-n", *small(done)).stdout) == {"aggregate": 1, "export": 1, "plots": 1, "report": 1, "all": 1}
    snakemake(done, *small(done))
    status = {r["spec"]: r["status"] for r in read_ladder(str(done / "results/ladder.h5"))[0]}
    spec = oom_rung.removeprefix("results/rungs/").removesuffix(".h5")
    assert status.pop(spec) == "oom" and set(status.values()) == {"ok"}
    with h5py.File(done / oom_rung, "r") as f:
        assert "injected" in f.attrs["error"] and "items_per_s" not in f.attrs  # absent, not zero
    assert not list((done / "results/rungs").rglob("*.oom-rank*"))
    assert "An OOM rung is a result" in (done / "results/report.md").read_text()
    assert spec in (done / "results/report.md").read_text()
    # the OOM record is the rung's result: a plain rerun has nothing to do
    assert "Nothing to be done" in snakemake(done, "-n", *small(done)).stdout


def test_a_rung_predicted_not_to_fit_is_recorded_not_run(tmp_path: Path) -> None:
    """With a site plan_device, the DAG sends a rung the planner says cannot fit to the
    local `predicted_oom` rule instead of a rung job; the ladder records and plots it."""
    wf = workflow_copy(tmp_path / "wf")
    (wf / "planned.yaml").write_text("""
site: {plan_device: a100-40gb}
steps: 3
warmup: 1
data: {source: synthetic}
ladders:
  - models: [vit-debug, flava-10b]
    strategies: [ddp]
    batches: [4]
""")
    args = (*PROFILE, "--configfile", "profiles/local/site.yaml", "planned.yaml")
    plan = jobs(snakemake(wf, "-n", *args).stdout)
    assert plan == {"rung": 1, "predicted_oom": 1, "aggregate": 1, "export": 1, "plots": 1, "plan_plots": 1, "report": 1, "all": 1}
    snakemake(wf, *args)
    rungs = {r["spec"]: r for r in read_ladder(str(wf / "results/ladder.h5"))[0]}
    assert rungs["vit-debug/ddp/fp32/pre-lag/n1/b4"]["status"] == "ok"
    big = rungs["flava-10b/ddp/fp32/pre-lag/n1/b4"]
    assert big["status"] == "predicted-oom" and big["plan_device"] == "a100-40gb" and big["predicted_required_gib"] > 40
    assert not (wf / "results/rungs/flava-10b").exists()  # never ran
    assert (wf / "results/predicted/flava-10b/ddp/fp32/pre-lag/n1/b4.h5").exists()
    md = (wf / "results/report.md").read_text()
    assert "flava-10b" in md and "predicted-oom" in md
    # the planner's own figures join the report on a site that plans
    for f in ("fits", "predicted_vs_measured"):
        assert (wf / f"results/plots/{f}.png").stat().st_size > 10_000 and (wf / f"results/plots/{f}.pdf").exists()
        assert f"plots/{f}.png" in md
