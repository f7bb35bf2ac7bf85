"""Sharding as N parallel jobs: ``--slice K/N`` writes one slice's shards, ``--gather N`` the set.

The layout that makes the result independent of N: sample ``i`` of the source (its
global index in the seeded, sorted order) gets the key ``%09d`` % i and goes into shard
``i // per_shard``. A slice is a run of whole shards, so every shard is written by
exactly one job, whose bytes depend on the shard's samples only, and shard names do
not depend on N. Slice K of N holds shards ``K*S//N .. (K+1)*S//N - 1`` of the
``S = ceil(T / per_shard)``, that is samples ``first_shard * per_shard ..``.

The difference from the one-process writer (``scaleladder shard`` without ``--parts``):
there, a skipped bad sample leaves no gap (keys count the *good* samples and every
shard is full). Here the index is fixed before anything is read, so with ``--skip-bad``
a shard holding a bad sample has fewer than ``per_shard`` samples, and its keys a gap;
without bad samples the two layouts are the same bytes. ``--samples N`` caps the
*input* at its first N items (the one-process writer stops after N good ones).

What each slice job leaves in ``--parts DIR``: its shards, and last
``slice-KKKK-of-NNNN.json`` (written by rename: its presence means the slice is
complete), holding per sample the index, caption, image size and label, and the
skipped-sample reports. A killed job leaves at most a hidden ``.slice-*.partial-*``
staging directory, so a rerun (Snakemake reruns the jobs whose record is missing)
redoes only that slice. The gather step checks that the records tile the whole
source, links the shards into a staging directory next to ``--out``, trains the
tokenizer on every caption in global order (or loads ``--vocab``), writes the manifest
and renames the set into place, as the one-process writer does.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaleladder.data.data_errors import DataError
from scaleladder.data.prepare import Prepared, prepared_stream
from scaleladder.data.shard import (
    INTERRUPTED,
    MAX_SKIP_EXAMPLES,
    Interrupted,
    ShardOptions,
    Stats,
    _place,
    _Progress,
    _publishable,
    finish_set,
    sample_members,
    staging_dir,
)
from scaleladder.data.sources import BadSample, Item, Pending, Source, Tag
from scaleladder.data.tarout import ShardFile

RECORD_FORMAT = 1


def parse_slice(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), with 0 <= K < N."""
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise DataError(f"--slice {text!r}: expected K/N, e.g. 0/4 (slice K of N, counted from 0)") from None
    if n < 1 or not 0 <= k < n:
        raise DataError(f"--slice {text!r}: need 0 <= K < N")
    return k, n


def record_name(k: int, n: int) -> str:
    return f"slice-{k:04d}-of-{n:04d}.json"


