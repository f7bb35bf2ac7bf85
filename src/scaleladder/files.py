"""Files at the bottom of the house: a write that fails is one line, a killed run's leftovers go.

Every stage writes files (shards, records, the ladder, figures), so this sits beside
``errors``, below all of them. :func:`write_error` turns an ``OSError`` of a write (disk full,
quota, ``ulimit -f``, read-only) into the one-line :class:`~scaleladder.errors.WriteError`
naming the file. :func:`remove_dead_leftovers` is how the next run of a command cleans up
what a SIGKILLed one left (a ``.tmp-<pid>`` file, a ``.partial-<host>-<pid>-`` folder): only
when that process is gone from this host, never a live one's (docs/faults.md).
:func:`atomic_file` and :func:`atomic_write_text` are the one atomic write: a reader sees the
old file or the whole new one, never half.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from scaleladder.errors import WriteError

#: errno values that mean "this output cannot be written there", in words a user acts on.
CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large (over the process's file size limit, `ulimit -f`, or the filesystem's)",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file stands where its folder should be",
}


def write_error(path: str | Path, e: OSError) -> WriteError:
    """The one-line error for a failed write of ``path``."""
    cause = CAUSES.get(e.errno or -1) or e.strerror or str(e)
    name = f" [{errno.errorcode.get(e.errno, e.errno)}]" if e.errno else ""
    return WriteError(f"cannot write {path}: {cause}{name}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def host_tag() -> str:
    """This host's name as it may stand in a file name (``[A-Za-z0-9_]``)."""
    import socket

    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def remove_dead_leftovers(folder: Path, pattern: str) -> list[Path]:
    """Remove the temporary files or folders in ``folder`` whose name matches ``pattern`` (a
    regex with a ``pid`` group, and optionally a ``host`` group, :func:`host_tag`) and whose
    process is gone; return them. A live process's are kept (it may be writing them right
    now), and so is every one whose ``host`` is another node's (on a shared filesystem its
    pid says nothing here). Callers pass only names that their own command writes."""
    removed = []
    rx = re.compile(pattern)
    here = host_tag()
    with suppress(OSError):
        for entry in os.scandir(folder):
            m = rx.fullmatch(entry.name)
            if m and m.groupdict().get("host", here) == here and not _pid_alive(int(m["pid"])):
                with suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


@contextmanager
def atomic_file(out: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``out`` (``<name>.tmp-<pid>``: the same filesystem, so the
    rename is atomic); rename it onto ``out`` when the block ends cleanly. The temporary file
    never survives, and a dead process's one of the same name is removed first. A write that
    fails for want of room or rights (an errno in :data:`CAUSES`) raises :func:`write_error`'s
    one line naming ``out``; any other ``OSError`` is raised as it is."""
    out = Path(out)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            remove_dead_leftovers(out.parent, re.escape(out.name) + r"\.tmp-(?P<pid>[0-9]+)")
            yield tmp
            os.replace(tmp, out)
        except OSError as e:
            if e.errno in CAUSES:
                raise write_error(out, e) from None
            raise
    finally:
        with suppress(OSError):
            tmp.unlink()


def atomic_write_text(path: str | Path, text: str, *, fsync: bool = False) -> None:
    """``text`` as the file ``path`` (UTF-8), atomically (:func:`atomic_file`). ``fsync``: flushed
    to the device before the rename, for a file that must survive a crash of the node (a
    full disk on NFS or Lustre may surface only there)."""
    with atomic_file(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
