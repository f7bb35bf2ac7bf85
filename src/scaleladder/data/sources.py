"""Where ``scaleladder shard`` reads samples from.

Every source yields, in a deterministic order, either a :class:`RawSample` (image
bytes, caption, optional label) or a :class:`BadSample` (what is wrong, naming the
file and key). The writer decides: raise on the first bad one, or with
``--skip-bad`` count it in the manifest. Problems with the source as a whole (an
empty folder, a table without a caption column) raise :class:`DataError` at once:
there is nothing to skip to.

A source is a :class:`Source`: its items, plus what is known before reading them
(how many candidates there are, for progress; the class names, when labels are
names: see :mod:`labels`). Sources do not apply ``--samples``: the writer stops
after N *good* samples, so that ``--samples N --skip-bad`` still writes N.

Sources:

* ``synthetic`` (the default): :mod:`scaleladder.data.synthetic`;
* a folder of images, captions in sidecar ``NAME.txt`` (labels, optionally, in ``NAME.cls``);
* a folder of images plus a CSV/JSONL table with path, caption and optional label columns;
* existing WebDataset shards (e.g. img2dataset output: ``jpg``, ``txt``, ``json`` members).
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

from scaleladder.data.data_errors import DataError
from scaleladder.data.labels import Labels

IMAGE_SUFFIXES: tuple[str, ...] = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
IMAGE_MEMBERS: tuple[str, ...] = ("jpg", "jpeg", "png", "webp")
# Accepted column names, first match wins (CC3M/LAION tables call them filepath/title/...).
PATH_COLUMNS: tuple[str, ...] = ("path", "filepath", "file", "image", "filename")
CAPTION_COLUMNS: tuple[str, ...] = ("caption", "text", "title")
LABEL_COLUMNS: tuple[str, ...] = ("label", "class", "cls")


@dataclass(frozen=True)
class RawSample:
    origin: str  # what an error message names: "photos/cat.jpg", "caps.csv:7 (path='x.jpg')", "in.tar: key 000012"
    image: bytes
    caption: str
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # provenance, kept in the sample's json member


@dataclass(frozen=True)
class BadSample:
    origin: str
    reason: str  # corrupt_image | no_caption | missing_file | no_image | bad_label | bad_row | corrupt_tar | empty_tar
    message: str  # one line naming the file and key


Item = RawSample | BadSample
# An item whose files are not read yet: the writer calls it on a reader thread, so
# reads overlap with writing (see :mod:`prepare`). Everything that touches the disk
# per item (sidecar captions and labels, the image) happens inside the call.
Pending = Callable[[], Item]
INTEGER_LABELS = Labels(())  # sidecar .cls files: integers only


# Sliced sharding (:mod:`slices`): an item tagged with where it stands in the whole
# source, (index, input tar, phase). ``index`` is the global sample index for a sample
# (phase 1); a source-level problem (a truncated or empty input tar: phase 0 before
# the tar's samples, 2 after) carries the index of the sample it precedes. Slices sort
# their skipped-sample reports by this tag, so the report does not depend on N.
Tag = tuple[int, int, int]
Tagged = tuple[Tag, Item | Pending]


@dataclass
class Source:
    items: Iterator[Item | Pending]
    describe: dict[str, Any]  # the manifest's "source"
    candidates: int | None = None  # items to expect, when known up front (progress total and ETA)
    classes: list[str] | None = None  # when labels are class names: label id = index
    # The items with global indices lo..hi-1 (``last``: also what comes after the last
    # one); only the slice's own input is read. None: the source cannot be sliced.
    indexed: Callable[[int, int, bool], Iterator[Tagged]] | None = None


# -- synthetic --------------------------------------------------------------------------


def iter_synthetic(samples: int, seed: int, image_size: int) -> Iterator[Item]:
    from scaleladder.data import synthetic  # numpy: a third of a second to import, for this source only

    for i in range(samples):
        s = synthetic.make_sample(seed, i, image_size)
        yield RawSample(f"synthetic sample {i}", s.jpeg, s.caption, s.label, {"index": i})


def _synthetic_item(seed: int, i: int, image_size: int) -> Item:
    from scaleladder.data import synthetic

    s = synthetic.make_sample(seed, i, image_size)
    return RawSample(f"synthetic sample {i}", s.jpeg, s.caption, s.label, {"index": i})


def synthetic_source(samples: int, seed: int, image_size: int) -> Source:
    def indexed(lo: int, hi: int, last: bool) -> Iterator[Tagged]:
        for i in range(lo, min(hi, samples)):
            yield (i, 0, 1), partial(_synthetic_item, seed, i, image_size)  # made on a writer thread

    return Source(iter_synthetic(samples, seed, image_size), {"kind": "synthetic", "seed": seed}, samples, indexed=indexed)


# -- a folder of images with sidecar captions ------------------------------------------


def list_images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"{folder}: image folder does not exist")
    # os.walk's scandir knows the file type from the directory entry (no stat per
    # file, unlike Path.rglob + is_file). Sorted as Paths (by their parts), the order
    # the shuffle and every earlier shard set started from.
    images = [Path(root, name) for root, _dirs, files in os.walk(folder, followlinks=True) for name in files
              if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES]
    images.sort(key=lambda p: p.parts)
    if not images:
        raise DataError(f"{folder}: no images found (looked for {' '.join(IMAGE_SUFFIXES)})")
    return images


def _shuffled(items: list[Any], seed: int) -> list[Any]:
    # Folders are often sorted by class; shuffle once here (seeded, so still
    # reproducible) so that shards mix classes and a shard-level resample is fair.
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


def folder_source(folder: Path, seed: int) -> Source:
    images = _shuffled(list_images(folder), seed)

    def indexed(lo: int, hi: int, last: bool) -> Iterator[Tagged]:
        for i in range(lo, min(hi, len(images))):
            yield (i, 0, 1), partial(_load_folder_item, folder, images[i])

    return Source(_iter_folder(folder, images), {"kind": "folder", "images": str(folder)}, len(images), indexed=indexed)


def _iter_folder(folder: Path, images: list[Path]) -> Iterator[Pending]:
    for path in images:
        yield partial(_load_folder_item, folder, path)


def read_file(path: Path) -> bytes:
    """A file's bytes with as few system calls as a C program would make.

    On the dev VM under load a system call cost 50-150 us, and Python's ``open()``
    makes several per file (open, fstat, an isatty ioctl for text mode, lseek, read,
    read at EOF, close); a folder source reads three files per sample. Here: open,
    fstat, read, close. Raises FileNotFoundError / IsADirectoryError like ``open``.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size) if size else b""
        if len(data) < size or not size:  # a short read, or a file whose size stat does not know (procfs, FUSE)
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    finally:
        os.close(fd)


