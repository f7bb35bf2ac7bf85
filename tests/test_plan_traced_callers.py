"""Every caller of the planner with a models-file model (campaign/plan_trace.traced_model): the
traced answer, or one line saying it has none and the command that makes it; never a traceback,
never an analytic number.

* Torch-free and cache-only: the workflow's fit check while the DAG is built
  (site/ladder.planned_not_to_fit), ``budget`` (campaign/cost.py), ``plan --fits-table`` /
  ``--time-chart`` / ``--vs-measured``, ``maxbatch``'s planned start as ``budget`` asks it.
* Tracing where the cache lacks one (a job: torch is loaded): ``launch --plan-device`` and
  ``--plan-only``, ``maxbatch``'s planned start.

The traces here are PLANTED: a cache file written as ``plan_trace.trace`` writes one (the key,
the torch version, the code fingerprint), holding a peak chosen to fit or not, so that no test
traces (tests/test_plan_trace.py holds the traces themselves)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

import h5py
import pytest
import yaml

from conftest import REPO, in_process
from scaleladder import flavors
from scaleladder.campaign import cost
from scaleladder.campaign.plan_trace import (
    TRACE_BATCHES,
    NotTraced,
    Trace,
    Untraceable,
    cache_path,
    code_fingerprint,
    torch_version,
    traced_model,
    traced_rung,
)
from scaleladder.flavors import get_flavor
from scaleladder.models import families as family_module
from scaleladder.models.flava_impl import SDPA
from scaleladder.spec import RunSpec, SpecError

EXAMPLES = REPO / "examples" / "models.yaml"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
GIB = 2**30
H100 = "h100-80gb"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model registry as it is, put back after the test (what it registers goes)."""
    monkeypatch.setattr(flavors, "_TABLE", dict(flavors._TABLE))
    monkeypatch.setattr(flavors, "FLAVORS", MappingProxyType(flavors._TABLE))
    monkeypatch.setattr(family_module, "_LOADED", dict(family_module._LOADED))


