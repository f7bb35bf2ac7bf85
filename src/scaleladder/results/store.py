"""Result files: one HDF5 per rung, written atomically.

Atomicity: the file is written to ``<out>.tmp-<pid>`` in the same directory
(the same filesystem, so ``os.replace`` is an atomic rename) and renamed only
once complete and closed. A run killed mid-write — Slurm's SIGTERM at a time
limit, say — leaves at most a ``.tmp-`` file, never a plausible-looking result;
the next writer of the same file removes such a file when its process is dead
(:func:`scaleladder.files.remove_dead_leftovers`), never one of a live process.

A write that fails (disk full, quota, read-only, ``ulimit -f``) ends in ONE line
naming the file and the cause (:class:`~scaleladder.errors.WriteError`, exit 1) and
leaves no temporary file. TRAP: HDF5 must never write to the disk itself: on a write
error inside ``h5py.File.close`` it prints ~85 lines of error stack and then
segfaults while freeing its ids (exit 139, the ``.tmp-`` file left behind). So every
HDF5 file here is built in memory (:func:`h5_in_memory`) and its bytes are written by
Python, whose ``OSError`` carries errno and path. Records are KBs to a few MBs, a
ladder file the sum of its rungs: memory is not the limit.

:func:`check_writable` is the preflight: before hours of training, the output's folder
must take a file the size of the record (a real write: it sees read-only mounts,
permissions, quotas, a full disk and ``ulimit -f`` alike).

HDF5 traps: strings are stored as UTF-8 variable-length strings and must be read
back with ``.asstr()`` (or they come back as bytes); no SWMR (broken on NFS and
Lustre); on Lustre set ``HDF5_USE_FILE_LOCKING=FALSE`` (the Frontier profile does).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from scaleladder.errors import SpecError, WriteError

# atomic_file: a temporary path beside ``out``, renamed onto it on success only (a full disk: one line naming it)
from scaleladder.files import atomic_file, write_error
from scaleladder.results.record import checked

Attr = str | int | float | bool | np.integer | np.floating


def write_bytes(out: str | Path, data: bytes) -> None:
    """``data`` as the file ``out``, atomically, flushed to the device before the rename
    (ENOSPC and quota errors on NFS and Lustre may surface only at fsync)."""
    with atomic_file(out) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


@contextmanager
def h5_in_memory(out: str | Path) -> Iterator[h5py.File]:
    """An empty HDF5 file in memory; on a clean exit its bytes become ``out`` (write_bytes)."""
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        yield f
    write_bytes(out, buf.getvalue())


#: A record's own bytes beyond its per-step datasets (attributes, provenance, HDF5 overhead).
RECORD_BASE_BYTES = 256 * 1024


def record_bytes(steps: int) -> int:
    """Room a rung record of ``steps`` steps needs: ~10 float64/int64 datasets per step."""
    return RECORD_BASE_BYTES + 10 * 8 * max(0, steps)


def check_writable(out: str | Path, need: int) -> None:
    """Fail now, in one line, when ``out`` could not be written later: its folder must
    exist or be creatable and take a file of ``need`` bytes. A real write and fsync of a
    probe file (removed again), because only a write sees every cause at once."""
    out = Path(out)
    probe = out.with_name(f".{out.name}.probe-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(bytes(need))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise WriteError(f"{write_error(out, e)}; checked before training with a {need}-byte probe file, "
                         "so nothing was run") from None
    finally:
        with suppress(OSError):
            probe.unlink()


def attr_value(v: Any) -> Attr:
    """An HDF5-storable attribute value: lists and dicts as JSON, None as "", str as a plain str."""
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v)
    if v is None:
        return ""
    if isinstance(v, str):
        return str(v)  # np.str_ has no HDF5 conversion path; a plain str becomes UTF-8
    stored: Attr = v  # the rest: numbers and numpy scalars, stored as they are
    return stored


def write_record(out: str | Path, attrs: Mapping[str, Any], datasets: Mapping[str, np.ndarray] | None = None) -> None:
    """One rung: root attributes + named datasets ('memory/peak_active_bytes' makes a group).
    Every attribute name must be defined in results/record.py for the record's kind
    (:class:`~scaleladder.results.record.UnknownAttr` otherwise, before anything is written)."""
    attrs = checked(attrs)
    with h5_in_memory(out) as f:
        for k, v in attrs.items():
            f.attrs[k] = attr_value(v)
        for name, arr in (datasets or {}).items():
            f.create_dataset(name, data=np.asarray(arr))


class UnreadableFile(SpecError):
    """A rung or ladder file that is not readable HDF5 (truncated, garbage, unreadable).
    One line naming the file: bad input, exit 2."""


def h5_cause(e: BaseException) -> str:
    """h5py's message without its noise: 'Unable to synchronously open file (truncated file:
    eof = 5000, ...)' -> 'truncated file: eof = 5000, ...'."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    m = re.search(r"\((.*)\)\s*$", text)
    return m[1] if m else text


@contextmanager
def open_h5(path: str | Path) -> Iterator[h5py.File]:
    """``h5py.File(path, "r")``, failing in one line that names the file when it is not
    readable HDF5 (h5py's own error names no file)."""
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise UnreadableFile(f"{path}: no such file") from None
    except OSError as e:
        raise UnreadableFile(f"{path}: not a readable HDF5 file ({h5_cause(e)})") from None
    with f:
        yield f


def read_attrs(path: str | Path) -> dict[str, Any]:
    with open_h5(path) as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
