"""Which commit the code came from, asked one way by every record, the ladder file and the GPU check.

Torch-free and import-free (it sits at the bottom of the house), so that
``containers/gpu_wheels.py`` can load it from the tree without installing anything.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: The variable a container image bakes its commit into (its tree has no ``.git``); the GPU
#: check also sets it for its rungs when the code that runs is a wheel's.
ENV = "SCALELADDER_GIT_COMMIT"
PACKAGE = Path(__file__).resolve().parent


def commit_and_source(where: str | Path = PACKAGE, stamp: Path | None = None, stamp_says: str = "") -> tuple[str, str]:
    """(commit, where it came from), asking in this order:

    1. git, in the checkout that holds ``where`` (default: this package's own folder, which
       is the checkout for an editable install): ``HEAD``, with ``-dirty`` when a tracked file
       differs from it (untracked files do not count) -> ``"git"``;
    2. :data:`ENV`, when set and not empty -> ``"SCALELADDER_GIT_COMMIT"``;
    3. the file ``stamp``, when given and present (``.whl/COMMIT``) -> ``stamp_says``
       (default: its path);
    4. ``("", "no git, no SCALELADDER_GIT_COMMIT[, no <stamp>]")``: a wheel installed
       without either. Callers that must print something print "unknown".
    """
    here = str(where)
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else ""), "git"
    except (OSError, subprocess.SubprocessError):
        pass
    if os.environ.get(ENV):
        return os.environ[ENV], ENV
    if stamp is not None and stamp.is_file():
        return stamp.read_text().strip(), stamp_says or str(stamp)
    return "", f"no git, no {ENV}" + (f", no {stamp}" if stamp is not None else "")


def git_commit(where: str | Path = PACKAGE) -> str:
    """The commit alone (git, else :data:`ENV`, else ""): see :func:`commit_and_source`."""
    return commit_and_source(where)[0]
