"""`scaleladder budget`: node-hours per ladder block before submission, from analytic FLOPs at a
stated MFU, calibrated by finished rungs (real HDF5 records planted in results/rungs/)."""

from __future__ import annotations

import argparse
import math
import re
import shutil
from pathlib import Path

import pytest

from conftest import REPO
from scaleladder.campaign import cost
from scaleladder.planner.devices import PEAKS
from scaleladder.results.store import write_record
from scaleladder.site import budget
from scaleladder.spec import RunSpec

PEAK_A100_BF16 = PEAKS["a100"].bf16


def time_model(**kw: object) -> cost.TimeModel:
    # predicted=False: the stated-MFU model these tests check; test_predicted_step_time the planner's
    base = dict(plan_device="a100-40gb", steps=100, mfu={"default": 0.5, "ddp": 0.4}, startup_s=60.0, probe_steps=5,
                predicted=False)
    base.update(kw)
    return cost.TimeModel(**base)  # type: ignore[arg-type]


def plant(root: Path, path: str, **attrs: object) -> None:
    write_record(root / "results" / "rungs" / f"{path}.h5", {"status": "ok", **attrs})


def test_stated_mfu_time_model() -> None:
    spec = RunSpec.from_path("vit-huge/ddp/bf16-mixed/pre-lag/n2/b32")
    est = cost.estimate(spec, 16, True, None, time_model(), {})
    step = 32 * cost.model_flops_per_sample(spec, 32 * 16) / (PEAK_A100_BF16 * 0.4)
    assert est.step_s == pytest.approx(step) and est.job_s == pytest.approx(100 * step + 60)
    assert est.node_hours == pytest.approx(2 * (100 * step + 60) / 3600)
    assert est.source == "stated mfu 0.40 (ddp)"
    # a strategy the table does not name falls back to its wrapper, then to 'default'
    assert cost.estimate(RunSpec.from_path("vit-huge/fsdp-full/bf16-mixed/pre-lag/n2/b32"), 16, True, None, time_model(), {}).source \
        == "stated mfu 0.50 (default)"


def test_predicted_step_time() -> None:
    """The planner's step time (compute, host, communication over the site's links)
    replaces the stated MFU; its source says predicted, with its parts."""
    from scaleladder.planner.rates import rates
    from scaleladder.planner.steptime import predict_step, site_from_config

    site = site_from_config({"timing": {"links": {"intra_node": {"alpha_us": 8, "gbps": 300},
                                                  "inter_node": {"alpha_us": 15, "gbps": 200}}}}, "t")
    spec = RunSpec.from_path("vit-huge/ddp/bf16-mixed/pre-lag/n2/b32")
    est = cost.estimate(spec, 16, True, None, time_model(predicted=True, site=site, ranks_per_node=8), {})
    want = predict_step(spec, 16, 8, 32, rates("a100-40gb", "bf16-mixed"), site)
    assert est.step_s == pytest.approx(want.step_time_s) and want.comm_s > 0
    assert est.source.startswith("predicted (") and "exposed" in est.source
    assert est.job_s == pytest.approx(100 * want.step_time_s + 60)
    # a -compile rung pays the site's stated compile time on top of its start-up
    site_c = site_from_config({"timing": {"compile_s": 45}}, "t")
    comp = cost.estimate(RunSpec.from_path("vit-huge/ddp-compile/bf16-mixed/pre-lag/n1/b32"), 8, True, None,
                         time_model(site=site_c), {})
    assert comp.startup_s == pytest.approx(60 + 45) and "stated compile 45 s" in comp.startup_source


