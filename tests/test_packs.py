"""Each rung's job time from the time model, rungs past the site's limit shortened or refused, and
packs: the rungs of one node count in one batch job (campaign/timelimit.py, campaign/packing.py,
site/schedule.py, `scaleladder budget`)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import in_process
from scaleladder.campaign import cost
from scaleladder.campaign.packing import Member, PackError, pack_rungs
from scaleladder.campaign.timelimit import MIN_MEASURED, Limits, interval_growth, judge
from scaleladder.results.stats import MIN_STEPS
from scaleladder.site import budget
from scaleladder.site import schedule as site_schedule
from scaleladder.site.profiles import load_profile
from scaleladder.spec import RunSpec
from test_budget import repo  # noqa: F401  (the fixture: the profiles, config and workflow in a folder of their own)

SPEC = RunSpec.from_path("vit-huge/ddp/bf16-mixed/pre-lag/n1/b32")


def est(step_s: float, steps: int, fixed_s: float = 100.0) -> cost.Estimate:
    return cost.Estimate(SPEC, 8, 1, 32, True, step_s, fixed_s + steps * step_s, "test", job_startup_s=40.0)


def test_a_job_asks_for_its_prediction_with_the_margin_in_whole_minutes() -> None:
    lim = Limits(limit_s=3600.0, margin=1.5, slack_s=300.0)
    assert lim.ask_min(600.0) == math.ceil((1.5 * 600 + 300) / 60) == 20
    assert lim.ask_min(10_000.0) == 60  # never past the limit
    assert lim.fits(2200.0) and not lim.fits(2201.0) and lim.most_s == 2200.0
    assert judge("a", est(1.0, 1000), 1000, 100, lim).kind == "runs"


def test_a_rung_past_the_limit_runs_fewer_steps_while_its_interval_holds() -> None:
    lim = Limits(limit_s=3600.0, margin=1.5, slack_s=300.0)  # at most 2200 s predicted
    v = judge("vit-huge/ddp/bf16-mixed/pre-lag/n1/b32", est(3.0, 1000), 1000, 100, lim)
    # (2200 - 100) / 3 = 700 steps, a multiple of 1000 // 20 = 50: 700; 600 measured of 900
    assert v.kind == "shortened" and v.steps == 700 and v.predicted_s == pytest.approx(100 + 700 * 3)
    assert lim.fits(v.predicted_s) and v.configured_s == pytest.approx(3100)
    assert v.line.startswith("vit-huge/ddp/bf16-mixed/pre-lag/n1/b32: predicted 52 min at 1000 steps")
    assert f"600 measured of 900, its interval about {interval_growth(600, 900):.2f}x as wide" in v.line
    # too few steps fit to keep MIN_MEASURED measured: refused in one line naming the rung, its prediction and the limit
    r = judge("vit-huge/ddp/bf16-mixed/pre-lag/n1/b32", est(30.0, 1000), 1000, 100, lim)
    assert r.kind == "refused" and r.steps == 1000
    assert r.line == ("vit-huge/ddp/bf16-mixed/pre-lag/n1/b32: predicted 502 min at 1000 steps; a job asks 1.5 x predicted "
                      "+ 300 s under the 60 min limit: refused (the 50 steps that fit are no more than its 100 of warm-up)")
    r2 = judge("x", est(10.0, 1000), 1000, 100, lim)  # 200 steps fit: 100 measured would do, 150 fit
    assert r2.kind == "shortened" and r2.steps == 200
    r3 = judge("x", est(12.0, 1000), 1000, 100, lim)  # 175 fit, 150 after rounding: 50 measured, under 100
    assert r3.kind == "refused" and r3.line.endswith("(the 150 steps that fit leave 50 measured, under the 100 its interval needs)")
    # a rung configured with fewer measured steps than MIN_MEASURED keeps all of them, or is refused
    assert judge("x", est(100.0, 40), 40, 10, lim).kind == "refused"
    assert MIN_STEPS < MIN_MEASURED


def test_the_interval_grows_as_t_over_the_root_of_the_steps() -> None:
    assert interval_growth(900, 900) == 1.0
    assert 1.41 < interval_growth(450, 900) < 1.5  # half the steps: sqrt(2), and t(20) over t(29)
    assert interval_growth(8, 900) == math.inf  # under MIN_STEPS: no interval at all


def test_packs_fill_jobs_up_to_the_limit_per_node_count() -> None:
    lim = Limits(limit_s=3600.0, margin=1.0, slack_s=0.0)
    members = [Member(f"r{i}.h5", 1 if i % 2 else 2, 1000.0) for i in range(7)]
    packs = pack_rungs(members, lim, 500.0, True)
    assert [p.name for p in packs] == ["n2-p1", "n2-p2", "n1-p1"]  # node counts in order of appearance
    assert [[m.file for m in p.members] for p in packs] == [["r0.h5", "r2.h5", "r4.h5"], ["r6.h5"], ["r1.h5", "r3.h5", "r5.h5"]]
    assert all(lim.fits(p.predicted_s(500.0)) for p in packs) and packs[0].predicted_s(500.0) == 3500.0
    # N rungs each: a pack of N past the limit is bad input, naming the pack, its prediction and the limit
    assert [len(p.members) for p in pack_rungs(members, lim, 500.0, 2)] == [2, 2, 2, 1]
    with pytest.raises(PackError, match=r"^pack n2-p1: 4 rungs on 2 node\(s\), predicted 75 min; a job asks 1 x predicted "
                                        r"\+ 0 s under the 60 min limit: too large \(site.pack 4"):
        pack_rungs(members, lim, 500.0, 4)


def _budget(repo: Path, profile: str, *config: str) -> str:  # noqa: F811
    r = in_process("budget", "--profile", profile, "--repo", str(repo), "--rungs", *(["--config", *config] if config else []))
    assert r.returncode == 0, r.stderr
    return r.stdout


def _totals(text: str) -> dict[str, str]:
    """The budget table's total row, by column."""
    row = next(line for line in text.splitlines() if line.startswith("| total |"))
    header = next(line for line in text.splitlines() if line.startswith("| ladder block |"))
    return dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))


