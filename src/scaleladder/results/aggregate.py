"""`scaleladder aggregate`: merge the per-rung HDF5 files into one ladder file.

Each rung file is copied whole to ``/rungs/<run spec path>``, the path its *location* says
(a file elsewhere, ``scaleladder run ... --out r.h5``: the ``spec`` its record states).
The ladder is rebuilt in memory and renamed over the old one (idempotent; never SWMR or
in-place appends). A file that is not readable HDF5, or whose ``spec`` names another rung,
costs only that rung (status ``corrupt``); repeats are kept whole and the rung's headline is
``results.stats.between_runs``'s. :func:`read_ladder` is the one reader of the ladder file.
Why: docs/workflow.md, "Reruns and interruptions"; repeats: docs/metrics.md, "Uncertainty".
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import re
import sys
from collections import Counter
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


def _fill_within(g: h5py.Group) -> None:
    """Give an ok record that lacks it the within-run interval, from its own step times."""
    if _str(g.attrs.get(Record.status)) != "ok" or Interval.items_per_s_ci_low in g.attrs or "step_time_s" not in g:
        return
    ips = float(g.attrs.get(Throughput.items_per_s, math.nan))
    for k, v in within_run(g["step_time_s"][()], int(g.attrs.get(Settings.warmup, 0)), ips).items():
        g.attrs[k] = v


def _summarize_repeats(g: h5py.Group, repeats: dict[int, h5py.Group]) -> None:
    """The between-run summary of a rung's repeats, onto its own group ``g``."""
    statuses = [_str(repeats[k].attrs.get(Record.status, "unknown")) for k in sorted(repeats)]
    g.attrs[Repeats.repeats] = len(repeats)
    g.attrs[Repeats.repeat_statuses] = json.dumps(statuses)
    ok = [repeats[k] for k in sorted(repeats) if statuses[k] == "ok"]
    if _str(g.attrs.get(Record.status)) != "ok" or len(ok) < 2:
        return
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


def aggregate(rung_files: list[str], out: str, provenance: dict[str, Any] | None = None) -> dict[str, int]:
    """(Re)write ``out`` from ``rung_files``; return the count of rungs per status."""
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

    counts: Counter[str] = Counter()
    # a `<out>.<pid>.tmp` of an aggregate killed by SIGKILL before this fix, or by a dead node
    remove_dead_leftovers(Path(out).parent, re.escape(Path(out).name) + r"\.(?P<pid>[0-9]+)\.tmp")
    site = str((provenance or {}).get("site", "") or "")
    with h5_in_memory(out) as dst:
        rungs = dst.create_group("rungs")
        sources = []
        for spec in sorted(by_spec):  # sorted: the same inputs give the same file
            reps = by_spec[spec]
            bad = _unreadable(spec, reps)
            if bad:
                path, error = bad
                _corrupt_group(rungs, spec, path, error, site)
                counts[CORRUPT] += 1
                sources += [{"spec": spec, "repeat": k, "file": os.path.relpath(reps[k]), "sha256": "", "status": CORRUPT}
                            for k in sorted(reps)]
                continue
            lead = _lead(reps)
            path = reps[lead]
            with h5py.File(path, "r") as src:
                parent = rungs.require_group(os.path.dirname(spec))
                # Group.copy of the source's root: attributes and every dataset, as is.
                src.copy(src["/"], parent, name=os.path.basename(spec))
            g = rungs[spec]
            digest = _sha256(path)
            g.attrs[Source.source_file] = os.path.relpath(path)
            g.attrs[Source.source_sha256] = digest
            _fill_within(g)
            if len(reps) > 1:
                copies = {}
                for k in sorted(reps):
                    with h5py.File(reps[k], "r") as src:
                        src.copy(src["/"], g.require_group("repeats"), name=f"r{k}")
                    copies[k] = g[f"repeats/r{k}"]
                    copies[k].attrs[Source.source_file] = os.path.relpath(reps[k])
                    copies[k].attrs[Source.source_sha256] = _sha256(reps[k])
                    _fill_within(copies[k])
                _summarize_repeats(g, copies)
            status = _str(g.attrs.get(Record.status, "unknown"))
            counts[status] += 1
            for k in sorted(reps):
                sources.append({"spec": spec, "repeat": k, "file": os.path.relpath(reps[k]),
                                "sha256": _sha256(reps[k]) if k != lead else digest, "status": status})
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


def _unreadable(spec: str, reps: dict[int, str]) -> tuple[str, str] | None:
    """The first of a rung's files that cannot stand for it, and why: not readable HDF5, or
    a record whose own spec names another rung (None when every file is sound)."""
    for k in sorted(reps):
        try:
            with open_h5(reps[k]) as f:
                own = _str(f.attrs.get(Spec.spec, ""))
                f.visititems(_read_dataset)  # a file cut short can open and still lose its data
        except UnreadableFile as e:
            return reps[k], str(e)
        except (OSError, RuntimeError, KeyError) as e:
            return reps[k], f"{reps[k]}: not a readable HDF5 file ({h5_cause(e)})"
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


def _corrupt_group(rungs: h5py.Group, spec: str, path: str, error: str, site: str) -> None:
    """The group of a rung whose file cannot be used: says so, why, and how to redo it."""
    g = rungs.require_group(spec)
    redo = redo_command(path, site)
    g.attrs[Record.status] = CORRUPT
    g.attrs[Spec.spec] = spec
    g.attrs[Oom.error] = error
    g.attrs[Corrupt.redo] = redo
    g.attrs[Source.source_file] = os.path.relpath(path)
    _log.warning(f"scaleladder aggregate: {error}; rung {spec} recorded as '{CORRUPT}'; redo it with: {redo}")


def _lead(reps: dict[int, str]) -> int:
    """The repeat whose record the rung's group is: repeat 0, unless a repeat ran out of
    memory (then the first that did: a batch that fits only sometimes does not fit)."""
    for k in sorted(reps):
        with open_h5(reps[k]) as f:
            if _str(f.attrs.get(Record.status, "")) != "ok":
                return k
    return 0


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


def read_ladder(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every rung of a ladder file as a flat dict of its attributes (plus ``spec``, the
    group's spec path, and ``step_time_s``/``loss`` arrays when present), and the root's
    attributes."""
    rungs: list[dict[str, Any]] = []
    with open_h5(path) as f:
        root = {k: _plain(v) for k, v in f.attrs.items()}

        def visit(name: str, obj: Any) -> None:
            # a rung's repeats (<spec>/repeats/r<k>) are read through the rung, not as rungs
            if isinstance(obj, h5py.Group) and Record.status in obj.attrs and "/repeats/r" not in f"/{name}":
                r = {k: _plain(v) for k, v in obj.attrs.items()}
                r[Spec.spec] = name
                for ds in (Read.step_time_s, Read.loss):
                    if ds in obj and isinstance(obj[ds], h5py.Dataset):
                        r[ds] = obj[ds][()]
                rungs.append(r)

        if "rungs" in f:
            f["rungs"].visititems(visit)
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