def test_calibration_from_measured_rungs_of_the_same_model_and_strategy(tmp_path: Path) -> None:
    # two finished fsdp-full rungs of vit-huge (other nodes/batch), one of another strategy, one OOM
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n1/b16", step_time_mean_s=0.5, mfu=0.20)
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n4/b32", step_time_mean_s=0.9, mfu=0.30)
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n8/b32", step_time_mean_s=0.7, mfu=0.10)
    plant(tmp_path, "vit-huge/ddp/bf16-mixed/pre-lag/n1/b32", step_time_mean_s=0.3, mfu=0.45)
    write_record(tmp_path / "results/rungs/vit-huge/fsdp-full/bf16-mixed/pre-lag/n2/b64.h5", {"status": "oom"})
    measured = cost.read_measured([str(p) for p in (tmp_path / "results/rungs").rglob("*.h5")])
    assert len(measured) == 5

    spec = RunSpec.from_path("vit-huge/fsdp-full/bf16-mixed/pre-lag/n2/b32")
    est = cost.estimate(spec, 16, True, None, time_model(), measured)
    # the median of 0.20, 0.30, 0.10 (the OOM has no MFU; DDP is another strategy)
    mfu = 0.20
    assert est.step_s == pytest.approx(32 * cost.model_flops_per_sample(spec, 512) / (PEAK_A100_BF16 * mfu))
    assert est.source == ("calibrated mfu 0.200 from vit-huge/fsdp-full/bf16-mixed/pre-lag/n1/b16, "
                          "vit-huge/fsdp-full/bf16-mixed/pre-lag/n4/b32, vit-huge/fsdp-full/bf16-mixed/pre-lag/n8/b32")
    # a rung measured itself takes its own step time and costs nothing more
    own = cost.estimate(RunSpec.from_path("vit-huge/fsdp-full/bf16-mixed/pre-lag/n4/b32"), 32, True, None, time_model(), measured)
    assert own.measured and own.step_s == 0.9 and own.source == "measured (this rung)"
    # another model: the stated MFU still
    other = cost.estimate(RunSpec.from_path("vit-1b/fsdp-full/bf16-mixed/pre-lag/n2/b32"), 16, True, None, time_model(), measured)
    assert other.source == "stated mfu 0.50 (default)"
    # the estimate sharpens as the campaign runs: one more measurement moves the median
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n2/b16", step_time_mean_s=0.4, mfu=0.40)
    measured = cost.read_measured([str(p) for p in (tmp_path / "results/rungs").rglob("*.h5")])
    assert cost.estimate(spec, 16, True, None, time_model(), measured).source.startswith("calibrated mfu 0.250 from ")


def test_max_rungs_pay_for_the_search_and_unfit_rungs_cost_nothing() -> None:
    spec = RunSpec.from_path("vit-huge/ddp/bf16-mixed/pre-lag/n1/bmax")
    est = cost.estimate(spec, 8, True, 64, time_model(), {})
    step = 64 * cost.model_flops_per_sample(spec, 64 * 8) / (PEAK_A100_BF16 * 0.4)
    assert est.batch == 64 and est.job_s == pytest.approx(100 * step + 60 + math.ceil(math.log2(64)) * (5 * step + 60))
    none = cost.estimate(RunSpec.from_path("vit-15b/ddp/bf16-mixed/pre-lag/n1/b32"), 8, False, None, time_model(), {})
    assert not none.fits and none.node_hours == 0 and "does not fit" in none.source


def test_block_table_flags_jobs_over_the_time_limit() -> None:
    m = time_model(steps=100_000)
    long = cost.estimate(RunSpec.from_path("vit-huge/ddp/bf16-mixed/pre-lag/n1/b32"), 8, True, None, m, {})
    short = cost.estimate(RunSpec.from_path("vit-base/ddp/bf16-mixed/pre-lag/n1/b32"), 8, True, None, time_model(steps=10), {})
    rows = cost.block_table([("big", [long]), ("small", [short])], {"rung": 60.0})
    assert long.job_s / 60 > 60 and rows[0]["time limit"] == "60 min, 1 over" and rows[1]["time limit"] == "60 min"
    assert rows[2]["ladder block"] == "total" and rows[2]["to run"] == "2"
    assert float(rows[2]["node-hours to run"]) == pytest.approx(long.node_hours + short.node_hours, abs=0.06)


