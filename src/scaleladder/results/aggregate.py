"""`scaleladder aggregate`: merge the per-rung HDF5 files into one ladder file.

Each rung file is copied whole to ``/rungs/<run spec path>``, the path its *location* says
(a file elsewhere, ``scaleladder run ... --out r.h5``: the ``spec`` its record states).
The ladder is rebuilt in memory and renamed over the old one (idempotent; never SWMR or
in-place appends). A file that is not readable HDF5, or whose ``spec`` names another rung,
costs only that rung (status ``corrupt``); repeats are kept whole and the rung's headline is
``results.stats.between_runs``'s. :func:`read_ladder` is the one reader of the ladder file.

The ladder also holds ``/index``: every rung group's attributes as one JSON text, so that a
reader reads one dataset instead of ~90 HDF5 attributes per rung (h5py costs ~25 µs an
attribute: 25 s at 10,000 rungs). It is written from the same values as the groups and with
them; a ladder without one (older) is read by walking its groups. Each rung file is read once,
by :func:`scan`, in a pool of processes when there are many (docs/performance.md).
Why: docs/workflow.md, "Reruns and interruptions"; repeats: docs/metrics.md, "Uncertainty".
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import itertools
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from scaleladder.files import remove_dead_leftovers
from scaleladder.flavors import FLAVORS
from scaleladder.gitinfo import git_commit
from scaleladder.log import get_logger
from scaleladder.results.model_entries import register_recorded
from scaleladder.results.record import Corrupt, Interval, LadderFile, Oom, Read, Record, Repeats, Settings, Source, Spec, Throughput
from scaleladder.results.stats import between_runs, within_run
from scaleladder.results.store import UnreadableFile, h5_cause, h5_in_memory, open_h5
from scaleladder.spec import RunSpec, SpecError

_log = get_logger(__name__)
FORMAT = "scaleladder-ladder/1"
INDEX = "index"  # the root dataset: every rung group's attributes as one JSON text
CORRUPT = "corrupt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rungs", nargs="*", help="rung HDF5 files (results/rungs/<spec>.h5, or anywhere: the record's own spec)")
    parser.add_argument("--out", required=True, help="the ladder file to (re)write, e.g. results/ladder.h5")
    parser.add_argument("--dir", action="append", default=[], help="also take every *.h5 under this folder")
    parser.add_argument("--provenance", default="{}", help="JSON describing how the ladder was declared")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("scaleladder")
    except Exception:  # blind on purpose: an uninstalled checkout has no metadata
        return ""


_REPEAT = re.compile(r"^(?P<stem>.*)\.r(?P<k>[1-9][0-9]*)\.h5$")


def split_repeat(path: str) -> tuple[str, int]:
    """``.../b8.r2.h5`` -> (``.../b8.h5``, 2); a path without a repeat suffix is repeat 0."""
    m = _REPEAT.match(path)
    return (f"{m['stem']}.h5", int(m["k"])) if m else (path, 0)


def spec_of_file(path: str) -> str:
    """The canonical spec path of a rung file: the one its location names
    (``results/rungs/<spec>.h5``), else its record's own ``spec`` attribute, so that a file
    anywhere (``scaleladder run ... --out r.h5``) is a rung too. SpecError when neither names one."""
    try:
        return RunSpec.from_path(os.path.abspath(split_repeat(path)[0])).path
    except SpecError as by_path:
        if _register_own_model(path):  # a models-file model, known from its record: read the path again
            return spec_of_file(path)
        own = _own_spec(path)
        if own is None:
            raise SpecError(f"{path}: names no rung: neither its path ({by_path}) nor its record "
                            "(no readable 'spec' attribute)") from None
        return own


def _register_own_model(path: str) -> bool:
    """Register the models-file model a rung file's record names and was not known (results/model_entries.py)."""
    try:
        with open_h5(path) as f:
            attrs: dict[str, Any] = {str(k): f.attrs[k] for k in (Spec.model, Settings.model_entry) if k in f.attrs}
    except (UnreadableFile, OSError, RuntimeError, KeyError):
        return False
    return Settings.model_entry in attrs and Spec.model in attrs and _str(attrs[Spec.model]) not in FLAVORS \
        and register_recorded(attrs)


def _own_spec(path: str) -> str | None:
    """The canonical spec path a rung file's record states (None: unreadable, or no ``spec``)."""
    try:
        with open_h5(path) as f:
            own = _str(f.attrs.get(Spec.spec, ""))
    except (UnreadableFile, OSError, RuntimeError, KeyError):
        return None
    try:
        return RunSpec.from_path(str(own)).path if own else None
    except SpecError:
        return None