def _total(text: str) -> float:
    return float(_totals(text)["node-hours to run"])


def test_no_job_of_a_shipped_profile_asks_past_its_limit(repo: Path) -> None:  # noqa: F811
    """The A100 profile's FLAVA max-batch rungs past its 240 min run fewer steps (each says so), none
    is refused, and no job of any cluster profile is over its limit."""
    for profile in ("a100", "frontier"):
        text = _budget(repo, profile)
        assert not re.search(r"\d+ over", text), text
        assert _totals(text).get("refused", "0") == "0"
    a100 = _budget(repo, "a100")
    shortened = re.findall(r"^(flava-[^:]+/bmax): predicted (\d+) min at 1000 steps; a job asks 1.5 x predicted \+ 300 s "
                           r"under the 240 min limit: runs (\d+) steps", a100, re.M)
    assert len(shortened) >= 9 and all(int(m) > 240 or int(s) < 1000 for _, m, s in shortened)
    over = {p for p, m, _ in shortened if int(m) > 240}
    assert len(over) == 9  # the nine the budget said were over before: each now runs fewer steps
    assert all(p.startswith(("flava-2.7b", "flava-4.8b", "flava-10b")) for p in over)


def test_packs_cut_frontiers_jobs_and_save_exactly_their_start_ups(repo: Path) -> None:  # noqa: F811
    before = _budget(repo, "frontier", "site={pack: false}")
    after = _budget(repo, "frontier")
    jobs_before = int(re.search(r"^Priced \d+ rung\(s\): (\d+) rung job\(s\) to run", before, re.M)[1])  # type: ignore[index]
    jobs_after = int(re.search(r"^Priced \d+ rung\(s\): (\d+) batch job\(s\) to run \((\d+) pack", after, re.M)[1])  # type: ignore[index]
    assert jobs_before >= 238 and jobs_after <= 40
    prof = load_profile("frontier", repo, plan=True)
    assert prof.ladder is not None
    sched = site_schedule.schedule(prof.ladder, "frontier", repo)
    assert sched is not None and sched.packs
    job = prof.ladder.settings.budget.job_startup_s
    saved = sum((len(p.members) - 1) * p.nodes for p in sched.packs) * (job or 0) / 3600
    assert _total(before) - _total(after) == pytest.approx(saved, abs=0.11)  # the table's 0.1 node-hour
    assert f"{saved:.1f} node-hours more" in after
    # per rung, the same rung costs its own part in a pack and its whole job alone
    blocks, _, _, _ = budget.estimates("frontier", repo)
    e = blocks[0][1][0]
    assert e.packed and e.node_hours == pytest.approx(e.nodes * (e.job_s - e.job_startup_s) / 3600) and e.job_startup_s == job


