"""The one record definition (results/record.py): every writer's names are in it, the docs'
table is generated from it, and an older record (without newer fields) still reads."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from scaleladder.results import record
from scaleladder.results.record import OK, Attr, Interval, Spec, Throughput, UnknownAttr, checked

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
BEGIN, END = "<!-- BEGIN record table", "<!-- END record table -->"
REGENERATE = (f"regenerate it: python -c \"import re, pathlib, scaleladder.results.record as r; p = pathlib.Path('docs/design.md'); "
              f"s = p.read_text(); i = s.index('{BEGIN}'); i = s.index(chr(10), i) + 1; j = s.index('{END}'); "
              "p.write_text(s[:i] + r.markdown() + s[j:])\"")


def test_docs_table_is_the_definition() -> None:
    text = DESIGN.read_text()
    assert BEGIN in text and END in text, f"docs/design.md lost its record-table markers ({BEGIN} ... {END})"
    start = text.index("\n", text.index(BEGIN)) + 1
    assert text[start:text.index(END)] == record.markdown(), f"docs/design.md's record table differs from results/record.py; {REGENERATE}"


@pytest.mark.process
def test_the_module_prints_the_table() -> None:
    out = subprocess.run([sys.executable, "-m", "scaleladder.results.record", "--markdown"], capture_output=True, text=True, check=True)
    assert out.stdout == record.markdown()


def test_each_name_is_defined_once_per_kind_with_a_meaning() -> None:
    for kind in record.KINDS:
        names = [str(a) for s in kind.sections for a in s.fields] + [str(a) for a in kind.fields]
        assert len(names) == len(set(names)), f"{kind.name}: a name in two of its sections"
    for section in record.SECTIONS:
        assert section.title and section.fields, section
        for a in section.fields:
            assert isinstance(a, Attr) and a.doc and a.section == section.__name__ and re.fullmatch(r"[a-z][a-z0-9_]*", a)
    assert Throughput.items_per_s == "items_per_s" and Throughput.items_per_s.unit == "items/s"
    assert {Interval.items_per_s_ci_low: 1}["items_per_s_ci_low"] == 1  # a name is a plain dict key


def test_an_unknown_name_is_caught_before_anything_is_written(tmp_path: Path) -> None:
    from scaleladder.results.store import write_record

    with pytest.raises(UnknownAttr, match="'items_per_sec' is not defined for a 'ok' record: add it to a section of src/scaleladder/"):
        write_record(tmp_path / "r.h5", {"status": "ok", "items_per_sec": 1.0})
    assert not list(tmp_path.iterdir())
    with pytest.raises(UnknownAttr, match="'mfu' is not defined for a 'oom' record"):
        checked({"status": "oom", "mfu": 0.5})
    assert checked({"status": "oom", "error": "x"}) == {"status": "oom", "error": "x"}
    assert record.kind_of({"kind": "convergence", "status": "did-not-converge"}) is record.CONVERGENCE


def test_outside_the_tests_an_unknown_name_warns_and_the_record_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A real run's record is never lost over a name (results/record.checked's TRAP)."""
    import h5py

    from scaleladder import log
    from scaleladder.results.store import write_record

    assert os.environ[record.STRICT_ENV] == "1"  # the suite's own setting (tests/conftest.py)
    monkeypatch.delenv(record.STRICT_ENV)
    log.setup()
    write_record(tmp_path / "r.h5", {"status": "ok", "items_per_sec": 1.0})
    with h5py.File(tmp_path / "r.h5") as f:
        assert dict(f.attrs) == {"status": "ok", "items_per_sec": 1.0}
    err = capsys.readouterr().err
    assert "scaleladder: warning: record attribute 'items_per_sec' is not defined for a 'ok' record" in err


