"""Your models on the workflow, for real: a models file's entries (one of each source, a CLIP
from transformers among them) named in a ladder block, from shards to the report, their
records readable with no models file, and a bad models file refused when the DAG is made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import REPO, snakemake, workflow_copy

pytestmark = [pytest.mark.slow, pytest.mark.process]

PROFILE = ("--profile", "profiles/local")
MODELS = ["convnext-atto", "llama-tiny", "clip-tiny", "my-model"]
# config/your-models.yaml's ladder, two strategies: a process of its own, and FSDP2 over the ranks
SELECT = "select={strategies: [single, fsdp2-full]}"


def _copy(dest: Path) -> Path:
    wf = workflow_copy(dest)
    shutil.copytree(REPO / "examples", wf / "examples")
    return wf


def _config(wf: Path) -> tuple[str, ...]:
    return (*PROFILE, "--configfile", "profiles/local/site.yaml", "config/your-models.yaml")


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wf = _copy(tmp_path_factory.mktemp("yours") / "wf")
    snakemake(wf, *_config(wf), "--config", SELECT, "steps=4", "warmup=1")
    return wf


def test_each_source_runs_the_ladder_to_the_report(done: Path) -> None:
    # a process of its own: the ladder file is read with no models file registered
    code = (
        "import json, sys; from scaleladder.results.aggregate import read_ladder; "
        "r, _ = read_ladder('results/ladder.h5'); "
        "print(json.dumps(sorted((x['spec'], x['status'], x['world_size'], json.loads(x['model_entry'])['source']) for x in r)))"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], cwd=done, capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    got = {(spec.split("/")[0], spec.split("/")[1]) for spec, *_ in rows}
    assert got == {(m, s) for m in MODELS for s in ("single", "fsdp2-full")}
    assert all(status == "ok" for _, status, _, _ in rows), rows
    assert {spec.split("/")[0]: source for spec, _, _, source in rows} == {
        "convnext-atto": "timm", "llama-tiny": "transformers", "clip-tiny": "transformers", "my-model": "python"}
    assert {w for spec, _, w, _ in rows if "/fsdp2-full/" in spec} == {2}
    report = (done / "results/report.md").read_text()
    for m in MODELS:
        assert m in report


def test_a_bad_models_file_is_refused_when_the_dag_is_made(tmp_path: Path) -> None:
    wf = _copy(tmp_path / "wf")
    (wf / "bad.yaml").write_text("llama-tiny:\n  source: jax\n")
    out = snakemake(wf, *_config(wf), "-n", "--config", "models_file=bad.yaml", check=False)
    assert out.returncode != 0
    assert "models_file" in out.stdout + out.stderr and "jax" in out.stdout + out.stderr
