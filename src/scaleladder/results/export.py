"""`scaleladder export`: every rung of a ladder as one tidy table (CSV, Parquet or JSON Lines).

One row per rung, whatever its status: ``ok``, ``oom``, ``predicted-oom``, ``corrupt`` (from
the ladder file) and ``failed`` (a spec with failure notes under ``failed/`` beside the ladder
and no result: campaign/supervise.note_failure writes them, the ladder never holds them).

Columns, in this order, each present when at least one row has it:

- the spec: ``spec``, ``status``, its fields apart (:data:`SPEC_COLUMNS`), with ``ac`` the
  checkpointing form (``none``, ``full``, ``reentrant``, ``selective``), the one column not
  stored in a record;
- every scalar attribute a record may hold, in results/record.py's order (its unit and
  meaning are the record's own: docs/results.md's column table is generated from it, and the
  sidecar ``<out stem>.columns<suffix>`` beside every table lists column, unit and meaning);
- ``failed_attempts`` (failure notes of the spec) and, for a failed row, its last note;
- attributes a record holds that record.py does not define (an older or newer writer), by name.

``--steps FILE`` adds the long table: one row per rung and step (``spec``, ``step``,
``warmup``, ``step_time_s``, ``loss``, ``host_issue_s``), read rung by rung, so that no more
than one rung's arrays are held at once. Without it no per-step dataset is read.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import h5py
import numpy as np

from scaleladder.errors import SpecError
from scaleladder.results import outputs
from scaleladder.results.outputs import Cell
from scaleladder.results.record import SECTIONS, Attr, FailedAttempt, Read, Record, Spec
from scaleladder.results.store import open_h5
from scaleladder.spec import RunSpec

#: the spec's fields, first and apart (``ac`` is derived: the checkpointing form)
SPEC_COLUMNS: tuple[str, ...] = (Spec.spec, Record.status, Spec.model, Spec.strategy, Spec.wrapper, Spec.sharding,
                                 Spec.hybrid_group, "ac", Spec.compile, Spec.precision, Spec.knobs, Spec.nodes, Spec.batch,
                                 Read.spec_batch)
AC_DOC = "activation checkpointing form: none | full | reentrant | selective (from the spec)"
FAILED_COLUMNS = ("failed_attempts", FailedAttempt.when, FailedAttempt.rc, FailedAttempt.reason)
FAILED_DOCS = {"failed_attempts": ("count", "failure notes of this spec under failed/ (campaign/supervise.note_failure)")}
REPEAT = re.compile(r"\.r[1-9][0-9]*$")  # a repeat's file stem: <spec>.r<k>
STEP_COLUMNS = ("spec", "step", "warmup", Read.step_time_s, Read.loss, "host_issue_s")
STEP_KINDS = {"spec": "string", "step": "int64", "warmup": "bool", Read.step_time_s: "double", Read.loss: "double",
              "host_issue_s": "double"}
STEP_DOCS = {"spec": ("", "the rung's spec path"), "step": ("index", "step number, from 0"),
             "warmup": ("bool", "a warm-up step, excluded from every statistic"),
             Read.step_time_s: ("s", Read.step_time_s.doc), Read.loss: ("", Read.loss.doc),
             "host_issue_s": ("s", "rank 0's host time to issue the step (docs/metrics.md)")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ladder", required=True, help="the aggregated ladder file (results/ladder.h5)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help=f"the table; its suffix names the format ({', '.join(outputs.FORMATS)})")
    p.add_argument("--steps", metavar="FILE", default=None,
                   help="also the long per-step table (spec, step, warmup, step time, loss, host issue time)")
    p.add_argument("--failed", metavar="DIR", default=None,
                   help="the failure notes (default: failed/ beside the ladder)")


# -- the columns ------------------------------------------------------------------------------


def record_attrs() -> list[Attr]:
    """Every attribute a stored record may hold, in record.py's order, each once."""
    seen: dict[str, Attr] = {}
    for section in SECTIONS:
        if section.stored and section is not FailedAttempt:
            for a in section.fields:
                seen.setdefault(str(a), a)
    return list(seen.values())