def _fill_within(g: h5py.Group) -> dict[str, object]:
    """Give an ok record that lacks it the within-run interval, from its own step times; the
    attributes set."""
    if _str(g.attrs.get(Record.status)) != "ok" or Interval.items_per_s_ci_low in g.attrs or "step_time_s" not in g:
        return {}
    ips = float(g.attrs.get(Throughput.items_per_s, math.nan))
    filled = within_run(g["step_time_s"][()], int(g.attrs.get(Settings.warmup, 0)), ips)
    for k, v in filled.items():
        g.attrs[k] = v
    return {k: _plain(v) for k, v in filled.items()}


def _summarize_repeats(g: h5py.Group, repeats: dict[int, h5py.Group]) -> dict[str, object]:
    """The between-run summary of a rung's repeats, onto its own group ``g``; the attributes set."""
    statuses = [_str(repeats[k].attrs.get(Record.status, "unknown")) for k in sorted(repeats)]
    g.attrs[Repeats.repeats] = len(repeats)
    g.attrs[Repeats.repeat_statuses] = json.dumps(statuses)
    done: dict[str, object] = {Repeats.repeats: len(repeats), Repeats.repeat_statuses: json.dumps(statuses)}
    ok = [repeats[k] for k in sorted(repeats) if statuses[k] == "ok"]
    if _str(g.attrs.get(Record.status)) != "ok" or len(ok) < 2:
        return done
    ips, lo, hi = Throughput.items_per_s, Interval.items_per_s_ci_low, Interval.items_per_s_ci_high
    values = [float(r.attrs.get(ips, math.nan)) for r in ok]
    within = [(float(r.attrs.get(ips, math.nan)), float(r.attrs.get(lo, math.nan)), float(r.attrs.get(hi, math.nan))) for r in ok]
    summary = between_runs(values, within)
    # Every rate proportional to items/s follows the headline (same samples, FLOPs and peak in
    # every repeat), so MFU and items/s never disagree; timings and memory stay repeat 0's.
    scale = summary[ips] / float(g.attrs.get(ips, math.nan) or math.nan)
    for k in (Throughput.samples_per_s, Throughput.tflops_per_device, Throughput.mfu, Throughput.hfu):
        if k in g.attrs:
            summary[k] = float(g.attrs[k]) * scale
    for name, v in summary.items():
        g.attrs[name] = v
    return {**done, **{k: _plain(v) for k, v in summary.items()}}


def _by_spec(rung_files: list[str]) -> dict[str, dict[int, str]]:
    """spec -> repeat -> file, every repeat from 0 present (SpecError naming a clash or a gap)."""
    by_spec: dict[str, dict[int, str]] = {}
    for f in rung_files:
        spec, k = spec_of_file(f), split_repeat(f)[1]
        seen = by_spec.setdefault(spec, {})
        if k in seen and os.path.abspath(seen[k]) != os.path.abspath(f):
            raise SpecError(f"two rung files name the same spec {spec!r} (repeat {k}): {seen[k]} and {f}")
        seen[k] = f
    for spec, reps in by_spec.items():
        if sorted(reps) != list(range(len(reps))):
            missing = sorted(set(range(max(reps) + 1)) - set(reps))
            raise SpecError(f"rung {spec!r}: repeat(s) {missing} missing beside {[reps[k] for k in sorted(reps)]} "
                            "(repeat 0 is <spec>.h5, repeat k is <spec>.r<k>.h5)")
    return by_spec


@dataclass(frozen=True)
class Scan:
    """One read of a rung file: its attributes (plain Python), its SHA-256, and why it cannot
    stand for a rung (None: every dataset read back)."""

    attrs: dict[str, object]
    sha256: str
    error: str | None


def scan(path: str) -> Scan:
    try:
        with open_h5(path) as f:
            attrs = {k: _plain(v) for k, v in f.attrs.items()}
            f.visititems(_read_dataset)  # a file cut short can open and still lose its data
    except UnreadableFile as e:
        return Scan({}, "", str(e))
    except (OSError, RuntimeError, KeyError) as e:
        return Scan({}, "", f"{path}: not a readable HDF5 file ({h5_cause(e)})")
    return Scan(attrs, _sha256(path), None)


#: from this many files, :func:`scanning` reads them in a pool (below, the pool's start costs more)
POOL_FROM = 256


@contextmanager
def scanning(paths: list[str]) -> Iterator[Iterator[Scan]]:
    """Every file scanned once, in order, as each is ready: in a pool of up to 4 processes (the
    CPUs this process may use) from :data:`POOL_FROM` files, so that the copying of one rung
    overlaps the reading of the next (reading ~90 attributes a file is h5py's Python: CPU-bound).
    Enter it before any HDF5 file is open: the pool forks on entry."""
    workers = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if len(paths) < POOL_FROM or workers < 2:
        yield map(scan, paths)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:  # fork: the children need no re-import
        yield pool.imap(scan, paths, chunksize=32)