def _load_folder_item(folder: Path, path: Path) -> Item:
    # Open, and catch what is missing, rather than stat first: each system call counts
    # (see read_file).
    rel = path.relative_to(folder).as_posix()
    txt = path.with_suffix(".txt")
    try:
        # As read_text would (universal newlines), so captions match earlier shard sets.
        caption = read_file(txt).decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").strip()
    except (FileNotFoundError, IsADirectoryError):
        return BadSample(rel, "no_caption", f"{path}: no caption (expected sidecar {txt.name})")
    if not caption:
        return BadSample(rel, "no_caption", f"{txt}: caption file is empty")
    cls = path.with_suffix(".cls")
    try:
        label = INTEGER_LABELS(read_file(cls).decode("utf-8", errors="replace"))
    except (FileNotFoundError, IsADirectoryError):
        label = None
    except ValueError:
        return BadSample(rel, "bad_label", f"{cls}: label is not a non-negative integer")
    try:
        image = read_file(path)
    except (FileNotFoundError, IsADirectoryError):  # a dangling link, or a file removed since the listing
        return BadSample(rel, "missing_file", f"{path}: file does not exist (a dangling link, or removed while sharding)")
    return RawSample(str(path), image, caption, label, {"source": rel})


# -- a folder of images with a CSV / JSONL table ---------------------------------------