def column_docs() -> dict[str, tuple[str, str]]:
    """column -> (unit, meaning), from record.py's own definitions."""
    docs = {str(a): (a.unit, a.doc) for a in record_attrs()}
    docs["ac"] = ("", AC_DOC)
    docs[Read.spec_batch] = (Read.spec_batch.unit, Read.spec_batch.doc)
    docs.update(FAILED_DOCS)
    docs.update({str(a): (a.unit, a.doc) for a in FailedAttempt.fields})
    return docs


def column_order() -> list[str]:
    return list(dict.fromkeys([*SPEC_COLUMNS, *(str(a) for a in record_attrs()), *FAILED_COLUMNS]))


def columns_of(rows: list[dict[str, Cell]]) -> list[str]:
    """The canonical columns some row has, then any other (undefined) attribute by name."""
    present = {k for r in rows for k in r}
    known = [c for c in column_order() if c in present]
    return known + sorted(present - set(known))


# -- the rows ---------------------------------------------------------------------------------


def cell(v: object) -> Cell:
    """An HDF5 attribute as a table cell: bytes -> str, numpy scalars -> Python, arrays -> JSON."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, list | dict):
        return json.dumps(v)
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)


def ac_form(r: Mapping[str, Cell]) -> str:
    if not r.get(Spec.activation_checkpointing):
        return "none"
    return "selective" if r.get(Spec.ac_selective) else "reentrant" if r.get(Spec.ac_reentrant) else "full"


def with_spec(spec: str, r: dict[str, Cell]) -> dict[str, Cell]:
    """``r`` with the spec's fields filled from its path where the record lacks them."""
    r[Spec.spec] = spec
    try:
        parsed = RunSpec.from_path(spec)
    except SpecError:
        return r
    for k, v in parsed.as_attrs().items():
        r.setdefault(k, cell(v))
    r[Read.spec_batch] = str(parsed.batch)
    r["ac"] = ac_form(r)
    return r


def rung_groups(f: h5py.File) -> Iterator[tuple[str, h5py.Group]]:
    """Every rung group under /rungs (a group with a status), in name order, never descending
    into a rung (its datasets, memory/ and repeats/ are not rungs)."""
    def walk(g: h5py.Group, prefix: str) -> Iterator[tuple[str, h5py.Group]]:
        for name in sorted(g):
            child = g.get(name, getclass=True)
            if child is not h5py.Group:
                continue
            sub = g[name]
            if Record.status in sub.attrs:
                yield prefix + name, sub
            else:
                yield from walk(sub, f"{prefix}{name}/")

    if "rungs" in f:
        yield from walk(f["rungs"], "")


def check_ladder(root: Mapping[str, object], path: str) -> None:
    from scaleladder.results.aggregate import FORMAT

    got = cell(root.get("format"))
    if got != FORMAT:
        raise SpecError(f"{path}: not a scaleladder ladder file (format {got!r}, expected {FORMAT!r}; "
                        "`scaleladder aggregate` writes one)")


def ladder_rows(path: str) -> list[dict[str, Cell]]:
    """Every rung's attributes as cells (aggregate.read_ladder: the ladder's index, one read)."""
    from scaleladder.results.aggregate import read_ladder

    rungs, root = read_ladder(path)
    check_ladder(root, path)
    return [with_spec(str(r[Spec.spec]), {k: cell(v) for k, v in r.items()}) for r in rungs]


