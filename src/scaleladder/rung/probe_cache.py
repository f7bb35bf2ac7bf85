"""A disk cache for the unused-parameter probe (rung.unused_params.unused_parameter_names).

The probe trains the family's debug flavor one step on the CPU in every rank of every rung:
about 2 s for FLAVA on the 2-core VM (docs/performance.md, "Start-up"), for an answer that
changes only with the code that builds the model and the batch, or with torch or
TorchMultimodal. So the answer is kept in a file whose name is a hash of exactly those: the
family, both versions, and the source of the scaleladder modules the probe runs. Any change
to them is another name, so a stale answer is never read.

Where: ``$SCALELADDER_CACHE``, else ``$XDG_CACHE_HOME/scaleladder``, else
``~/.cache/scaleladder``. A cache that cannot be read or written is skipped: the probe runs.
Written atomically (a temporary file, then a rename), so ranks that write at once never
leave a torn file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

# The modules whose code decides the probe's answer: the model, its init, the debug batch.
SOURCES = ("models/build.py", "flavors.py", "models/init.py", "models/batch_layout.py", "rung/batches.py",
           "models/family.py", "models/families/vit.py", "models/families/flava.py")


def cache_dir() -> Path:
    if os.environ.get("SCALELADDER_CACHE"):
        return Path(os.environ["SCALELADDER_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "scaleladder"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def key(family: str) -> str:
    """A hash of everything the probe's answer depends on."""
    import torch

    h = hashlib.sha256(f"{family}\0{torch.__version__}\0{_version('torchmultimodal-nightly')}\0"
                       f"{_version('torchmultimodal')}\0".encode())
    root = Path(__file__).resolve().parents[1]
    for rel in SOURCES:
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:32]


def path(family: str) -> Path:
    return cache_dir() / f"unused-params-{family}-{key(family)}.json"


def load(family: str) -> frozenset[str] | None:
    try:
        names = json.loads(path(family).read_text())
    except (OSError, ValueError):
        return None
    return frozenset(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None


def store(family: str, names: frozenset[str]) -> None:
    target = path(family)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(sorted(names), f)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a read-only or full cache folder: the next rank probes again, nothing is lost