def test_every_producer_of_record_attributes_uses_defined_names() -> None:
    """The helpers that add attributes to an ok record, called where they are torch-free."""
    from scaleladder.results.stats import between_runs, within_run
    from scaleladder.rung.device_peak import PeakInfo
    from scaleladder.rung.run_config import RunConfig
    from scaleladder.rung.startup import StartupClock
    from scaleladder.spec import RunSpec

    ok = OK.names()
    for path in ("vit-base/fsdp-hybrid2-ac/bf16-mixed/post-nolag-fwd/n2/b8", "vit-base/fsdp2-full-compile/bf16-mixed/pf2/n1/bmax",
                 "flava-350m/ddp/fp32/pre-lag/n1/b4"):
        spec = RunSpec.from_path(path)
        cfg = RunConfig(spec, 10, 2, "synthetic", 0, 0, 1e-4, Path("x.h5"), "cpu", None, None, "auto")
        assert set(cfg.attrs()) <= ok, set(cfg.attrs()) - ok
    clock = StartupClock()
    for phase in ("imports", "group", "build", "first_batch"):
        clock.mark(phase)
    produced = {**within_run(np.full(20, 0.1), 2, 100.0), **between_runs([1.0, 2.0, 3.0], [(1.0, 0.9, 1.1)] * 3),
                **PeakInfo(1.0, "", 0, math.nan).attrs(), **clock.attrs(teardown_s=0.1)}
    assert set(produced) <= ok | record.LADDER_RUNG.names(), set(produced) - ok


# The helpers that need torch, a GPU or a loader to run: every string key they put into a
# record (dict literals, subscript assignments) is read from their source instead.
SOURCES = {
    "src/scaleladder/rung/feed.py": "record_attrs",
    "src/scaleladder/data/loader.py": "record_attrs",
    "src/scaleladder/data/devdecode.py": "record_attrs",
    "src/scaleladder/rung/profiling.py": None,  # self.written["..."] in several methods
    # rung/what_ran.py's sharding_ran keys its dict by record.Build's names: defined by construction
}


def _string_keys(tree: ast.AST) -> set[str]:
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
    return keys


def test_record_keys_in_torch_side_sources_are_defined() -> None:
    ok = OK.names()
    for rel, func in SOURCES.items():
        tree = ast.parse((ROOT / rel).read_text())
        if func:
            tree = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func)
        else:
            tree = ast.Module(body=[n for n in ast.walk(tree) if isinstance(n, ast.Assign) and "written" in ast.unparse(n.targets[0])],
                              type_ignores=[])
        keys = _string_keys(tree)
        assert keys, rel
        assert keys <= ok, f"{rel}: {sorted(keys - ok)} not defined in results/record.py"


def _old_rung(root: Path, spec: str, items_per_s: float) -> Path:
    """A record as an early version wrote it: no interval, no start-up, no placement, no se/dof."""
    from scaleladder.spec import RunSpec

    s = RunSpec.from_path(spec)
    path = root / f"{s.path}.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.attrs.update({"status": "ok", **{k: v for k, v in s.as_attrs().items() if not k.startswith("knob_")},
                        "steps": 6, "warmup": 2, "world_size": 1, "device_name": "old", "items_per_s": items_per_s,
                        "samples_per_s": items_per_s, "mfu": 0.1, "peak_reserved_gib": 1.0})
        f.create_dataset("step_time_s", data=np.full(6, 0.1))
    return path


def test_an_older_record_still_reads_into_the_ladder_report_and_compare(tmp_path: Path) -> None:
    from scaleladder.figures.report import render_markdown
    from scaleladder.results.aggregate import aggregate, read_ladder
    from scaleladder.results.compare import compare

    files = [_old_rung(tmp_path / "rungs", "vit-base/ddp/bf16-mixed/pre-lag/n1/b8", 100.0)]
    aggregate([str(f) for f in files], str(tmp_path / "ladder.h5"))
    rungs, root = read_ladder(str(tmp_path / "ladder.h5"))
    (r,) = rungs
    assert r[Spec.spec] == "vit-base/ddp/bf16-mixed/pre-lag/n1/b8" and math.isnan(r[Interval.items_per_s_ci_low])
    assert "startup_s" not in r and "rank_placement" not in r
    page = render_markdown(rungs, root, "plots", figures=())
    row = next(line for line in page.splitlines() if line.startswith("| vit-base/ddp"))
    assert row.endswith("| - | - | - |")  # compile s, start-up s, where ranks ran: absent, not zero
    (verdict,) = compare({r[Spec.spec]: r}, {r[Spec.spec]: {**r, "items_per_s": 101.0}})
    assert verdict.verdict == "same" and "judged on tolerance alone" in verdict.notes[0]
    assert json.loads(root["status_counts"]) == {"ok": 1}