def _run(repo: Path, profile: str, tmp_path: Path) -> str:
    out = tmp_path / f"{profile}.md"
    args = argparse.Namespace(profile=profile, repo=str(repo), out=str(out), rungs=True)
    assert budget.main(args) == 0
    return out.read_text()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    wf = tmp_path / "wf"
    for part in ("profiles", "config", "workflow"):
        shutil.copytree(REPO / part, wf / part)
    return wf


def test_frontier_and_a100_budgets_in_node_hours(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "tester")
    for profile in ("frontier", "a100"):
        text = _run(repo, profile, tmp_path)
        total = next(line for line in text.splitlines() if line.startswith("| total |"))
        cells = [c.strip() for c in total.strip("|").split("|")]
        assert float(cells[6]) > 0, total  # node-hours to run
        assert f"Budget for profile {profile}" in text and "predicted (" in text
    # a compiled max rung is priced where its search starts: the eager rung's predicted max batch
    assert re.search(r"^vit-huge/fsdp2-full-compile/bf16-mixed/pf0/n1/bmax: .*at the eager rung's predicted max batch$", text, re.M)
    assert re.search(r"^vit-3b/ddp-compile/bf16-mixed/pre-lag/n1/bmax: .*not priced: its eager counterpart does not fit", text, re.M)
    # a finished rung counts as measured and drops out of what is left to pay
    before = next(line for line in text.splitlines() if line.startswith("| total |"))
    # MFU 0.6 over the stated 0.40: the calibrated max-batch rung gets cheaper too, so the total
    # visibly drops (with 0.3 the two effects can cancel within the table's 0.1 node-hour)
    plant(repo, "flava-350m/ddp/bf16-mixed/pre-lag/n1/b8", step_time_mean_s=0.2, mfu=0.6)
    after_text = _run(repo, "a100", tmp_path)
    after = next(line for line in after_text.splitlines() if line.startswith("| total |"))
    assert before.split("|")[5].strip() == "0" and after.split("|")[5].strip() == "1"
    assert float(after.split("|")[7]) <= float(before.split("|")[7])

    def left_to_pay(t: str) -> float:  # the per-rung lines, finer than the table's 0.1 node-hour
        return sum(float(m) for m in re.findall(r"= ([0-9.]+) node-h.*$", t, re.M)
                   ) - sum(float(m) for m in re.findall(r"= ([0-9.]+) node-h, [^;]*; measured \(this rung\)$", t, re.M))
    assert left_to_pay(after_text) < left_to_pay(text) - 0.03  # b8 (0.04 node-h) paid, its bmax cheaper
    assert "flava-350m/ddp/bf16-mixed/pre-lag/n1/b8: " in after_text and "measured (this rung)" in after_text
    assert "flava-350m/ddp/bf16-mixed/pre-lag/n1/bmax: " in after_text and "calibrated mfu 0.600 from flava-350m/ddp" in after_text


def test_the_report_shows_the_budget_beside_the_ladder(tmp_path: Path) -> None:
    from scaleladder.figures.report import with_budget

    ladder = str(tmp_path / "ladder.h5")
    assert with_budget("# report\n", ladder, html_page=False) == "# report\n"  # no budget.md: no section
    (tmp_path / "budget.md").write_text("| ladder block | node-hours to run |\n|---|---|\n| total | 48.9 |\n")
    md = with_budget("# report\n", ladder, html_page=False)
    assert md.endswith("## Budget\n\n| ladder block | node-hours to run |\n|---|---|\n| total | 48.9 |\n")
    page = with_budget("<html><body><h1>r</h1></body></html>", ladder, html_page=True)
    assert "<h2>Budget</h2>\n<pre>| ladder block" in page and page.endswith("</pre>\n</body></html>")


