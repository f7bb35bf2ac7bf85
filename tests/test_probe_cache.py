"""The unused-parameter probe's disk cache (rung/probe_cache.py): the same answer as
the probe, read back by a fresh process, never a stale one, and never a failure when the
cache folder cannot be written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaleladder.rung import probe_cache, unused_params

FRESH = """import json, sys
from scaleladder.rung.unused_params import unused_parameter_names
print(json.dumps(sorted(unused_parameter_names(sys.argv[1]))))
"""


def fresh(family: str, cache: Path) -> list[str]:
    run = subprocess.run([sys.executable, "-c", FRESH, family], env={**os.environ, "SCALELADDER_CACHE": str(cache)},
                         capture_output=True, text=True, check=True, timeout=300)
    names: list[str] = json.loads(run.stdout)
    return names


@pytest.mark.process
@pytest.mark.parametrize("family", ["vit", "flava"])
def test_the_cached_answer_is_the_probes_and_a_fresh_process_reads_it(tmp_path: Path, family: str) -> None:
    cold = fresh(family, tmp_path)  # probes, then stores
    files = list(tmp_path.glob(f"unused-params-{family}-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == cold
    if family == "flava":
        assert cold, "FLAVA's debug flavor has parameters no loss reaches (heads, poolers)"
    # what a fresh process returns comes from the file: plant a marker answer under the same name
    files[0].write_text(json.dumps(["planted.weight"]))
    assert fresh(family, tmp_path) == ["planted.weight"]


def test_the_name_changes_with_torch_and_family(monkeypatch: pytest.MonkeyPatch) -> None:
    a = probe_cache.key("flava")
    assert probe_cache.key("vit") != a
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert probe_cache.key("flava") != a


def test_an_unwritable_or_corrupt_cache_only_costs_the_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SCALELADDER_CACHE", str(blocker / "sub"))  # a folder under a file: cannot be made
    monkeypatch.setattr(unused_params, "_UNUSED_CACHE", {})
    assert unused_params.unused_parameter_names("vit") == frozenset()
    monkeypatch.setenv("SCALELADDER_CACHE", str(tmp_path / "c"))
    monkeypatch.setattr(unused_params, "_UNUSED_CACHE", {})
    probe_cache.path("vit").parent.mkdir(parents=True)
    probe_cache.path("vit").write_text("{not json")
    assert probe_cache.load("vit") is None
    assert unused_params.unused_parameter_names("vit") == frozenset()
    assert probe_cache.load("vit") == frozenset()  # rewritten whole
    assert not list((tmp_path / "c").glob(".*.tmp"))