def _pick(columns: list[str], wanted: tuple[str, ...]) -> str | None:
    lower = {c.strip().lower(): c for c in columns}
    return next((lower[w] for w in wanted if w in lower), None)


def _read_table(table: Path) -> tuple[list[tuple[int, dict[str, Any] | None, str]], list[str]]:
    """Rows as (line number, row or None if unparsable, error text) and the column names."""
    if not table.is_file():
        raise DataError(f"{table}: caption table does not exist")
    rows: list[tuple[int, dict[str, Any] | None, str]] = []
    columns: list[str] = []
    if table.suffix.lower() == ".jsonl":
        for n, line in enumerate(table.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                rows.append((n, None, f"not a JSON object ({e})"))
                continue
            columns.extend(k for k in row if k not in columns)
            rows.append((n, row, ""))
    elif table.suffix.lower() in (".csv", ".tsv"):
        with table.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="\t" if table.suffix.lower() == ".tsv" else ",")
            columns = list(reader.fieldnames or [])
            # line_num counts physical lines, so it is right even with quoted newlines.
            rows = [(reader.line_num, row, "") for row in reader]
    else:
        raise DataError(f"{table}: caption table must be .csv, .tsv or .jsonl")
    if not rows:
        raise DataError(f"{table}: caption table has no rows")
    return rows, columns


def table_source(table: Path, images: Path | None, seed: int) -> Source:
    """Rows of ``table``; relative paths are relative to ``images`` (default: the table's folder)."""
    rows, columns = _read_table(table)
    base = images if images is not None else table.parent
    path_col = _pick(columns, PATH_COLUMNS)
    cap_col = _pick(columns, CAPTION_COLUMNS)
    label_col = _pick(columns, LABEL_COLUMNS)
    if path_col is None:
        raise DataError(f"{table}: no path column (expected one of {', '.join(PATH_COLUMNS)})")
    if cap_col is None:
        raise DataError(f"{table}: no caption column (expected one of {', '.join(CAPTION_COLUMNS)})")
    labels = Labels(row.get(label_col) for _n, row, _e in rows if row is not None) if label_col else INTEGER_LABELS
    describe = {"kind": "table", "table": str(table), "images": str(images) if images else None}
    shuffled = _shuffled(rows, seed)
    items = _iter_table(table, base, shuffled, path_col, cap_col, label_col, labels)

    def indexed(lo: int, hi: int, last: bool) -> Iterator[Tagged]:
        for i in range(lo, min(hi, len(shuffled))):
            n, row, err = shuffled[i]
            yield (i, 0, 1), partial(_table_item, table, base, n, row, err, path_col, cap_col, label_col, labels)

    return Source(items, describe, len(rows), labels.classes, indexed=indexed)


def _iter_table(table: Path, base: Path, rows: list[tuple[int, dict[str, Any] | None, str]], path_col: str, cap_col: str,
                label_col: str | None, labels: Labels) -> Iterator[Pending]:
    for n, row, err in rows:
        yield partial(_table_item, table, base, n, row, err, path_col, cap_col, label_col, labels)


def _table_item(table: Path, base: Path, n: int, row: dict[str, Any] | None, err: str, path_col: str, cap_col: str,
                label_col: str | None, labels: Labels) -> Item:
    where = f"{table.name}:{n}"
    if row is None:
        return BadSample(where, "bad_row", f"{table}:{n}: {err}")
    rel = str(row.get(path_col) or "").strip()
    path = base / rel
    if not rel or not path.is_file():
        return BadSample(where, "missing_file", f"{table}:{n} ({path_col}={rel!r}): file {path} does not exist")
    caption = str(row.get(cap_col) or "").strip()
    if not caption:
        return BadSample(where, "no_caption", f"{table}:{n} ({path_col}={rel!r}): empty {cap_col!r}")
    raw = row.get(label_col) if label_col else None
    try:
        label = labels(raw)
    except ValueError as e:
        return BadSample(where, "bad_label", f"{table}:{n} ({label_col}={raw!r}): bad label ({e})")
    return RawSample(f"{table}:{n} ({path_col}={rel!r})", read_file(path), caption, label, {"source": rel})