@pytest.fixture
def models_file(registry: None) -> Path:
    """examples/models.yaml's entries registered for this test only."""
    from scaleladder.models.models_file import register_models_file

    register_models_file(EXAMPLES)
    return EXAMPLES


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default trace cache ($SCALELADDER_CACHE/plan-traces), empty, for this test only."""
    monkeypatch.setenv("SCALELADDER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "plan-traces"


def plant(cache: Path, spec_path: str, world: int, gib: float, per_sample_gib: float = 0.001,
          flops: float = 2e9) -> Path:
    """A cached trace of ``spec_path`` at ``world`` ranks as plan_trace.trace keeps one: ``gib`` of
    parameters, ``per_sample_gib`` of activations per sample, ``flops`` per sample."""
    from scaleladder.campaign import plan_trace

    plan_trace._installed_code.cache_clear()  # the code as it is now: a process of its own reads it afresh
    spec = RunSpec.from_path(spec_path)
    t = traced_rung(spec, world)
    b1, b2 = TRACE_BATCHES
    params, act = int(gib * GIB), (int(b1 * per_sample_gib * GIB), int(b2 * per_sample_gib * GIB))
    moments = {"step|forward-backward|0": {"Parameter": (params, params), "Activation": act,
                                           "Total": (params + act[0], params + act[1])}}
    tr = Trace(f"{t.spec.model}/{t.spec.strategy}/{t.spec.precision}/{t.spec.knobs}", t.world, TRACE_BATCHES, moments,
               flops, flops / 3, 64, 600, 1000, 4, torch_version(), code_fingerprint(get_flavor(spec.model)), 1.0)
    path = cache_path(t, SDPA, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tr.as_json()))
    return path


def test_every_models_file_model_is_planned_by_its_trace_decided_from_its_entry(models_file: Path) -> None:
    # a python entry is not imported to decide it (its module imports torch; the torch-free tests below check)
    assert all(traced_model(get_flavor(m)) for m in ("my-model", "llama-tiny", "convnext-atto"))
    assert not traced_model(get_flavor("vit-debug")) and not traced_model(get_flavor("flava-350m"))
    with pytest.raises(SpecError, match="my-model is a models-file model: no analytic FLOPs count"):
        cost.model_flops_per_sample(RunSpec.from_path("my-model/single/fp32/pre-lag/n1/b4"), 4)


# -- the DAG ------------------------------------------------------------------------------------

LADDER = {"models": ["my-model", "llama-tiny"], "strategies": ["single", "fsdp2-full", "fsdp-full", "fsdp2-full-compile"],
          "precisions": ["fp32"], "batches": [4]}
SITE = {"name": "testsite", "ranks_per_node": 4, "scaleladder": "sl", "launcher": "L {ranks} x", "supervise": "launch",
        "plan_device": H100}


def dag_config() -> dict[str, object]:
    cfg: dict[str, object] = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg.update(site=SITE, ladders=[LADDER], models_file=str(EXAMPLES), data={"source": "synthetic"})
    return cfg


def test_the_dag_judges_a_models_file_rung_by_its_cached_trace_and_notes_the_rest_once(models_file: Path, cache: Path) -> None:
    import io

    from scaleladder.site import ladder as site_ladder

    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 200.0)  # 200 GiB of parameters: never on 80 GB
    plant(cache, "llama-tiny/single/fp32/pre-lag/n1/b4", 1, 0.01)
    log = io.StringIO()
    ladder = site_ladder.prepare(dag_config(), SCHEMA, log=log, gpu_count=lambda: 0)
    assert ladder.predicted_oom == {"my-model/single/fp32/pre-lag/n1/b4"}
    notes = [line for line in log.getvalue().splitlines() if "not judged" in line]
    assert len(notes) == 1, log.getvalue()
    note = notes[0]
    # fsdp2-full of both (no trace), fsdp-full of both (FSDP1 on 4 ranks: no trace can be made); never the compiled ones
    assert note.startswith(f"scaleladder: 4 rung(s) of models-file models were not judged by the planner on {H100}: they run")
    assert "2 of them the fake tensors cannot trace (FSDP1 on 4 ranks" in note
    assert "2 have no cached trace" in note and f"2 trace(s) missing from {cache}" in note
    assert (f"for s in my-model/fsdp2-full/fp32/pf0/n1/b4 llama-tiny/fsdp2-full/fp32/pf0/n1/b4; do scaleladder plan --models "
            f"{EXAMPLES} --device {H100} --gpus-per-node 4 --spec \"$s\"; done") in note
    assert "predicted not to fit" in log.getvalue()  # the cached verdict's own note, as for any rung


def test_the_note_traces_a_single_rung_at_one_rank(models_file: Path, cache: Path) -> None:
    from scaleladder.campaign.plan_trace import trace_command

    specs = [RunSpec.from_path(p) for p in ("my-model/single/fp32/pre-lag/n1/b4", "my-model/ddp/fp32/pre-lag/n1/b4")]
    # `plan` refuses single at more than one rank per node: its own loop at 1
    assert trace_command(specs, H100, 4, str(EXAMPLES)) == (
        f"scaleladder plan --models {EXAMPLES} --device {H100} --gpus-per-node 4 --spec my-model/ddp/fp32/pre-lag/n1/b4; "
        f"scaleladder plan --models {EXAMPLES} --device {H100} --gpus-per-node 1 --spec my-model/single/fp32/pre-lag/n1/b4")


NO_TORCH = """
import io, json, sys, time
for name in ("torch", "torchvision", "torchmultimodal", "timm", "transformers"):
    sys.modules[name] = None  # `import torch` now raises ImportError
