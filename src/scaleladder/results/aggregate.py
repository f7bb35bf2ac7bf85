"""`scaleladder aggregate`: merge the per-rung HDF5 files into one ladder file.

Each rung file (one per job, written atomically by its rank 0) is copied whole, with
``h5py.Group.copy``, to ``/rungs/<run spec path>`` of the ladder file: its attributes
(status, spec, metrics, provenance) and its datasets (step times, losses, memory).
The group name is the spec path the file's *location* says (``.../b<batch>.h5`` or
``.../bmax.h5``), because that is the rung's identity in the workflow; a max-batch rung
says which batch it settled on in its own attributes.

Idempotent by construction: the ladder file is rebuilt from its inputs into a
temporary file and renamed over the old one, so running it twice gives the same groups,
and a crash half way leaves the previous file intact. Never SWMR or in-place appends:
those are unreliable on NFS and Lustre (docs/design.md).

Provenance: the root records when and from what it was built (each source file with
its SHA-256), the scaleladder version and git commit, and the workflow's own JSON
description of the ladder (``--provenance``).

:func:`read_ladder` is the one reader of the ladder file: plots and report use it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from scaleladder.spec import RunSpec, SpecError

FORMAT = "scaleladder-ladder/1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rungs", nargs="*", help="rung HDF5 files (results/rungs/<spec>.h5)")
    parser.add_argument("--out", required=True, help="the ladder file to (re)write, e.g. results/ladder.h5")
    parser.add_argument("--dir", action="append", default=[], help="also take every *.h5 under this folder")
    parser.add_argument("--provenance", default="{}", help="JSON describing how the ladder was declared")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("scaleladder")
    except Exception:  # noqa: BLE001 - an uninstalled checkout has no metadata
        return ""


def spec_of_file(path: str) -> str:
    """The canonical spec path a rung file's location names (SpecError if it names none)."""
    return RunSpec.from_path(os.path.abspath(path)).path


def aggregate(rung_files: list[str], out: str, provenance: dict[str, Any] | None = None) -> dict[str, int]:
    """(Re)write ``out`` from ``rung_files``; return the count of rungs per status."""
    by_spec: dict[str, str] = {}
    for f in rung_files:
        spec = spec_of_file(f)
        if spec in by_spec and os.path.abspath(by_spec[spec]) != os.path.abspath(f):
            raise SpecError(f"two rung files name the same spec {spec!r}: {by_spec[spec]} and {f}")
        by_spec[spec] = f

    counts: Counter[str] = Counter()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{out}.{os.getpid()}.tmp"
    try:
        with h5py.File(tmp, "w") as dst:
            rungs = dst.create_group("rungs")
            sources = []
            for spec in sorted(by_spec):  # sorted: the same inputs give the same file
                path = by_spec[spec]
                with h5py.File(path, "r") as src:
                    parent = rungs.require_group(os.path.dirname(spec))
                    # Group.copy of the source's root: attributes and every dataset, as is.
                    src.copy(src["/"], parent, name=os.path.basename(spec))
                g = rungs[spec]
                digest = _sha256(path)
                g.attrs["source_file"] = os.path.relpath(path)
                g.attrs["source_sha256"] = digest
                status = _str(g.attrs.get("status", "unknown"))
                counts[status] += 1
                sources.append({"spec": spec, "file": os.path.relpath(path), "sha256": digest, "status": status})
            dst.attrs["format"] = FORMAT
            dst.attrs["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            dst.attrs["scaleladder_version"] = _version()
            dst.attrs["git_commit"] = _git_commit()
            dst.attrs["n_rungs"] = len(by_spec)
            dst.attrs["status_counts"] = json.dumps(dict(sorted(counts.items())))
            dst.attrs["sources"] = json.dumps(sources)
            dst.attrs["provenance"] = json.dumps(provenance or {}, sort_keys=True)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dict(counts)


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
    with h5py.File(path, "r") as f:
        root = {k: _plain(v) for k, v in f.attrs.items()}

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Group) and "status" in obj.attrs:
                r = {k: _plain(v) for k, v in obj.attrs.items()}
                r["spec"] = name
                for ds in ("step_time_s", "loss"):
                    if ds in obj and isinstance(obj[ds], h5py.Dataset):
                        r[ds] = obj[ds][()]
                rungs.append(r)

        if "rungs" in f:
            f["rungs"].visititems(visit)
    for r in rungs:  # fill the spec fields from the path when a record lacks them
        try:
            spec = RunSpec.from_path(r["spec"])
        except SpecError:
            continue
        for k, v in spec.as_attrs().items():
            if k != "spec":
                r.setdefault(k, v)
        # The batch the rung was *declared* with ('max' for a max-batch search), which a
        # max-batch record's own `batch` attribute (the batch it settled on) may not say.
        r["spec_batch"] = str(spec.batch)
    return rungs, root