def failure_notes(folder: str) -> dict[str, list[dict[str, Cell]]]:
    """spec -> its failure notes, oldest first (an unreadable note is skipped: it is a log)."""
    notes: dict[str, list[dict[str, Cell]]] = {}
    for note in sorted(glob.glob(os.path.join(folder, "**", "*.h5.json"), recursive=True)):
        try:
            with open(note) as f:
                entries = json.load(f)
        except (OSError, ValueError):
            continue
        spec = os.path.relpath(note, folder)[: -len(".h5.json")]
        kept = [{k: cell(v) for k, v in e.items()} for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
        notes.setdefault(spec, []).extend(kept)
    return {s: sorted(es, key=lambda e: str(e.get(FailedAttempt.when, ""))) for s, es in notes.items() if es}


def with_failures(rows: list[dict[str, Cell]], notes: Mapping[str, list[dict[str, Cell]]]) -> list[dict[str, Cell]]:
    """``rows`` with each spec's count of failure notes, plus a ``failed`` row per spec that
    failed and has no result (its last note's when, rc and reason)."""
    by_spec = {r[Spec.spec]: r for r in rows}
    out = list(rows)
    rungs: dict[str, list[dict[str, Cell]]] = {}
    for name, es in notes.items():  # a repeat's notes (<spec>.r<k>) count for its rung
        rungs.setdefault(REPEAT.sub("", name), []).extend(es)
    for spec, es in sorted(rungs.items()):
        es = sorted(es, key=lambda e: str(e.get(FailedAttempt.when, "")))
        if spec in by_spec:
            by_spec[spec]["failed_attempts"] = len(es)
            continue
        last = es[-1]
        out.append(with_spec(spec, {Record.status: "failed", "failed_attempts": len(es),
                                    **{str(a): last.get(a) for a in FailedAttempt.fields}}))
    return out


def step_rows(path: str) -> Iterator[dict[str, Cell]]:
    """The long per-step table, one rung's arrays at a time."""
    with open_h5(path) as f:
        check_ladder({k: cell(v) for k, v in f.attrs.items()}, path)
        for spec, g in rung_groups(f):
            if Read.step_time_s not in g:
                continue
            warmup = int(g.attrs.get("warmup", 0))
            arrays = {k: g[k][()] for k in (Read.step_time_s, Read.loss, "host_issue_s") if k in g}
            for i in range(len(arrays[Read.step_time_s])):
                yield {"spec": spec, "step": i, "warmup": i < warmup,
                       **{k: float(a[i]) for k, a in arrays.items() if i < len(a)}}


def docs_rows(columns: list[str], docs: Mapping[str, tuple[str, str]]) -> list[dict[str, Cell]]:
    return [{"column": c, "unit": docs.get(c, ("", ""))[0], "meaning": docs.get(c, ("", "not defined in record.py"))[1]}
            for c in columns]


def sidecar(out: str) -> str:
    p = Path(out)
    return str(p.with_name(f"{p.stem}.columns{p.suffix}"))


def main(args: argparse.Namespace) -> int:
    targets = [args.out, *([args.steps] if args.steps else [])]
    for t in targets:  # every format and folder checked before any work (a bad one: one line, exit 2)
        outputs.check(t)
    if args.failed is not None and not os.path.isdir(args.failed):  # the default, failed/ beside the ladder, may be absent
        raise SpecError(f"{args.failed}: no such folder (--failed: the failure notes)")
    failed = args.failed or os.path.join(os.path.dirname(os.path.abspath(args.ladder)), "failed")
    rows = with_failures(ladder_rows(args.ladder), failure_notes(failed))
    columns = columns_of(rows)
    outputs.write_table(args.out, columns, rows)
    outputs.write_table(sidecar(args.out), ("column", "unit", "meaning"), docs_rows(columns, column_docs()))
    wrote = [f"{args.out} ({len(rows)} rungs, {len(columns)} columns)"]
    if args.steps:
        outputs.write_table(args.steps, STEP_COLUMNS, step_rows(args.ladder), STEP_KINDS)
        outputs.write_table(sidecar(args.steps), ("column", "unit", "meaning"), docs_rows(list(STEP_COLUMNS), STEP_DOCS))
        wrote.append(args.steps)
    print(f"scaleladder export: {' and '.join(wrote)}")
    return 0


def markdown() -> str:
    """The columns of both tables, as Markdown (docs/results.md; tests/test_export.py keeps them equal)."""
    from scaleladder import markdown as md

    docs = column_docs()
    rungs = md.table(("column", "unit", "meaning"), [(f"`{c}`", docs[c][0] or "-", docs[c][1]) for c in column_order()], escape=True)
    steps = md.table(("column", "unit", "meaning"), [(f"`{c}`", STEP_DOCS[c][0] or "-", STEP_DOCS[c][1]) for c in STEP_COLUMNS],
                     escape=True)
    return "\n".join(["**The rung table** (`--out`)", "", *rungs, "", "**The step table** (`--steps`)", "", *steps]) + "\n"
