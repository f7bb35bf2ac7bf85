"""Result files: one HDF5 per rung, written atomically.

Atomicity: the file is written to ``<out>.tmp-<pid>`` in the same directory
(the same filesystem, so ``os.replace`` is an atomic rename) and renamed only
once complete and closed. A run killed mid-write — Slurm's SIGTERM at a time
limit, say — leaves at most a ``.tmp-`` file, never a plausible-looking result.

HDF5 traps: strings are stored as UTF-8 variable-length strings and must be read
back with ``.asstr()`` (or they come back as bytes); no SWMR (broken on NFS and
Lustre); on Lustre set ``HDF5_USE_FILE_LOCKING=FALSE`` (the Frontier profile does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np

Attr = str | int | float | bool | np.integer | np.floating


@contextmanager
def atomic_path(out: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``out``; rename it onto ``out`` on success only."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


def _clean(v: Any) -> Attr:
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v)
    if v is None:
        return ""
    if isinstance(v, str):
        return str(v)  # np.str_ has no HDF5 conversion path; a plain str becomes UTF-8
    return v  # type: ignore[no-any-return]


def write_record(out: str | Path, attrs: Mapping[str, Any], datasets: Mapping[str, np.ndarray] | None = None) -> None:
    """One rung: root attributes + named datasets ('memory/peak_active_bytes' makes a group)."""
    with atomic_path(out) as tmp:
        with h5py.File(tmp, "w") as f:
            for k, v in attrs.items():
                f.attrs[k] = _clean(v)
            for name, arr in (datasets or {}).items():
                f.create_dataset(name, data=np.asarray(arr))


def read_attrs(path: str | Path) -> dict[str, Any]:
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