def _add_rung(rungs: h5py.Group, spec: str, reps: dict[int, str], scans: dict[str, Scan], site: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    """Copy one rung (and its repeats) into ``rungs``; its index entry (its group's attributes)
    and its ``sources`` rows."""
    bad = _unreadable(spec, reps, scans)
    if bad:
        path, error = bad
        entry = _corrupt_group(rungs, spec, path, error, site)
        return entry, [{"spec": spec, "repeat": k, "file": os.path.relpath(reps[k]), "sha256": "", "status": CORRUPT} for k in sorted(reps)]
    lead = _lead(reps, scans)
    path = reps[lead]
    with h5py.File(path, "r") as src:
        parent = rungs.require_group(os.path.dirname(spec))
        # Group.copy of the source's root: attributes and every dataset, as is.
        src.copy(src["/"], parent, name=os.path.basename(spec))
    g = rungs[spec]
    source: dict[str, object] = {Source.source_file: os.path.relpath(path), Source.source_sha256: scans[path].sha256}
    g.attrs.update(source)
    entry = {**scans[path].attrs, **source, **_fill_within(g)}
    if len(reps) > 1:
        copies = {}
        for k in sorted(reps):
            with h5py.File(reps[k], "r") as src:
                src.copy(src["/"], g.require_group("repeats"), name=f"r{k}")
            copies[k] = g[f"repeats/r{k}"]
            copies[k].attrs[Source.source_file] = os.path.relpath(reps[k])
            copies[k].attrs[Source.source_sha256] = scans[reps[k]].sha256
            _fill_within(copies[k])
        entry.update(_summarize_repeats(g, copies))
    status = str(entry.get(Record.status, "unknown"))
    return entry, [{"spec": spec, "repeat": k, "file": os.path.relpath(reps[k]), "sha256": scans[reps[k]].sha256, "status": status}
                   for k in sorted(reps)]


def aggregate(rung_files: list[str], out: str, provenance: dict[str, Any] | None = None) -> dict[str, int]:
    """(Re)write ``out`` from ``rung_files``; return the count of rungs per status."""
    by_spec = _by_spec(rung_files)
    counts: Counter[str] = Counter()
    # a `<out>.<pid>.tmp` of an aggregate killed by SIGKILL before this fix, or by a dead node
    remove_dead_leftovers(Path(out).parent, re.escape(Path(out).name) + r"\.(?P<pid>[0-9]+)\.tmp")
    site = str((provenance or {}).get("site", "") or "")
    order = sorted(by_spec)  # sorted: the same inputs give the same file
    files = [by_spec[spec][k] for spec in order for k in sorted(by_spec[spec])]
    index: dict[str, dict[str, object]] = {}
    with scanning(files) as scanned_in_order, h5_in_memory(out) as dst:
        ready = zip(files, scanned_in_order)
        rungs = dst.create_group("rungs")
        sources = []
        for spec in order:
            scanned = dict(itertools.islice(ready, len(by_spec[spec])))  # this rung's files, in the order asked
            entry, rows = _add_rung(rungs, spec, by_spec[spec], scanned, site)
            index[spec] = entry
            sources += rows
            counts[str(entry.get(Record.status, "unknown"))] += 1
        # TRAP: NaN is kept as JSON's NaN extension (json.loads reads it back), as the attributes hold it
        dst.create_dataset(INDEX, data=json.dumps(index))
        dst.attrs[LadderFile.format] = FORMAT
        dst.attrs[LadderFile.created_utc] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        dst.attrs[LadderFile.scaleladder_version] = _version()
        dst.attrs[LadderFile.git_commit] = git_commit()
        dst.attrs[LadderFile.n_rungs] = len(by_spec)
        dst.attrs[LadderFile.status_counts] = json.dumps(dict(sorted(counts.items())))
        dst.attrs[LadderFile.sources] = json.dumps(sources)
        dst.attrs[LadderFile.provenance] = json.dumps(provenance or {}, sort_keys=True)
    return dict(counts)


def redo_command(path: str, site: str) -> str:
    """The command that runs one rung file's job again (targets first: --forcerun takes
    every word after it)."""
    rel = os.path.relpath(path)
    return f"snakemake {rel} --profile profiles/{site or '<site>'} --forcerun {rel}"


def _unreadable(spec: str, reps: dict[int, str], scans: dict[str, Scan]) -> tuple[str, str] | None:
    """The first of a rung's files that cannot stand for it, and why: not readable HDF5, or
    a record whose own spec names another rung (None when every file is sound)."""
    for k in sorted(reps):
        sc = scans[reps[k]]
        if sc.error:
            return reps[k], sc.error
        own = sc.attrs.get(Spec.spec, "")
        if own:
            try:
                own_path = RunSpec.from_path(str(own)).path
            except SpecError:
                own_path = str(own)
            if own_path != spec:
                return reps[k], (f"{reps[k]}: the record inside is rung {own_path!r}, not {spec!r} as its path says "
                                 "(a copied or misnamed file)")
    return None


def _read_dataset(_name: str, obj: Any) -> None:
    if isinstance(obj, h5py.Dataset):
        obj[()]  # read for its error, not its value
    # TRAP: visititems stops at the first callback that returns anything but None


def _corrupt_group(rungs: h5py.Group, spec: str, path: str, error: str, site: str) -> dict[str, object]:
    """The group of a rung whose file cannot be used: says so, why, and how to redo it; its attributes."""
    redo = redo_command(path, site)
    attrs = {Record.status: CORRUPT, Spec.spec: spec, Oom.error: error, Corrupt.redo: redo, Source.source_file: os.path.relpath(path)}
    rungs.require_group(spec).attrs.update(attrs)
    _log.warning(f"scaleladder aggregate: {error}; rung {spec} recorded as '{CORRUPT}'; redo it with: {redo}")
    return {str(k): v for k, v in attrs.items()}


def _lead(reps: dict[int, str], scans: dict[str, Scan]) -> int:
    """The repeat whose record the rung's group is: repeat 0, unless a repeat ran out of
    memory (then the first that did: a batch that fits only sometimes does not fit)."""
    return next((k for k in sorted(reps) if scans[reps[k]].attrs.get(Record.status, "") != "ok"), 0)


def main(args: argparse.Namespace) -> int:
    files = list(args.rungs)
    for d in args.dir:
        files += sorted(glob.glob(os.path.join(d, "**", "*.h5"), recursive=True))
    if not files:
        print("scaleladder aggregate: error: no rung files given (positional files or --dir)", file=sys.stderr)
        return 2
    try:
        provenance = json.loads(args.provenance)
    except json.JSONDecodeError as e:
        print(f"scaleladder aggregate: error: --provenance is not JSON: {e}", file=sys.stderr)
        return 2
    counts = aggregate(files, args.out, provenance)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"scaleladder aggregate: {sum(counts.values())} rungs -> {args.out} ({summary})")
    return 0


