"""The manifest: what a shard set holds, and the proof that its files are intact.

``manifest.json`` sits in the shard directory. Its top level is a wids shard index
(``__kind__: wids-shard-index-v1``), so ``wids.ShardListDataset`` can read the set
too; shard ``url``s are relative to the manifest. Each shard entry adds its
``sha256``. Everything scaleladder-specific lives under the ``scaleladder`` key::

    {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "synthetic",
     "shardlist": [{"url": "synthetic-000000.tar", "nsamples": 64, "filesize": 532480,
                    "sha256": "..."}, ...],
     "scaleladder": {"format": 1, "command": "...", "options": {...}, "source": {...},
                     "members": {"image": "jpg", "caption": "txt", "label": "cls", "meta": "json"},
                     "tokenizer": {"path": "tokenizer.json", "vocab_size": 178, "sha256": "...", "from": "..."},
                     "stats": {...}, "skipped": {"total": 0, "by_reason": {}, "examples": []}}}

There is no timestamp on purpose: the same command on the same input gives a
byte-identical directory, manifest included.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaleladder.data.data_errors import DataError

MANIFEST_FILE = "manifest.json"
FORMAT = 1
WIDS_KIND = "wids-shard-index-v1"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ShardEntry:
    path: Path  # absolute
    nsamples: int
    filesize: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    path: Path
    shards: list[ShardEntry]
    info: dict[str, Any]  # the "scaleladder" section

    @property
    def samples(self) -> int:
        return sum(s.nsamples for s in self.shards)

    @property
    def tokenizer_path(self) -> Path:
        return self.path.parent / str(self.info["tokenizer"]["path"])

    @property
    def num_classes(self) -> int | None:
        classes = self.info.get("stats", {}).get("num_classes")
        return None if classes is None else int(classes)

    @property
    def tokenizer_vocab_size(self) -> int | None:
        """The stored tokenizer's vocabulary size (what a FLAVA run should record next to the model's)."""
        size = self.info.get("tokenizer", {}).get("vocab_size")
        return None if size is None else int(size)

    @property
    def labelled(self) -> bool:
        stats = self.info.get("stats", {})
        return bool(stats.get("labelled", 0) == stats.get("samples", -1) and stats.get("samples", 0) > 0)


def resolve(manifest: str | Path) -> Path:
    """Accept the manifest file or the shard directory that holds it."""
    p = Path(manifest)
    return p / MANIFEST_FILE if p.is_dir() else p


def read_manifest(manifest: str | Path) -> Manifest:
    path = resolve(manifest)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: manifest does not exist (make one with `scaleladder shard`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: manifest is not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("__kind__") != WIDS_KIND:
        raise DataError(f"{path}: not a wids shard index (__kind__ is not {WIDS_KIND!r})")
    info = doc.get("scaleladder")
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise DataError(f"{path}: not written by `scaleladder shard` (no scaleladder.format {FORMAT})")
    shards = []
    for i, entry in enumerate(doc.get("shardlist") or []):
        try:
            shards.append(ShardEntry(path.parent / entry["url"], int(entry["nsamples"]), int(entry["filesize"]), str(entry["sha256"])))
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{path}: shardlist[{i}] lacks url/nsamples/filesize/sha256") from None
    if not shards:
        raise DataError(f"{path}: shardlist is empty")
    return Manifest(path, shards, info)


def check_sizes(manifest: Manifest) -> None:
    """Cheap check of every shard (exists, right size), before any is hashed."""
    for s in manifest.shards:
        try:
            size = s.path.stat().st_size
        except FileNotFoundError:
            raise DataError(f"{s.path}: shard listed in {manifest.path} does not exist") from None
        if size != s.filesize:
            raise DataError(f"{s.path}: shard is {size} bytes, but {manifest.path.name} says {s.filesize} (truncated or replaced?)")


def verify_shard(entry: ShardEntry, manifest_path: Path) -> None:
    """Full sha256 check of one shard (see :mod:`scaleladder.data.preflight` for who checks which)."""
    actual = sha256_file(entry.path)
    if actual != entry.sha256:
        raise DataError(
            f"{entry.path}: sha256 is {actual}, but {manifest_path.name} expects {entry.sha256}; "
            "the shard is corrupt or was rewritten: re-run `scaleladder shard`"
        )


def write_manifest(directory: Path, name: str, shards: list[dict[str, Any]], info: dict[str, Any]) -> Path:
    doc = {
        "__kind__": WIDS_KIND,
        "wids_version": 1,
        "name": name,
        "shardlist": shards,
        "scaleladder": {"format": FORMAT, **info},
    }
    path = directory / MANIFEST_FILE
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path
