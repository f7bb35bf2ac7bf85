"""`scaleladder export`: a ladder as one tidy table, read back as a user would (pandas)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from conftest import in_process, seed_like_ladder, write_rung
from scaleladder.results import export, outputs

FAILED_SPEC = "vit-huge/ddp/bf16-mixed/pre-lag/n2/b16"


@pytest.fixture
def ladder(tmp_path: Path) -> Path:
    """The seed-like ladder (ok, oom, predicted-oom), one corrupt rung file, a failed spec with
    two notes and no result, and a failure note beside a rung that has one."""
    files = seed_like_ladder(tmp_path)
    bad = write_rung(tmp_path, "vit-1b/ddp/bf16-mixed/pre-lag/n1/b8")
    bad.write_bytes(b"not hdf5 at all")
    files.append(bad)
    failed = tmp_path / "results" / "failed"
    note = failed / f"{FAILED_SPEC}.h5.json"
    note.parent.mkdir(parents=True)
    note.write_text(json.dumps([{"spec": FAILED_SPEC, "when": "2026-01-01T00:00:00", "rc": 1, "reason": "first"},
                                {"spec": FAILED_SPEC, "when": "2026-01-02T00:00:00", "rc": 137, "reason": "killed, second"}]))
    repeat = failed / f"{FAILED_SPEC}.r1.h5.json"  # a repeat's note counts for its rung
    repeat.write_text(json.dumps([{"when": "2026-01-01T12:00:00", "rc": 1, "reason": "repeat 1"}]))
    redone = failed / "vit-base/ddp/bf16-mixed/pre-lag/n1/b32.h5.json"
    redone.parent.mkdir(parents=True)
    redone.write_text(json.dumps([{"when": "2026-01-01T00:00:00", "rc": 1, "reason": "node died"}]))
    out = tmp_path / "results" / "ladder.h5"
    r = in_process("aggregate", "--out", str(out), *map(str, files))
    assert r.returncode == 0, r.stderr
    return out


def test_csv_has_one_row_per_rung_of_every_status(ladder: Path) -> None:
    out = ladder.parent / "rungs.csv"
    r = in_process("export", "--ladder", str(ladder), "--out", str(out))
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out)
    assert df["spec"].is_unique
    assert set(df["status"]) == {"ok", "oom", "predicted-oom", "corrupt", "failed"}
    failed = df.set_index("spec").loc[FAILED_SPEC]
    assert (failed["status"], failed["failed_attempts"], failed["rc"], failed["reason"]) == ("failed", 3, 137, "killed, second")
    assert not df["spec"].str.contains(r"\.r1$").any()
    assert failed["model"] == "vit-huge" and failed["nodes"] == 2 and failed["wrapper"] == "ddp"
    assert df.set_index("spec").loc["vit-base/ddp/bf16-mixed/pre-lag/n1/b32", "failed_attempts"] == 1
    # the spec's fields come first, apart, as the docs list them
    assert list(df.columns[:5]) == ["spec", "status", "model", "strategy", "wrapper"]
    assert set(df["ac"]) <= {"none", "full", "reentrant", "selective"} and "full" in set(df["ac"])


def test_dtypes_are_what_the_docs_state(ladder: Path) -> None:
    out = ladder.parent / "rungs.csv"
    assert in_process("export", "--ladder", str(ladder), "--out", str(out)).returncode == 0
    df = pd.read_csv(out)
    for col in ("items_per_s", "mfu", "peak_reserved_gib", "nodes", "world_size", "hybrid_group"):
        assert pd.api.types.is_numeric_dtype(df[col]), (col, df[col].dtype)
    for col in ("spec", "status", "model", "precision", "knobs", "ac"):
        assert pd.api.types.is_string_dtype(df[col]), (col, df[col].dtype)
    assert df["compile"].dtype == bool  # true/false without a gap
    # the sidecar names each column's unit and meaning, from record.py
    units = pd.read_csv(ladder.parent / "rungs.columns.csv").set_index("column")
    assert list(units.index) == list(df.columns)
    assert units.loc["items_per_s", "unit"] == "items/s" and "GiB" in units.loc["peak_reserved_gib", "unit"]


def test_parquet_and_jsonl_hold_what_csv_holds(ladder: Path) -> None:
    tables = {}
    for suffix in (".csv", ".parquet", ".jsonl"):
        out = ladder.parent / f"rungs{suffix}"
        assert in_process("export", "--ladder", str(ladder), "--out", str(out)).returncode == 0
        tables[suffix] = out
    csv = pd.read_csv(tables[".csv"])
    pq = pd.read_parquet(tables[".parquet"])
    js = pd.read_json(tables[".jsonl"], lines=True)
    assert list(pq.columns) == list(csv.columns) == list(js.columns)
    for col in ("items_per_s", "nodes", "status", "spec", "reason"):
        for other in (pq, js):
            a, b = csv[col].tolist(), other[col].tolist()
            assert [None if isinstance(x, float) and math.isnan(x) else x for x in a] == \
                   [None if isinstance(x, float) and math.isnan(x) else x for x in b], col
    assert pq["items_per_s"].dtype == "float64" and pq["nodes"].dtype == "int64"


def test_steps_table_streams_every_step(ladder: Path) -> None:
    out, steps = ladder.parent / "rungs.csv", ladder.parent / "steps.parquet"
    r = in_process("export", "--ladder", str(ladder), "--out", str(out), "--steps", str(steps))
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(steps)
    ok = (pd.read_csv(out)["status"] == "ok").sum()
    assert list(df.columns) == list(export.STEP_COLUMNS)
    assert df["step"].dtype == "int64" and df["warmup"].dtype == bool and df["host_issue_s"].dtype == "float64"
    assert df["spec"].nunique() == ok and len(df) == 6 * ok  # write_rung: 6 steps, 2 of them warm-up
    assert df.groupby("spec")["warmup"].sum().eq(2).all()
    assert df["step_time_s"].eq(0.1).all()


@pytest.mark.parametrize(("case", "want"), [
    ("suffix", r"rungs\.xlsx: unknown table format '\.xlsx'"),
    ("not-a-ladder", r"not a scaleladder ladder file"),
    ("missing", r"no such file"),
    ("garbage", r"not a readable HDF5 file"),
    ("failed", r"nowhere: no such folder \(--failed"),
])
def test_bad_input_is_one_line_and_no_file(ladder: Path, tmp_path: Path, case: str, want: str) -> None:
    import h5py

    src, out = ladder, tmp_path / "out" / "rungs.csv"
    if case == "suffix":
        out = tmp_path / "out" / "rungs.xlsx"
    elif case == "not-a-ladder":
        src = tmp_path / "other.h5"
        with h5py.File(src, "w") as f:
            f.attrs["status"] = "ok"
    elif case == "missing":
        src = tmp_path / "nothing.h5"
    else:
        src = tmp_path / "garbage.h5"
        src.write_bytes(b"garbage")
    r = in_process("export", "--ladder", str(src), "--out", str(out), *(["--failed", "nowhere"] if case == "failed" else []))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and re.search(want, r.stderr), r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_unwritable_output_is_one_line(ladder: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    steps = tmp_path / "steps.csv"
    r = in_process("export", "--ladder", str(ladder), "--out", str(steps), "--steps", str(blocker / "rungs.csv"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "rungs.csv" in r.stderr, r.stderr
    assert not steps.exists()  # every output checked before any is written


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_rows_stream_in_row_groups_with_the_kinds_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        suffix: str) -> None:
    from scaleladder.results.outputs import parquet_out

    monkeypatch.setattr(parquet_out, "CHUNK", 3)
    pulled = []

    def rows():  # a generator: no format may need the whole table first
        for i in range(10):
            pulled.append(i)
            yield {"n": i, "x": None if i < 5 else i / 2, "flag": i % 2 == 0}

    out = tmp_path / f"t{suffix}"
    outputs.write_table(out, ("n", "x", "flag"), rows(), {"x": "double"})
    df = {".csv": pd.read_csv, ".jsonl": lambda p: pd.read_json(p, lines=True), ".parquet": pd.read_parquet}[suffix](out)
    assert pulled == list(range(10)) and df["n"].tolist() == list(range(10))
    assert df["x"].isna().sum() == 5 and df["x"].iloc[9] == 4.5 and df["flag"].dtype == bool
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        assert pq.ParquetFile(out).num_row_groups == 4 and df["x"].dtype == "float64"


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    with pytest.raises(Exception, match=r"pip install 'scaleladder\[parquet\]'"):
        outputs.format_of(tmp_path / "x.parquet")


def test_writers_need_no_third_party_package_for_csv_and_jsonl() -> None:
    import ast
    import inspect

    from scaleladder.results.outputs import csv_out, jsonl_out

    for module in (csv_out, jsonl_out, export):
        imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(inspect.getsource(module)))
                    if isinstance(n, ast.Import | ast.ImportFrom) for a in getattr(n, "names", [])}
        imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(inspect.getsource(module)))
                     if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"pandas", "pyarrow"}, module.__name__


def test_docs_column_table_is_generated_from_record() -> None:
    text = (Path(__file__).parents[1] / "docs" / "results.md").read_text()
    assert export.markdown() in text


def test_the_workflow_writes_the_table_and_its_report_carries_it() -> None:
    repo = Path(__file__).parents[1]
    rules = repo / "workflow" / "rules"
    text = (rules / "report.smk").read_text()
    m = re.search(r'report\("results/rungs\.csv", caption="([^"]+)", category="([^"]+)"\)', text)
    assert m, "rule export's table is not in Snakemake's report"
    caption = (rules / m.group(1)).resolve()
    assert caption.is_file() and "rungs.columns.csv" in caption.read_text()
    assert re.search(r"localrules:[^#]*\bexport,", text)