def test_start_up_is_priced_from_finished_rungs_and_scales_with_nodes(tmp_path: Path) -> None:
    """Measured start-up (startup_s + teardown_s of finished rungs) replaces the stated
    budget.rung_startup_s, at the same node count, else on the line through the node counts measured."""
    spec1 = RunSpec.from_path("vit-base/ddp/bf16-mixed/pre-lag/n1/b32")
    stated = cost.estimate(spec1, 8, True, None, time_model(), {})
    assert stated.startup_s == 60.0 and stated.startup_source.startswith("stated rung start-up 60 s")
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n1/b16", startup_s=10.0, teardown_s=1.0)
    plant(tmp_path, "vit-huge/ddp/bf16-mixed/pre-lag/n1/b16", startup_s=12.0, teardown_s=1.0)
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n4/b16", startup_s=19.0, teardown_s=1.0)
    plant(tmp_path, "vit-huge/fsdp-full/bf16-mixed/pre-lag/n8/b16", status="oom")  # no start-up in an oom record
    measured = cost.read_measured([str(p) for p in (tmp_path / "results/rungs").rglob("*.h5")])
    one = cost.estimate(spec1, 8, True, None, time_model(), measured)
    assert one.startup_s == pytest.approx(12.0) and "median of 2 rung(s) on 1 node(s)" in one.startup_source
    assert one.job_s == pytest.approx(100 * one.step_s + 12.0)
    # n2 was never measured: medians 12 s at 1 node and 20 s at 4 give 12 + 8/3 x (2 - 1)
    two = cost.estimate(RunSpec.from_path("vit-base/ddp/bf16-mixed/pre-lag/n2/b32"), 16, True, None, time_model(), measured)
    assert two.startup_s == pytest.approx(12.0 + 8.0 / 3.0) and "x nodes" in two.startup_source
    # the table shows start-up apart: an hour's stated start-up on 10 nodes is 10 node-hours of it
    big = cost.estimate(RunSpec.from_path("vit-base/ddp/bf16-mixed/pre-lag/n10/b32"), 80, True, None, time_model(startup_s=3600.0), {})
    rows = cost.block_table([("b", [big])], {})
    assert rows[0]["of which start-up"] == "10.0" and float(rows[0]["node-hours to run"]) >= 10.0


@pytest.mark.process
def test_budget_prices_what_select_keeps_as_the_dry_run_plans_it(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--config/--configfile as snakemake takes them, select applied, the jobs it priced
    equal to the dry run's rung jobs, and --top N the costliest first."""
    from conftest import snakemake

    shutil.copy2(REPO / "Snakefile", repo / "Snakefile")
    config = ["site={plan_device: a100-40gb}", "select={models: [vit-debug], batches: [4, max]}"]
    args = ["budget", "--profile", "profiles/local", "--repo", str(repo), "--config", *config, "--top", "3"]
    from scaleladder.cli import main as cli

    assert cli(args) == 0
    text = capsys.readouterr().out
    m = re.search(r"^Priced (\d+) rung\(s\) of the select: (\d+) rung job\(s\) to run \((\d+) rung, (\d+) rung_max\)", text, re.M)
    assert m, text
    dry = snakemake(repo, "-n", "--profile", "profiles/local", "--config", *config).stdout
    stats = dict(re.findall(r"^(rung|rung_max)\s+(\d+)$", dry[dry.index("Job stats:"):], re.M))
    assert (m[3], m[4]) == (stats.get("rung", "0"), stats.get("rung_max", "0")) and int(m[2]) > 0
    listed = re.findall(r"^\s+([0-9.]+) node-h  (\S+)", text[text.index("costliest"):], re.M)
    assert len(listed) == 3 and all(s.startswith("vit-debug/") for _, s in listed)
    assert [float(h) for h, _ in listed] == sorted((float(h) for h, _ in listed), reverse=True)
    assert "flava-debug" not in text  # select applied to the table and the lines
    # --configfile replaces the profile's site.yaml, as in snakemake: one without a site is refused
    (repo / "cut.yaml").write_text("select: {models: [vit-debug]}\n")
    assert cli(["budget", "--profile", "local", "--repo", str(repo), "--configfile", str(repo / "cut.yaml")]) == 2
    assert "no 'site' in them" in capsys.readouterr().err
    assert cli(["budget", "--profile", "local", "--repo", str(repo), "--config", "select"]) == 2
    assert "--config 'select': expected KEY=VALUE" in capsys.readouterr().err