# -- reading ------------------------------------------------------------------------------


def _str(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _plain(v: Any) -> Any:
    """HDF5 attribute -> plain Python (bytes -> str, numpy scalars -> int/float/bool)."""
    v = _str(v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    return v


def _walk(f: h5py.File) -> list[dict[str, Any]]:
    """Every rung group's attributes, by walking /rungs (a ladder without an index)."""
    rungs: list[dict[str, Any]] = []

    def visit(name: str, obj: object) -> None:
        # a rung's repeats (<spec>/repeats/r<k>) are read through the rung, not as rungs
        if isinstance(obj, h5py.Group) and Record.status in obj.attrs and "/repeats/r" not in f"/{name}":
            rungs.append({**{k: _plain(v) for k, v in obj.attrs.items()}, Spec.spec: name})

    if "rungs" in f:
        f["rungs"].visititems(visit)
    return rungs


def read_ladder(path: str, walk: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every rung of a ladder file as a flat dict of its attributes (plus ``spec``, the
    group's spec path, and ``spec_batch``), in the groups' order, and the root's attributes.
    From the ladder's index when it has one (``walk``: from its groups, as an older ladder is
    read); never a per-step dataset (``export --steps`` streams those, one rung at a time)."""
    with open_h5(path) as f:
        root = {k: _plain(v) for k, v in f.attrs.items()}
        if INDEX in f and not walk:
            index = json.loads(_str(f[INDEX][()]))
            # the groups' order: component by component ('vit-base' before 'vit-base-x/...')
            rungs = [{**index[s], Spec.spec: s} for s in sorted(index, key=lambda s: s.split("/"))]
        else:
            rungs = _walk(f)
    for r in rungs:  # fill the spec fields from the path when a record lacks them
        register_recorded(r)  # a models-file model: known from the entry its record carries
        try:
            spec = RunSpec.from_path(r[Spec.spec])
        except SpecError:
            continue
        for k, v in spec.as_attrs().items():
            if k != Spec.spec:
                r.setdefault(k, v)
        # The batch the rung was *declared* with ('max' for a max-batch search), which a
        # max-batch record's own `batch` attribute (the batch it settled on) may not say.
        r[Read.spec_batch] = str(spec.batch)
    return rungs, root