t0 = time.perf_counter()
from scaleladder.site import ladder as site_ladder
log = io.StringIO()
ladder = site_ladder.prepare(json.loads(sys.argv[1]), sys.argv[2], log=log, gpu_count=lambda: 0)
assert not any(m.split(".")[0] in ("torch", "timm", "transformers", "my_model") and sys.modules[m] is not None for m in sys.modules)
print(json.dumps({"oom": sorted(ladder.predicted_oom), "log": log.getvalue(), "seconds": time.perf_counter() - t0}))
"""


@pytest.mark.process
def test_the_dag_reads_a_cached_trace_without_torch(models_file: Path, cache: Path) -> None:
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 200.0)
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, json.dumps(dag_config()), str(SCHEMA)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["oom"] == ["my-model/single/fp32/pre-lag/n1/b4"]
    assert got["log"].count("not judged") == 1 and "5 rung(s) of models-file models were not judged" in got["log"]


@pytest.mark.process
def test_snakemake_routes_a_models_file_rung_to_predicted_oom_by_its_cached_trace(tmp_path: Path, models_file: Path,
                                                                                 cache: Path) -> None:
    from conftest import snakemake, workflow_copy

    wf = workflow_copy(tmp_path / "wf")
    shutil.copytree(REPO / "examples", wf / "examples")
    over = ["site={plan_device: h100-80gb, ranks_per_node: 2}", "data={source: synthetic}"]
    args = ("-n", "--profile", "profiles/local", "--configfile", "profiles/local/site.yaml", "config/your-models.yaml", "--config", *over)
    before = snakemake(wf, *args, SCALELADDER_CACHE=str(cache.parent))
    assert (before.stdout + before.stderr).count("were not judged by the planner") == 1
    assert "predicted_oom" not in before.stdout
    plant(cache, "clip-tiny/single/fp32/pre-lag/n1/b4", 1, 200.0)  # its ddp rung shares the trace: two verdicts
    after = snakemake(wf, *args, SCALELADDER_CACHE=str(cache.parent))
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", after.stdout[after.stdout.index("Job stats:"):], re.M))
    assert jobs["predicted_oom"] == "2", after.stdout[-3000:]


# -- launch and maxbatch: jobs, which trace a rung the cache lacks --------------------------------


def test_launch_plan_only_records_a_models_file_rung_by_its_trace(tmp_path: Path, models_file: Path, cache: Path) -> None:
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 200.0)
    out = tmp_path / "r.h5"
    base = ("launch", "--plan-device", H100, "--ranks-per-node", "1", "--models", str(EXAMPLES), "--launcher", "false")
    p = in_process(*base, "--plan-only", "--spec", "my-model/single/fp32/pre-lag/n1/b4", "--out", str(out),
                   env={"SCALELADDER_CACHE": str(cache.parent)})
    assert p.returncode == 0, p.stderr
    with h5py.File(out) as f:
        assert f.attrs["status"] == "predicted-oom" and f.attrs["predicted_required_gib"] > 200
    # FSDP1 on two ranks: no trace can be made, so no verdict: --plan-only refuses to record one, in one line
    p = in_process("launch", "--plan-device", H100, "--ranks-per-node", "2", "--models", str(EXAMPLES), "--launcher", "false",
                   "--plan-only", "--spec", "my-model/fsdp-full/fp32/pre-lag/n1/b4", "--out", str(tmp_path / "f.h5"),
                   env={"SCALELADDER_CACHE": str(cache.parent)})
    assert p.returncode == 2 and "FSDP1 on 2 ranks cannot be traced" in p.stderr and "no verdict to record" in p.stderr
    assert "Traceback" not in p.stderr


def test_maxbatch_starts_at_the_traced_max_batch(models_file: Path, cache: Path) -> None:
    from scaleladder.campaign.maxbatch import planned_start

    spec = RunSpec.from_path("my-model/fsdp2-full/fp32/pf0/n1/bmax")
    with pytest.raises(NotTraced):  # budget's question: the cache only
        planned_start(spec, H100, 2, cached_only=True)
    plant(cache, "my-model/fsdp2-full/fp32/pf0/n1/b4", 2, 1.0, per_sample_gib=0.5)
    start, hopeless = planned_start(spec, H100, 2)
    assert start is not None and 100 < start < 160 and not hopeless  # ~75 GiB of 0.5 GiB samples
    compiled, hopeless = planned_start(RunSpec.from_path("my-model/fsdp2-full-compile/fp32/pf0/n1/bmax"), H100, 2, cached_only=True)
    assert compiled == start and not hopeless  # its eager rung's trace
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 200.0)
    assert planned_start(RunSpec.from_path("my-model/single/fp32/pre-lag/n1/bmax"), H100, 1) == (None, True)
    # FSDP1 on several ranks: no planned start (the search starts at 1); budget hears why
    assert planned_start(RunSpec.from_path("my-model/fsdp-full/fp32/pre-lag/n1/bmax"), H100, 2) == (None, False)
    with pytest.raises(Untraceable):
        planned_start(RunSpec.from_path("my-model/fsdp-full/fp32/pre-lag/n1/bmax"), H100, 2, cached_only=True)


# -- budget -------------------------------------------------------------------------------------


def time_model(**kw: object) -> cost.TimeModel:
    base: dict[str, object] = dict(plan_device="a100-40gb", steps=100, mfu={"default": 0.5}, startup_s=60.0, probe_steps=5)
    base.update(kw)
    return cost.TimeModel(**base)  # type: ignore[arg-type]


def test_budget_prices_a_models_file_rung_from_its_trace_else_says_its_fallback(models_file: Path, cache: Path) -> None:
    from scaleladder.campaign.plan_trace import step_time
    from scaleladder.planner.rates import rates

    spec = RunSpec.from_path("my-model/single/bf16-mixed/pre-lag/n1/b32")
    # no trace, no record, no time limit: not priced, counted apart, never a zero passed off as a price
    none = cost.estimate(spec, 1, True, None, time_model(), {})
    assert not none.priced and none.source.startswith("not priced: a models-file model with no cached trace at world 1")
    # a time limit bounds the job
    bound = cost.estimate(spec, 1, True, None, time_model(limits_s={"rung": 3600.0}), {})
    assert bound.priced and bound.fallback and bound.job_s == 3600.0
    assert bound.source.endswith("priced at the rung job's time limit, 60 min (an upper bound)")
    # a finished rung of the same model recorded its FLOPs: the stated MFU prices them
    done = RunSpec.from_path("my-model/ddp/bf16-mixed/pre-lag/n1/b8")
    measured = {done.path: cost.Measured(done, "ok", None, None, 8, flops_per_sample=3e9)}
    rec = cost.estimate(spec, 1, True, None, time_model(predicted=False), measured)
    assert rec.fallback and rec.step_s == pytest.approx(32 * 3e9 / (cost.plan_device_peak_flops("a100-40gb", "bf16-mixed") * 0.5))
    assert f"FLOPs per sample recorded by {done.path}" in rec.source and "(no cached trace at world 1)" in rec.source
    # its cached trace: the planner's step time from it, and the stated MFU from its FLOPs
    plant(cache, spec.path, 1, 0.1, flops=2e9)
    traced = cost.estimate(spec, 1, True, None, time_model(), {})
    tr = cost.cached_trace(spec, 1, cached_only=True)[0]
    assert not traced.fallback and traced.source.startswith("predicted from its cached trace (")
    assert traced.step_s == pytest.approx(step_time(spec, 1, 32, tr, rates("a100-40gb", "bf16-mixed"), time_model().site).step_time_s)
    stated = cost.estimate(spec, 1, True, None, time_model(predicted=False), {})
    assert stated.source == "stated mfu 0.50 (default); FLOPs per sample traced"
    rows = cost.block_table([("b", [none, bound, traced])], {})
    assert rows[0]["untraced, priced by fallback"] == "1" and rows[0]["not priced"] == "1"
    assert "untraced, priced by fallback" not in cost.block_table([("b", [traced])], {})[0]  # only where there is one


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    wf = tmp_path / "wf"
    for part in ("profiles", "config", "workflow", "examples"):
        shutil.copytree(REPO / part, wf / part)
    return wf


def test_budget_with_a_models_file_prices_each_rung_and_names_the_traces_it_lacks(
        repo: Path, registry: None, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scaleladder.models.models_file import register_models_file

    monkeypatch.chdir(repo)
    monkeypatch.setenv("USER", "tester")
    register_models_file("examples/models.yaml")  # the copy's, as the command registers it
    plant(cache, "llama-tiny/single/fp32/pre-lag/n1/b4", 1, 0.01)
    p = in_process("budget", "--models", "examples/models.yaml", "--profile", "a100", "--repo", str(repo),
                   "--configfile", "profiles/a100/site.yaml", "config/your-models.yaml", "--rungs")
    assert p.returncode == 0, p.stderr
    lines = {line.split(": ", 1)[0]: line for line in p.stdout.splitlines() if line.startswith(("llama-tiny/", "my-model/"))}
    assert "predicted from its cached trace" in lines["llama-tiny/single/fp32/pre-lag/n1/b4"]
    assert "predicted from its cached trace" in lines["llama-tiny/ddp/fp32/pre-lag/n1/b4"]  # single's trace + buckets
    assert "priced at the rung job's time limit" in lines["my-model/single/fp32/pre-lag/n1/b4"]
    assert "fake tensors cannot trace FSDP1 on 8 ranks" in lines["my-model/fsdp-full/fp32/pre-lag/n1/b4"]
    note = next(line for line in p.stdout.splitlines() if "have no cached trace to price them by" in line)
    assert note.startswith("22 rung(s) of models-file models") and "scaleladder plan --models examples/models.yaml" in note
    assert "llama-tiny/single/" not in note and "Traceback" not in p.stderr


# -- plan's tables and charts: the cache only ----------------------------------------------------


def test_the_fits_table_shows_traced_cells_and_the_command_for_the_rest(models_file: Path, cache: Path) -> None:
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 1.0, per_sample_gib=0.5)
    p = in_process("plan", "--models", str(EXAMPLES), "--fits-table", "--device", H100, "--gpus-per-node", "1",
                   "--precision", "fp32", env={"SCALELADDER_CACHE": str(cache.parent)})
    assert p.returncode == 0, p.stderr
    from scaleladder.campaign.plan_trace import predict

    want = predict(RunSpec.from_path("my-model/single/fp32/pre-lag/n1/bmax"), 1, 1, H100, cached_only=True).prediction.max_batch
    row = next(line for line in p.stdout.splitlines() if line.startswith("my-model "))
    assert row.split()[1:3] == ["max", str(want)] and "no trace" in row, row
    assert "vit-base " in p.stdout  # the analytic models as ever
    note = next(line for line in p.stdout.splitlines() if line.startswith("scaleladder plan: "))
    assert "cell(s) of models-file models not planned: no cached trace" in note and "--gpus-per-node 1 --spec" in note
    js = in_process("plan", "--models", str(EXAMPLES), "--fits-table", "--device", H100, "--gpus-per-node", "1",
                    "--precision", "fp32", "--json", env={"SCALELADDER_CACHE": str(cache.parent)})
    cells = {(c["model"], c["strategy"]): c for c in json.loads(js.stdout)}
    mine = cells[("my-model", "single")]
    assert mine["fits"] and mine["max_batch"] > 100 and mine["step_time_s"] > 0
    assert any("traced aten ops" in s for s in mine["step_time_sources"])
    assert cells[("my-model", "ddp")]["fits"]  # single's trace + DDP's buckets
    assert cells[("my-model", "fsdp2-full")]["reason"] == "no cached trace" and "not planned" in js.stderr


@pytest.mark.process
def test_the_fits_table_of_a_models_file_runs_without_torch(models_file: Path, cache: Path) -> None:
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 1.0)
    code = ("import sys\nfor m in ('torch', 'torchvision', 'torchmultimodal', 'timm', 'transformers'): sys.modules[m] = None\n"
            "from scaleladder.cli import main\n"
            f"rc = main(['plan', '--models', {str(EXAMPLES)!r}, '--fits-table', '--device', 'h100-80gb', '--gpus-per-node', '1'])\n"
            "assert 'my_model' not in sys.modules\nsys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SCALELADDER_CACHE": str(cache.parent)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "my-model" in proc.stdout and "not planned: no cached trace" in proc.stdout


def test_vs_measured_plans_a_models_file_rung_by_its_cached_trace(models_file: Path, cache: Path) -> None:
    from scaleladder.figures.plan_plots import _point

    record = {"status": "ok", "peak_active_gib": 1.5, "world_size": 1, "ranks_per_node": 1, "batch": "16", "data": "synthetic"}
    missing: list[tuple[NotTraced, int]] = []
    assert _point(record, "my-model/single/fp32/pre-lag/n1/b16", H100, missing) is None
    assert [(m.spec.path, rpn) for m, rpn in missing] == [("my-model/single/fp32/pre-lag/n1/b16", 1)]
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 1.0, per_sample_gib=0.03125)
    pt = _point(record, "my-model/single/fp32/pre-lag/n1/b16", H100, missing)
    assert pt is not None and pt.predicted_gib == pytest.approx(1.5) and pt.measured_gib == 1.5


def test_the_time_chart_plans_a_models_file_ladder_from_its_traces(repo: Path, models_file: Path, cache: Path,
                                                                   tmp_path: Path) -> None:
    site = repo / "profiles" / "local" / "site.yaml"
    cfg = yaml.safe_load(site.read_text())
    cfg.update(models_file=str(EXAMPLES), ladders=[{"models": ["my-model"], "strategies": ["single", "fsdp2-full"],
                                                    "precisions": ["fp32"], "batches": [4], "nodes": [1]}])
    cfg["site"]["max_nodes"] = 2
    site.write_text(yaml.safe_dump(cfg))
    plant(cache, "my-model/single/fp32/pre-lag/n1/b4", 1, 1.0)
    out = tmp_path / "t.png"
    p = in_process("plan", "--time-chart", str(out), "--profile", "local", "--repo", str(repo), "--device", H100,
                   "--gpus-per-node", "1", "--json", env={"SCALELADDER_CACHE": str(cache.parent)})
    assert p.returncode == 0, p.stderr
    pts = json.loads(p.stdout)
    assert [(x["strategy"], x["nodes"]) for x in pts] == [("single", 1)] and pts[0]["items_per_s"] > 0
    assert out.is_file()
    assert "2 point(s) of models-file models not planned" in p.stderr and "my-model/fsdp2-full/fp32/pf0/n2/b4" in p.stderr
    # single at more ranks than one: no point, as for any model (the analytic planner refuses the world too)