# -- existing WebDataset shards ---------------------------------------------------------


def expand_shards(specs: list[str]) -> list[Path]:
    """Shard files from paths, directories (every ``*.tar`` in it) and brace patterns ``a-{000..009}.tar``."""
    from webdataset.shardlists import expand_urls  # braceexpand, as WebDataset does

    out: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            found = sorted(p.glob("*.tar"))
            if not found:
                raise DataError(f"{p}: no .tar shards in this folder")
            out.extend(found)
            continue
        for url in expand_urls(spec):
            if not Path(url).is_file():
                raise DataError(f"{url}: shard does not exist")
            out.append(Path(url))
    if not out:
        raise DataError("no input shards given")
    return out


_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's rule: key = up to the first dot of the basename


def _tar_groups(shard: Path, mode: Literal["r|*", "r:*"] = "r|*", only: frozenset[str] | None = None) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {ext: data}) per run of members with one key, in tar order (as WebDataset groups them).

    ``only``: read the data of these extensions only (others map to b""); with a
    seekable ``mode`` ("r:*") the rest is skipped without being read.
    """
    current: str | None = None
    group: dict[str, bytes] = {}
    with tarfile.open(shard, mode=mode) as tar:
        for member in tar:
            if not member.isreg():
                continue
            m = _KEY_RE.match(member.name)
            if not m:
                continue
            key, ext = m.group(1), m.group(2).lower()
            data = b""
            if only is None or ext in only:
                f = tar.extractfile(member)
                data = f.read() if f is not None else b""
            if key != current:
                if current is not None:
                    yield current, group
                current, group = key, {}
            group[ext] = data
    if current is not None:
        yield current, group


def _meta(group: dict[str, bytes]) -> dict[str, Any]:
    try:
        meta = json.loads(group["json"]) if "json" in group else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _raw_label(group: dict[str, bytes], meta: dict[str, Any]) -> object:
    return group["cls"].decode("utf-8", "replace") if "cls" in group else meta.get("label")


def _has_end_marker(shard: Path) -> bool:
    """A tar ends with two zero blocks. Trap: Python's tarfile treats a file cut at a
    member boundary as a complete archive and stops silently, so check for them."""
    size = shard.stat().st_size
    if size < 1024 or size % 512:
        return False
    with shard.open("rb") as f:
        f.seek(size - 1024)
        return f.read(1024) == bytes(1024)


def _scan_wds(shards: list[Path]) -> tuple[list[int], Labels]:
    """(samples per shard, labels) of the input shards, reading only tar headers and the small cls/json members.

    Costs a second pass over the headers (the image data is skipped, not read): the
    label ids must be fixed before the first sample is written. The counts also fix
    every sample's global index for sliced sharding.
    """
    counts, raw = [], []
    for shard in shards:
        count = 0
        try:
            for _key, group in _tar_groups(shard, "r:*", frozenset({"cls", "json"})):
                count += 1
                raw.append(_raw_label(group, _meta(group)))
        except (tarfile.TarError, EOFError, OSError):
            pass  # the reading pass reports the damage, naming the shard
        counts.append(count)
    return counts, Labels(raw)


def wds_source(specs: list[str]) -> Source:
    shards = expand_shards(specs)
    counts, labels = _scan_wds(shards)
    describe = {"kind": "webdataset", "shards": [str(s) for s in shards]}

    def indexed(lo: int, hi: int, last: bool) -> Iterator[Tagged]:
        return _iter_wds_indexed(shards, counts, labels, lo, hi, last)

    return Source(_iter_wds(shards, labels), describe, sum(counts), labels.classes, indexed=indexed)


def _wds_item(shard: Path, key: str, group: dict[str, bytes], labels: Labels) -> Item:
    where = f"{shard}: key {key}"
    image_ext = next((e for e in IMAGE_MEMBERS if e in group), None)
    if image_ext is None:
        return BadSample(where, "no_image", f"{shard}: key {key} has no image member ({'/'.join(IMAGE_MEMBERS)})")
    meta = _meta(group)
    caption = group["txt"].decode("utf-8", "replace").strip() if "txt" in group else str(meta.get("caption") or "").strip()
    if not caption:
        return BadSample(where, "no_caption", f"{shard}: key {key} has no caption (no txt member, no 'caption' in json)")
    raw = _raw_label(group, meta)
    try:
        label = labels(raw)
    except ValueError as e:
        return BadSample(where, "bad_label", f"{shard}: key {key} label {raw!r}: bad label ({e})")
    keep: dict[str, Any] = {k: meta[k] for k in ("url", "key", "width", "height") if k in meta}
    return RawSample(where, group[image_ext], caption, label, {"source": f"{shard.name}:{key}", **keep})


def _iter_wds_indexed(shards: list[Path], counts: list[int], labels: Labels, lo: int, hi: int,
                      last: bool) -> Iterator[Tagged]:
    """The samples with global indices lo..hi-1, and the tar-level problems this slice reports.

    Indices come from the header scan (``counts``): tar t's samples are
    ``offset[t] .. offset[t] + counts[t] - 1``, whatever N is; samples the reading pass
    finds past the scanned count are not written. Only tars that overlap the slice are
    read. A tar-level problem (truncated, corrupt, empty) is reported by exactly one
    slice: the one holding the tar's last scanned sample (an empty tar: the one holding
    the index where it stands, the last slice for the end), which reads the tar to its end.
    """
    offset = 0
    for t, (shard, count) in enumerate(zip(shards, counts)):
        o, offset = offset, offset + count
        anchor = o + count - 1 if count else o
        reports = lo <= anchor < hi or (last and count == 0 and o == hi)  # empty tars at the very end: the last slice
        if not reports and (o + count <= lo or o >= hi):
            continue  # no sample of this slice and nothing to report: not read at all
        if reports and not _has_end_marker(shard):
            yield (o, t, 0), BadSample(shard.name, "corrupt_tar", f"{shard}: truncated tar (no end-of-archive blocks)")
        j = 0
        try:
            for key, group in _tar_groups(shard):
                i = o + j
                j += 1
                if j > count or i >= hi:
                    if reports:
                        continue  # read to the end: the damage (if any) is this slice's to report
                    break
                if i >= lo:
                    yield (i, t, 1), _wds_item(shard, key, group, labels)
        except (tarfile.TarError, EOFError, OSError) as e:
            if reports:
                yield (o + min(j, count), t, 2), BadSample(shard.name, "corrupt_tar", f"{shard}: truncated or corrupt tar ({e})")
            continue
        if reports and j == 0:
            yield (o, t, 2), BadSample(shard.name, "empty_tar", f"{shard}: tar holds no samples")


def _iter_wds(shards: list[Path], labels: Labels) -> Iterator[Item]:
    for shard in shards:
        if not _has_end_marker(shard):
            # Reported first (so it is the error without --skip-bad); with --skip-bad the
            # intact samples before the cut are still read.
            yield BadSample(shard.name, "corrupt_tar", f"{shard}: truncated tar (no end-of-archive blocks)")
        groups = 0
        try:
            for key, group in _tar_groups(shard):
                groups += 1
                yield _wds_item(shard, key, group, labels)
        except (tarfile.TarError, EOFError, OSError) as e:
            # A truncated or corrupt tar: what was read before the damage is kept.
            yield BadSample(shard.name, "corrupt_tar", f"{shard}: truncated or corrupt tar ({e})")
            continue
        if groups == 0:
            yield BadSample(shard.name, "empty_tar", f"{shard}: tar holds no samples")