def test_packing_needs_a_batch_system_and_a_pack_the_limit_allows(repo: Path) -> None:  # noqa: F811
    r = in_process("budget", "--profile", "local", "--repo", str(repo), "--config", "site={pack: true, plan_device: a100-40gb}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "config key 'site.pack': site 'local' has no batch system to pack rungs into" in r.stderr
    r = in_process("budget", "--profile", "frontier", "--repo", str(repo), "--config", "site={pack: 50}")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "too large (site.pack 50" in r.stderr and "the 120 min limit" in r.stderr


def test_the_workflow_reads_the_same_schedule(repo: Path) -> None:  # noqa: F811
    """What a rung's job asks for and its steps, as the rules read them (common.smk, ladder.smk)."""
    prof = load_profile("a100", repo, plan=True)
    assert prof.ladder is not None
    ladder, sched = site_schedule.attach(prof.ladder, "a100", repo)
    assert sched is not None and not ladder.refused
    short = next(v for v in sched.verdicts.values() if v.kind == "shortened")
    spec = RunSpec.from_path(short.path)
    assert sched.steps(spec) == short.steps < 1000 and sched.runtime_min(spec) <= 240
    plain = RunSpec.from_path("flava-350m/ddp/bf16-mixed/pre-lag/n1/b8")
    assert sched.steps(plain) == 1000 and 5 <= sched.runtime_min(plain) < 240
    # a pack's arguments: each rung still to run, its own timeout and its prediction
    p = sched.packed[f"results/rungs/{plain.path}.h5"]
    args = site_schedule.pack_rung_args(sched, p.name)
    assert f"--rung results/rungs/{plain.path}.h5=" in args and args.count("--rung ") == len(p.members)
    assert sched.pack_runtime_min(p) <= 240
    # without a batch system there is no schedule, and a workstation's rungs ask for no time
    local = load_profile("local", repo, plan=True)
    assert local.ladder is not None and site_schedule.attach(local.ladder)[1] is None


def test_inner_snakemake_options_carry_the_config() -> None:
    line = site_schedule.inner_snakemake("/w/Snakefile", [Path("/w/profiles/x/site.yaml")], ["select={'models': ['a b']}"])
    assert line.startswith("--snakefile /w/Snakefile --cores 1 --nolock --rerun-incomplete")
    assert "--executor local --configfiles /w/profiles/x/site.yaml --config 'select={'\"'\"'models'\"'\"': ['\"'\"'a b'\"'\"']}'" in line
    from snakemake.settings.types import DeploymentSettings
    from snakemake_interface_executor_plugins.settings import DeploymentMethod

    deploy = DeploymentSettings(deployment_method={DeploymentMethod.CONDA}, conda_prefix=Path("/w/.envs"))
    line = site_schedule.inner_snakemake("/w/Snakefile", [], None, deploy)
    assert line.endswith("--executor local --software-deployment-method conda --conda-prefix /w/.envs")


def test_a_budget_without_packs_is_as_before(repo: Path) -> None:  # noqa: F811
    """The local profile has no batch system: no time asked, no packs, no new columns."""
    blocks, limits, _, sched = budget.estimates("local", repo, overrides={"site": {"plan_device": "a100-40gb"}})
    assert sched is None and limits == {} and not any(e.packed or e.refused for _, ests in blocks for e in ests)
    text = _budget(repo, "local", "site={plan_device: a100-40gb}")
    assert "shortened" not in text and "pack" not in text


# -- the driver, `scaleladder pack`, with a real inner Snakemake on a workflow of its own --------

TINY = """
rule rung:
    output: "results/rungs/{name}.h5"
    params: wait=lambda w: {"slow": 60}.get(w.name, 0)
    shell: "sleep {params.wait}; touch {output}"
"""


def _pack(wf: Path, *rungs: str, limit_min: float = 10, snakefile: str = TINY, out: str = "results/packs/n1-p1.json",
          **env: str) -> subprocess.Popen[str]:
    (wf / "Snakefile").write_text(snakefile)
    argv = [sys.executable, "-m", "scaleladder", "pack", "--pack", "n1-p1", "--limit-min", str(limit_min),
            *(a for r in rungs for a in ("--rung", r)), "--out", out, "--",
            "--snakefile", "Snakefile", "--cores", "1", "--nolock", "--executor", "local", "--quiet"]
    # no squeue here: the driver takes its start and the limit from it as the allocation's
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.Popen(argv, cwd=wf, env={**base, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


RUNGS = ("results/rungs/a.h5=30:1", "results/rungs/slow.h5=3:1", "results/rungs/c.h5=30:1")  # FILE=TIMEOUT_S:PREDICTED_S


def _statuses(err: str) -> list[str]:
    from scaleladder.campaign.pack import last_record

    return [r["status"] for r in last_record(err)["rungs"]]  # type: ignore[attr-defined]


@pytest.mark.process
def test_a_hung_rung_stops_at_its_own_timeout_and_the_pack_goes_on(tmp_path: Path) -> None:
    p = _pack(tmp_path, *RUNGS, SLURM_JOB_ID="7")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1
    assert _statuses(err) == ["recorded", "stopped at its timeout, 3 s", "recorded"]
    assert err.strip().splitlines()[-1] == ("scaleladder pack: error: pack n1-p1: 2 of 3 rung(s) recorded; no result: "
                                            "results/rungs/slow.h5 (stopped at its timeout, 3 s)")
    notes = json.loads((tmp_path / "results/failed/slow.h5.json").read_text())
    assert notes[-1]["reason"] == "stopped at its timeout, 3 s in pack n1-p1; no result written"
    assert not (tmp_path / "results/packs/n1-p1.json").exists()  # the checkpoint waits for every rung
    # the rerun runs only the missing rung, and the pack's record is written once all are there
    rerun = [r.replace("=3:", "=60:") for r in RUNGS]  # its own timeout now well past a Snakemake's start
    again = _pack(tmp_path, *rerun, snakefile=TINY.replace('"slow": 60', '"slow": 0'), SLURM_JOB_ID="7")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert _statuses(err) == ["recorded already", "recorded", "recorded already"]
    assert json.loads((tmp_path / "results/packs/n1-p1.json").read_text())["pack"] == "n1-p1"


@pytest.mark.process
def test_the_allocations_end_keeps_every_finished_rung(tmp_path: Path) -> None:
    """SIGTERM (Slurm at the time limit, scancel, a node failure) while the second rung runs."""
    p = _pack(tmp_path, "results/rungs/a.h5=60:1", "results/rungs/slow.h5=90:1", "results/rungs/c.h5=60:1", SLURM_JOB_ID="7")
    deadline = time.monotonic() + 60
    while not (tmp_path / "results/rungs/a.h5").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the second rung's Snakemake is running its sleep
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert _statuses(err) == ["recorded", "stopped: the allocation is ending (SIGTERM)", "to run"]
    notes = json.loads((tmp_path / "results/failed/slow.h5.json").read_text())
    assert notes[-1]["reason"].startswith("stopped: the allocation is ending (SIGTERM) in pack n1-p1")
    assert sorted(p.name for p in (tmp_path / "results/rungs").iterdir()) == ["a.h5"]


@pytest.mark.process
def test_the_driver_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    for env, want in (({}, "pack n1-p1: no batch job here (no SLURM_JOB_ID): packing needs a batch system"),
                      ({"SLURM_JOB_ID": "7"}, "pack n1-p1: its 2 rungs are predicted at 13 min, past the job's 10 min limit")):
        p = _pack(tmp_path, "results/rungs/a.h5=900:400", "results/rungs/c.h5=900:400", **env)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.count("\n") == 1 and want in err, err
        assert not (tmp_path / "results/rungs").exists()
    for rungs, limit, want in ((["results/rungs/a.h5"], 10, "--rung 'results/rungs/a.h5': expected FILE=TIMEOUT_S:PREDICTED_S"),
                               (["results/rungs/a.h5=0:1"], 10, "expected a file, a timeout > 0 s and a prediction >= 0 s"),
                               (["results/rungs/a.h5=9:1"], 0, "--limit-min 0.0: expected minutes > 0")):
        p = _pack(tmp_path, *rungs, limit_min=limit, SLURM_JOB_ID="7")
        _, err = p.communicate(timeout=60)
        assert p.returncode == 2 and err.count("\n") == 1 and want in err, err
        assert not (tmp_path / "results/rungs").exists()


@pytest.mark.process
def test_a_pack_record_that_cannot_be_written_loses_no_rung(tmp_path: Path) -> None:
    """The checkpoint's file under a path that cannot be a folder: one line naming it, exit 1, the rung kept."""
    (tmp_path / "blocker").write_text("a file, not a folder")
    p = _pack(tmp_path, "results/rungs/a.h5=30:1", out="blocker/n1-p1.json", SLURM_JOB_ID="7")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1
    assert err.strip().splitlines()[-1].startswith("scaleladder pack: error: cannot write blocker/n1-p1.json"), err
    assert (tmp_path / "results/rungs/a.h5").is_file() and _statuses(err) == ["recorded"]
    assert (tmp_path / "blocker").read_text() == "a file, not a folder"
    assert not [f for f in tmp_path.rglob("*") if ".tmp" in f.name and ".snakemake" not in f.parts]  # no temporary file


def test_bad_time_limit_and_pack_settings_are_one_line(repo: Path) -> None:  # noqa: F811
    for config, key in (("site={pack: 1}", "site.pack"), ("site={time_limit_min: 0}", "site.time_limit_min"),
                        ("budget={margin: 0.5}", "budget.margin")):
        r = in_process("budget", "--profile", "frontier", "--repo", str(repo), "--config", config)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and key in r.stderr, (config, r.stderr)


@pytest.mark.process
def test_a_shortened_rungs_job_runs_fewer_steps_and_its_record_says_so(tmp_path: Path) -> None:
    """The A100 profile, one job per rung: a FLAVA max-batch rung predicted past 240 min asks for its own
    time under the limit, runs 500 steps, and passes the configured 1000 on (the record's steps_configured)."""
    from conftest import snakemake, workflow_copy

    wf = workflow_copy(tmp_path / "wf")
    target = "results/rungs/flava-4.8b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax.h5"
    out = snakemake(wf, "-n", "-p", "--profile", "profiles/a100", "--config", "site={pack: false}",
                    "select={models: [flava-4.8b]}", "--", target)
    text = out.stdout + out.stderr
    assert re.search(r"^scaleladder: flava-4\.8b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax: predicted \d+ min at 1000 steps; "
                     r"a job asks 1\.5 x predicted \+ 300 s under the 240 min limit: runs 500 steps", text, re.M), text
    job = text[text.index(f"output: {target}"):]
    job = job[:job.index("\n\n")]
    runtime = int(re.search(r"runtime=(\d+)", job)[1])  # type: ignore[index]
    assert 0 < runtime <= 240
    assert " --steps 500 " in job and " --shortened-from 1000" in job


def test_the_record_of_a_shortened_rung_keeps_the_configured_steps() -> None:
    import argparse

    from scaleladder.results.record import Settings
    from scaleladder.rung.run_config import add_arguments, config_from_args

    def attrs(argv: list[str]) -> dict[str, object]:
        p = argparse.ArgumentParser()
        add_arguments(p)
        return config_from_args(p.parse_args(argv)).attrs()

    argv = ["--spec", "vit-debug/ddp/fp32/pre-lag/n1/b4", "--steps", "500", "--shortened-from", "1000", "--out", "x.h5"]
    assert attrs(argv)[Settings.steps_configured] == 1000
    assert Settings.steps_configured not in attrs(argv[:4] + argv[6:])