@dataclass(frozen=True)
class SlicePlan:
    k: int
    n: int
    total: int  # samples in the whole (capped) source
    per_shard: int

    @property
    def shards(self) -> int:
        return -(-self.total // self.per_shard)

    @property
    def shard_range(self) -> tuple[int, int]:
        return self.k * self.shards // self.n, (self.k + 1) * self.shards // self.n

    @property
    def item_range(self) -> tuple[int, int]:
        s0, s1 = self.shard_range
        return s0 * self.per_shard, min(s1 * self.per_shard, self.total)


def plan(source: Source, opts: ShardOptions, k: int, n: int) -> SlicePlan:
    if source.indexed is None or source.candidates is None:
        raise DataError("this source cannot be sharded in slices")  # every built-in source can
    if opts.per_shard < 1:
        raise DataError(f"--per-shard must be >= 1, got {opts.per_shard}")
    total = source.candidates if opts.samples is None else min(source.candidates, opts.samples)
    return SlicePlan(k, n, total, opts.per_shard)


def write_slice(source: Source, parts: Path, opts: ShardOptions, k: int, n: int) -> Path:
    """Write slice ``k`` of ``n`` of ``source`` into ``parts``; returns its record's path."""
    p = plan(source, opts, k, n)
    lo, hi = p.item_range
    parts = Path(parts).absolute()
    parts.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(parts, f".{record_name(k, n)}.partial-")
    try:
        assert source.indexed is not None
        shards, rows, skipped = _write_slice(source.indexed(lo, hi, k == n - 1), staging, opts, hi - lo)
        for s in shards:  # the shards first, the record last: the record means "complete"
            os.replace(staging / s["url"], parts / s["url"])
        record = {"format": RECORD_FORMAT, "slice": [k, n], "items": [lo, hi], "total": p.total,
                  "per_shard": opts.per_shard, "name": opts.name, "image_size": opts.image_size,
                  "classes": opts.classes, "source": source.describe, "shards": shards, "samples": rows, "skipped": skipped}
        tmp = staging / "record.json"
        tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(tmp, parts / record_name(k, n))
        return parts / record_name(k, n)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_slice(tagged: Iterator[tuple[Tag, Item | Pending]], staging: Path, opts: ShardOptions,
                 expected: int) -> tuple[list[dict[str, Any]], list[list[Any]], list[list[Any]]]:
    shards: list[dict[str, Any]] = []
    rows: list[list[Any]] = []  # [index, caption, width, height, label]
    skipped: list[list[Any]] = []  # [tag, reason, message]
    progress = _Progress(opts.progress, opts.progress_every, expected)
    tags: deque[Tag] = deque()

    def feed() -> Iterator[Item | Pending]:
        # prepared_stream yields one result per input, in order, so the tags line up.
        for tag, x in tagged:
            tags.append(tag)
            yield x

    tar: ShardFile | None = None
    current = -1
    in_shard = 0

    def close_shard() -> None:
        nonlocal tar, in_shard
        if tar is not None:
            size, sha = tar.close()
            shards.append({"url": tar.path.name, "nsamples": in_shard, "filesize": size, "sha256": sha})
            tar, in_shard = None, 0

    stream = prepared_stream(feed(), opts.image_size, opts.threads)
    try:
        for prepared in stream:
            tag = tags.popleft()
            if INTERRUPTED.is_set():
                raise Interrupted("interrupted by a signal")
            if isinstance(prepared, BadSample):
                if not opts.skip_bad:
                    raise DataError(prepared.message + " (pass --skip-bad to skip such samples)")
                skipped.append([list(tag), prepared.reason, prepared.message])
                continue
            assert isinstance(prepared, Prepared)
            index = tag[0]
            if index // opts.per_shard != current:
                close_shard()
                current = index // opts.per_shard
                tar = ShardFile(staging / f"{opts.name}-{current:06d}.tar")
            assert tar is not None
            for name, data in sample_members(f"{index:09d}", prepared):
                tar.add(name, data)
            in_shard += 1
            s = prepared.sample
            rows.append([index, s.caption, prepared.width, prepared.height, s.label])
            progress.update(len(rows), len(shards), sum(x["filesize"] for x in shards) + tar.size)
        close_shard()
    finally:
        stream.close()
        if tar is not None:
            tar.abort()
    progress.update(len(rows), len(shards), sum(x["filesize"] for x in shards),
                    final=bool(rows) and time.monotonic() - progress.start > progress.every)
    return shards, rows, skipped


def _load_records(parts: Path, n: int) -> list[dict[str, Any]]:
    records = []
    for k in range(n):
        path = parts / record_name(k, n)
        if not path.is_file():
            raise DataError(f"{path}: slice {k}/{n} was not written (its job failed, was killed or has not run): "
                            f"rerun `scaleladder shard --slice {k}/{n}`")
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as e:
            raise DataError(f"{path}: not a slice record ({e})") from None
    first = records[0]
    expect = 0
    for k, r in enumerate(records):
        for field in ("format", "total", "per_shard", "name", "image_size", "classes", "source"):
            if r.get(field) != first.get(field):
                raise DataError(f"{parts / record_name(k, n)}: {field} is {r.get(field)!r}, but slice 0 has "
                                f"{first.get(field)!r}: the slices were written with different options; rerun them")
        lo, hi = r["items"]
        if lo != expect:
            raise DataError(f"{parts / record_name(k, n)}: covers samples {lo}..{hi - 1}, expected it to start at {expect}")
        expect = hi
    if expect != first["total"]:
        raise DataError(f"{parts}: the slices cover {expect} of {first['total']} samples")
    return records


def gather(parts: Path, n: int, out: Path, opts: ShardOptions, provenance: dict[str, Any]) -> Path:
    """Make the shard set at ``out`` from the ``n`` slice records in ``parts``; returns the manifest path."""
    parts, out = Path(parts).absolute(), Path(out).absolute()
    records = _load_records(parts, n)
    if records[0]["name"] != opts.name:
        raise DataError(f"{parts}: the slices were written with --name {records[0]['name']}, not {opts.name}")
    if out.exists() and any(out.iterdir()) and not opts.overwrite:
        raise DataError(f"{out}: output directory exists and is not empty (pass --overwrite to replace it)")
    shards = [s for r in records for s in r["shards"]]
    for s in shards:
        path = parts / s["url"]
        size = path.stat().st_size if path.is_file() else None
        if size != s["filesize"]:
            raise DataError(f"{path}: {'missing' if size is None else f'{size} bytes'}, but its slice record says "
                            f"{s['filesize']} bytes: rerun that slice")
    stats = Stats()
    captions = []
    for r in records:
        for _index, caption, width, height, label in r["samples"]:
            captions.append(caption)
            stats.widths.append(width)
            stats.heights.append(height)
            stats.words.append(len(caption.split()))
            if label is not None:
                stats.labels[label] += 1
    for _tag, reason, message in sorted((tuple(t), reason, msg) for r in records for t, reason, msg in r["skipped"]):
        stats.skipped[reason] += 1
        if len(stats.examples) < MAX_SKIP_EXAMPLES:
            stats.examples.append(message)
    opts.classes = records[0]["classes"]
    provenance = {**provenance, "source": records[0]["source"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(out.parent, f".{out.name}.partial-")
    try:
        for s in shards:
            _link_or_copy(parts / s["url"], staging / s["url"])
        manifest = finish_set(staging, opts, provenance, shards, captions, stats)
        _publishable(staging)
        _place(staging, out, opts.overwrite)
        return out / manifest.name
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    # A hard link costs no space and no time; the parts stay intact, so a failed gather
    # can simply be rerun. Across filesystems (parts elsewhere) it is a copy.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
