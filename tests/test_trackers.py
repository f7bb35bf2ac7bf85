"""The opt-in trackers: TensorBoard events a rung writes from its record, MLflow runs logged from a
ladder; read back with each tool's own reader, and refused or warned about as a user would need."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from conftest import in_process, seed_like_ladder
from scaleladder.results.aggregate import aggregate

SPEC = "vit-debug/single/fp32/pre-lag/n1/b4"


@pytest.mark.process
def test_a_rung_writes_its_record_as_tensorboard_events(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, board = tmp_path / "r.h5", tmp_path / "tb"
    p = subprocess.run([sys.executable, "-m", "scaleladder", "run", "--spec", SPEC, "--steps", "8", "--warmup", "2",
                        "--out", str(out), "--tensorboard", str(board)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ea = EventAccumulator(str(board / SPEC))
    ea.Reload()
    with h5py.File(out) as f:
        loss, times = f["loss"][()], f["step_time_s"][()]
        world, peak = int(f.attrs["world_size"]), f.attrs["peak_active_gib"]
    got = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    assert [s for s, _ in got["loss"]] == list(range(8))
    assert np.allclose([v for _, v in got["loss"]], loss, rtol=1e-6)
    assert np.allclose([v for _, v in got["step_time_s"]], times, rtol=1e-6)
    assert [s for s, _ in got["items_per_s"]] == list(range(2, 8))  # warm-up excluded, as from every statistic
    assert np.allclose([v for _, v in got["items_per_s"]], 4 * world / times[2:], rtol=1e-5)
    assert got["memory/peak_active_gib"] == [(7, pytest.approx(peak))]


@pytest.mark.process
def test_without_the_setting_run_imports_no_tracker() -> None:
    code = ("import sys, scaleladder.rung.run, scaleladder.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'mlflow')))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert p.stdout.strip() == "[]"


def test_a_tracker_that_fails_costs_a_warning_not_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from scaleladder.results.trackers import tensorboard_events
    from scaleladder.rung import run

    def full_disk(*_a: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensorboard_events, "write", full_disk)
    cfg = type("Cfg", (), {"tensorboard": str(tmp_path), "spec": type("S", (), {"path": SPEC})()})()
    run._tensorboard(cfg, {}, {})  # type: ignore[arg-type]  # no exception: a warning line


def test_tensorboard_missing_is_one_line_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from scaleladder.errors import SpecError
    from scaleladder.results.trackers import require

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(SpecError, match=re.escape("pip install 'scaleladder[tensorboard]'")):
        require("tensorboard", "tensorboard", "--tensorboard")


@pytest.fixture
def ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    files = seed_like_ladder(tmp_path)[:6]
    out = tmp_path / "results" / "ladder.h5"
    monkeypatch.chdir(tmp_path)  # as the workflow aggregates: from its working directory
    aggregate([os.path.relpath(f) for f in files], str(out))
    monkeypatch.chdir(Path(__file__).parent)
    return out


def test_mlflow_logs_one_run_per_rung_once(ladder: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    stamp = tmp_path / "mlflow.json"
    r = in_process("mlflow", "--ladder", str(ladder), "--uri", uri, "--stamp", str(stamp), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(stamp.read_text())["logged"] == 6
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("scaleladder")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    assert len(runs) == 6
    ok = next(x for x in runs if x.data.tags["status"] == "ok")
    assert ok.data.params["model"] == "flava-350m" and ok.data.params["strategy"] in {"ddp", "fsdp-full", "fsdp-full-ac"}
    assert ok.data.metrics["items_per_s"] > 0 and ok.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(ok.info.run_id)] == [Path(ok.data.tags["scaleladder.spec"]).name + ".h5"]
    again = in_process("mlflow", "--ladder", str(ladder), "--uri", uri, "--stamp", str(stamp), cwd=tmp_path)
    assert again.returncode == 0 and json.loads(stamp.read_text()) == {**json.loads(stamp.read_text()), "logged": 0, "skipped": 6}
    assert len(client.search_runs([exp.experiment_id], max_results=100)) == 6


def test_an_unreachable_tracker_warns_in_one_line_and_exits_zero(ladder: Path, tmp_path: Path) -> None:
    stamp = tmp_path / "mlflow.json"
    r = in_process("mlflow", "--ladder", str(ladder), "--uri", "http://127.0.0.1:9", "--stamp", str(stamp), cwd=tmp_path)
    assert r.returncode == 0
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "127.0.0.1:9" in warnings[0] and "unaffected" in warnings[0]
    assert "error" in json.loads(stamp.read_text())


@pytest.mark.parametrize("uri", ["results/mlflow.db", "sqlite:/x.db", "http://", "ftp://host/x"])
def test_a_malformed_uri_is_refused_when_the_config_is_read(uri: str) -> None:
    from scaleladder.site import config as site_config
    from test_settings import minimal

    with pytest.raises(site_config.ConfigError, match=r"trackers\.mlflow_uri"):
        site_config.validate_config({**minimal(), "trackers": {"mlflow_uri": uri}}, site_config.SCHEMA)
    site_config.validate_config({**minimal(), "trackers": {"mlflow_uri": "sqlite:///results/mlflow.db"}}, site_config.SCHEMA)


def test_a_run_left_unfinished_is_logged_again_not_skipped(ladder: Path, tmp_path: Path) -> None:
    """A call cut off mid-rung (the server went away) leaves a RUNNING run: the next call replaces it."""
    from mlflow.tracking import MlflowClient

    from scaleladder.results.aggregate import read_ladder
    from scaleladder.results.trackers import mlflow_runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    first = read_ladder(str(ladder))[0][0]
    exp = mlflow_runs.experiment(client, "scaleladder", uri)
    cut = client.create_run(exp, tags={mlflow_runs.SPEC_TAG: str(first["spec"]), mlflow_runs.SHA_TAG: str(first["source_sha256"])})
    r = in_process("mlflow", "--ladder", str(ladder), "--uri", uri, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = client.search_runs([exp], max_results=100)
    assert len(runs) == 6 and {x.info.status for x in runs} == {"FINISHED"}
    assert cut.info.run_id not in {x.info.run_id for x in runs}


def test_the_command_refuses_a_malformed_uri_as_the_schema_does(ladder: Path, tmp_path: Path) -> None:
    import yaml

    from scaleladder.results.trackers import mlflow_runs
    from scaleladder.site import config as site_config

    schema = yaml.safe_load(site_config.SCHEMA.read_text())
    assert schema["properties"]["trackers"]["properties"]["mlflow_uri"]["pattern"] == mlflow_runs.URI_PATTERN
    r = in_process("mlflow", "--ladder", str(ladder), "--uri", "results/mlflow.db", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "results/mlflow.db" in r.stderr
    assert not (tmp_path / "results" / "mlflow.db").exists()
