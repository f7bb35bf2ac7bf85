"""Write a shard set: ``NAME-%06d.tar`` files, ``tokenizer.json`` and ``manifest.json``, atomically.

Atomicity: everything is written into a hidden staging directory next to the
target (same filesystem, so ``os.rename`` is atomic) and renamed into place only
once the manifest is complete. A failure or an interrupt (Ctrl-C, SIGTERM) removes
the staging directory; even a SIGKILL leaves only a ``.NAME.partial-*`` directory
without a manifest, which nothing will mistake for a shard set.

Determinism (same input + seed => byte-identical files): tar headers carry a fixed
mtime (0), uid/gid 0, empty user/group names and mode 0444; members of a sample are
written in sorted order; JPEGs are encoded with fixed settings; keys are sample
numbers; the manifest has no timestamp; the tokenizer is trained deterministically.

Trap: a WebDataset key is everything up to the FIRST dot of a member name, so a
key taken from a file name like ``img.v2.jpg`` would split one sample into two.
Keys here are zero-padded sample numbers: no dots, and they sort in write order.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaleladder.data import tokenizer as tokmod
from scaleladder.data.data_errors import DataError
from scaleladder.data.jpeg import MAX_BYTES_AFTER_EOI, check_jpeg_end  # noqa: F401 - re-exported (tests, callers)
from scaleladder.data.manifest import write_manifest
from scaleladder.data.prepare import JPEG_QUALITY, Prepared, prepare_image, prepared_stream  # noqa: F401 - re-exported
from scaleladder.data.sources import BadSample, Item, Pending
from scaleladder.data.tarout import ShardFile
from scaleladder.log import get_logger

_log = get_logger(__name__)

MAX_SKIP_EXAMPLES = 20
PROGRESS_EVERY_S = 2.0


@dataclass
class ShardOptions:
    name: str = "data"
    per_shard: int = 64
    image_size: int | None = None  # None: keep source JPEGs as they are (re-encode other formats)
    skip_bad: bool = False
    vocab_size: int = tokmod.DEFAULT_VOCAB_SIZE
    vocab_file: Path | None = None
    progress: bool = True
    overwrite: bool = False
    samples: int | None = None  # stop after this many GOOD samples (None: all)
    expected: int | None = None  # how many items the source holds, when known (progress total / ETA)
    classes: list[str] | None = None  # class names when the source's labels are names (id = index)
    progress_every: float = PROGRESS_EVERY_S
    threads: int | None = None  # reader/validator threads (None: a default from the core count; 0: none)


def sample_members(key: str, p: Prepared) -> list[tuple[str, bytes]]:
    """A sample's tar members, in sorted order (``cls jpg json txt``, as WebDataset's TarWriter writes them)."""
    item = p.sample
    members = []
    if item.label is not None:
        members.append((f"{key}.cls", str(item.label).encode("ascii")))
    members.append((f"{key}.jpg", p.jpeg))
    members.append((f"{key}.json", json.dumps({**item.meta, "width": p.width, "height": p.height}, sort_keys=True).encode("utf-8")))
    members.append((f"{key}.txt", item.caption.encode("utf-8")))
    return members


class _Progress:
    """One stderr line at most every ``every`` seconds, so short runs stay quiet.

    With a known total (the source's item count, capped by ``--samples``) it adds the
    percentage and an ETA from the rate so far. Skipped items never count, so with
    ``--skip-bad`` the total is an upper bound and the ETA a little pessimistic.
    """

    def __init__(self, enabled: bool, every: float, total: int | None) -> None:
        self.enabled, self.every, self.total = enabled, every, total
        self.start = self.last = time.monotonic()

    def update(self, samples: int, shards: int, nbytes: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < self.every):
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        done = f"{samples}/{self.total} samples ({100 * samples / self.total:.0f}%)" if self.total else f"{samples} samples"
        line = (f"shard: {done}, {shards} shards, {nbytes / 1e6:.1f} MB, "
                f"{nbytes / 1e6 / elapsed:.1f} MB/s, {samples / elapsed:.0f} samples/s")
        if self.total and samples and not final:
            line += f", ETA {_duration(max(self.total - samples, 0) * elapsed / samples)}"
        _log.info(line)


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"min": min(values), "max": max(values), "mean": round(sum(values) / len(values), 3)}


@dataclass
class Stats:
    widths: list[float] = field(default_factory=list)
    heights: list[float] = field(default_factory=list)
    words: list[float] = field(default_factory=list)
    labels: Counter[int] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)


def _place(staging: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished staging directory to ``out`` (replacing it only with ``overwrite``)."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise DataError(f"{out}: output directory exists and is not empty (pass --overwrite to replace it)")
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        old = trash / out.name
        os.rename(out, old)
        try:
            os.rename(staging, out)
        except BaseException:
            # Put the old set back: a failed (or interrupted) --overwrite must leave
            # what was there, not a hidden .NAME.old-* directory and no ``out``.
            try:
                os.rename(old, out)
            except OSError as e:
                raise OSError(f"{out}: replacing it failed, and so did restoring the old set, which is in {old} ({e})") from None
            shutil.rmtree(trash, ignore_errors=True)
            raise
        shutil.rmtree(trash, ignore_errors=True)
        return
    if out.exists():
        out.rmdir()  # an empty directory (e.g. made by a workflow engine) is fine to take over
    os.rename(staging, out)


def _publishable(staging: Path) -> None:
    # mkdtemp makes a 0700 directory; the published set should follow the umask like
    # any other directory (a shared project space must be able to read it).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)


def staging_dir(parent: Path, prefix: str) -> Path:
    """A new staging folder ``<prefix><host>-<pid>-<random>`` in ``parent``, after removing
    the ones of the same prefix that a killed run (SIGKILL: no ``finally``) left on this host;
    never a live process's (results.store.remove_dead_leftovers)."""
    from scaleladder.files import host_tag, remove_dead_leftovers

    remove_dead_leftovers(parent, re.escape(prefix) + r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>[0-9]+)-[^/]*")
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{host_tag()}-{os.getpid()}-", dir=parent))


def write_shard_set(items: Iterable[Item | Pending], out: Path, opts: ShardOptions, provenance: dict[str, Any]) -> Path:
    """Write every good sample of ``items`` into a new shard set at ``out``; return its manifest path.

    ``provenance`` (command, options, source) is stored in the manifest as given.
    """
    out = Path(out).absolute()
    if opts.per_shard < 1:
        raise DataError(f"--per-shard must be >= 1, got {opts.per_shard}")
    if out.exists() and any(out.iterdir()) and not opts.overwrite:
        raise DataError(f"{out}: output directory exists and is not empty (pass --overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(out.parent, f".{out.name}.partial-")
    try:
        manifest = _write(items, staging, opts, provenance)
        _publishable(staging)
        _place(staging, out, opts.overwrite)
        return out / manifest.name
    finally:
        # On success the staging directory was renamed away; on any failure or
        # interrupt this removes the half-written set.
        shutil.rmtree(staging, ignore_errors=True)


INTERRUPTED = threading.Event()  # set by the CLI's SIGTERM handler


class Interrupted(KeyboardInterrupt):
    """A SIGTERM (or the flag it left) stopping a shard run; ``except KeyboardInterrupt`` catches it.

    TRAP: not a plain KeyboardInterrupt. When one is raised inside code a C extension runs
    through ``PyRun_String`` (an import of numpy's C parts, where a signal can land), CPython
    notes an "unhandled" KeyboardInterrupt even though ours is caught, and a ``python -m``
    process then kills itself with SIGINT at exit: exit -2 after "interrupted", not 1 (seen
    in CI). CPython compares the exception's type exactly, so a subclass is never noted.
    """


def _write(items: Iterable[Item | Pending], staging: Path, opts: ShardOptions, provenance: dict[str, Any]) -> Path:
    shards: list[dict[str, Any]] = []
    captions: list[str] = []
    stats = Stats()
    known = [x for x in (opts.samples, opts.expected) if x is not None]
    progress = _Progress(opts.progress, opts.progress_every, min(known) if known else None)
    total_bytes = 0
    tar: ShardFile | None = None
    in_shard = 0

    def close_shard() -> None:
        nonlocal tar, in_shard, total_bytes
        if tar is None:
            return
        size, sha = tar.close()  # end-of-archive blocks, padded to a record, as tarfile writes them
        shards.append({"url": tar.path.name, "nsamples": in_shard, "filesize": size, "sha256": sha})
        total_bytes += size
        tar, in_shard = None, 0

    def skip(bad: BadSample) -> None:
        if not opts.skip_bad:
            raise DataError(bad.message + " (pass --skip-bad to skip such samples)")
        stats.skipped[bad.reason] += 1
        if len(stats.examples) < MAX_SKIP_EXAMPLES:
            stats.examples.append(bad.message)

    n = 0
    stream = prepared_stream(items, opts.image_size, opts.threads)
    try:
        for p in stream:
            if INTERRUPTED.is_set():
                # The signal handler's KeyboardInterrupt can be swallowed when it fires
                # inside a __del__ or a library callback ("Exception ignored in ...");
                # the flag makes the stop certain.
                raise Interrupted("interrupted by a signal")
            if isinstance(p, BadSample):
                skip(p)
                continue
            if tar is None:
                tar = ShardFile(staging / f"{opts.name}-{len(shards):06d}.tar")
            for name, data in sample_members(f"{n:09d}", p):
                tar.add(name, data)
            item = p.sample
            if item.label is not None:
                stats.labels[item.label] += 1
            captions.append(item.caption)
            stats.widths.append(p.width)
            stats.heights.append(p.height)
            stats.words.append(len(item.caption.split()))
            n += 1
            in_shard += 1
            if in_shard == opts.per_shard:
                close_shard()
            progress.update(n, len(shards), total_bytes + (tar.size if tar else 0))
            if n == opts.samples:
                break  # counted after validation, so --samples N --skip-bad still writes N good ones
        close_shard()
    finally:
        stream.close()  # stops the reader threads before the staging directory is removed
        close_items = getattr(items, "close", None)
        if close_items is not None:
            close_items()  # a source generator stopped early holds an open tar or table
        if tar is not None:
            tar.abort()  # failed mid-shard: stop its sink thread before the staging cleanup
    progress.update(n, len(shards), total_bytes, final=n > 0 and time.monotonic() - progress.start > progress.every)

    return finish_set(staging, opts, provenance, shards, captions, stats)


def finish_set(staging: Path, opts: ShardOptions, provenance: dict[str, Any], shards: list[dict[str, Any]],
               captions: list[str], stats: Stats) -> Path:
    """Tokenizer + manifest for the shards already in ``staging``; returns the manifest path.

    Shared by the one-process writer and the gather step of sliced sharding (:mod:`slices`),
    so that both describe a set the same way.
    """
    n = len(captions)
    total_bytes = sum(s["filesize"] for s in shards)
    if n == 0:
        first = f"; first: {stats.examples[0]}" if stats.examples else ""
        raise DataError(f"no samples to write ({sum(stats.skipped.values())} skipped as bad{first})")

    if opts.progress:  # a long caption set takes a while here, after the last progress line
        _log.info(f"shard: {'loading the tokenizer' if opts.vocab_file else 'training the tokenizer on'} "
                  f"{n} captions ({sum(map(len, captions)) / 1e6:.1f} MB) ...")
    tok = tokmod.from_vocab_file(opts.vocab_file) if opts.vocab_file else tokmod.train_wordpiece(captions, opts.vocab_size)
    tok_path = tokmod.save(tok, staging)
    lengths = [len(e.ids) for e in tok.encode_batch(captions)]  # with [CLS] and [SEP]

    labelled = sum(stats.labels.values())
    # A caption that was not UTF-8 was decoded with its bad bytes replaced by U+FFFD
    # (sources.py): counted and said, never silent.
    not_utf8 = sum("\ufffd" in c for c in captions)
    if not_utf8:
        _log.warning(f"scaleladder shard: {not_utf8} caption(s) were not valid UTF-8; their undecodable bytes were replaced "
                     "with U+FFFD (manifest: stats.captions_not_utf8)")
    info: dict[str, Any] = {
        **provenance,
        "members": {"image": "jpg", "caption": "txt", "label": "cls", "meta": "json"},
        "classes": opts.classes,
        "tokenizer": {
            "path": tok_path.name,
            "vocab_size": tok.get_vocab_size(),
            "sha256": hashlib.sha256(tok_path.read_bytes()).hexdigest(),
            "from": str(opts.vocab_file) if opts.vocab_file else f"trained on the captions (--vocab-size {opts.vocab_size})",
        },
        "stats": {
            "samples": n,
            "shards": len(shards),
            "bytes": total_bytes,
            "image_width": _summary(stats.widths),
            "image_height": _summary(stats.heights),
            "caption_words": _summary(stats.words),
            "caption_tokens": _summary(lengths),
            "captions_not_utf8": not_utf8,
            "labelled": labelled,
            # Named classes count even when all of a class's samples were skipped: ids are fixed by the names.
            "num_classes": max(max(stats.labels, default=-1) + 1, len(opts.classes or [])) if labelled else None,
            "label_counts": {str(k): v for k, v in sorted(stats.labels.items())},
        },
        "skipped": {
            "total": sum(stats.skipped.values()),
            "by_reason": dict(sorted(stats.skipped.items())),
            "examples": stats.examples,
        },
    }
    return write_manifest(staging, opts.name, shards, info)
