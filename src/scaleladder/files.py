"""Files at the bottom of the house: a write that fails is one line, a killed run's leftovers go.

Every stage writes files (shards, records, the ladder, figures), so this sits beside
``errors``, below all of them. :func:`write_error` turns an ``OSError`` of a write (disk full,
quota, ``ulimit -f``, read-only) into the one-line :class:`~scaleladder.errors.WriteError`
naming the file. :func:`remove_dead_leftovers` is how the next run of a command cleans up
what a SIGKILLed one left (a ``.tmp-<pid>`` file, a ``.partial-<host>-<pid>-`` folder): only
when that process is gone from this host, never a live one's (docs/faults.md).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import suppress
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
