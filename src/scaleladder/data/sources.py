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
import random
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from scaleladder.data import synthetic
from scaleladder.data.errors import DataError
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
INTEGER_LABELS = Labels(())  # sidecar .cls files: integers only


@dataclass
class Source:
    items: Iterator[Item]
    describe: dict[str, Any]  # the manifest's "source"
    candidates: int | None = None  # items to expect, when known up front (progress total and ETA)
    classes: list[str] | None = None  # when labels are class names: label id = index


# -- synthetic --------------------------------------------------------------------------


def iter_synthetic(samples: int, seed: int, image_size: int) -> Iterator[Item]:
    for i in range(samples):
        s = synthetic.make_sample(seed, i, image_size)
        yield RawSample(f"synthetic sample {i}", s.jpeg, s.caption, s.label, {"index": i})


def synthetic_source(samples: int, seed: int, image_size: int) -> Source:
    return Source(iter_synthetic(samples, seed, image_size), {"kind": "synthetic", "seed": seed}, samples)


# -- a folder of images with sidecar captions ------------------------------------------


def list_images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"{folder}: image folder does not exist")
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
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
    return Source(_iter_folder(folder, images), {"kind": "folder", "images": str(folder)}, len(images))


def _iter_folder(folder: Path, images: list[Path]) -> Iterator[Item]:
    for path in images:
        rel = path.relative_to(folder).as_posix()
        txt = path.with_suffix(".txt")
        if not txt.is_file():
            yield BadSample(rel, "no_caption", f"{path}: no caption (expected sidecar {txt.name})")
            continue
        caption = txt.read_text(encoding="utf-8", errors="replace").strip()
        if not caption:
            yield BadSample(rel, "no_caption", f"{txt}: caption file is empty")
            continue
        cls = path.with_suffix(".cls")
        try:
            label = INTEGER_LABELS(cls.read_text()) if cls.is_file() else None
        except ValueError:
            yield BadSample(rel, "bad_label", f"{cls}: label is not a non-negative integer")
            continue
        yield RawSample(str(path), path.read_bytes(), caption, label, {"source": rel})


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
    items = _iter_table(table, base, _shuffled(rows, seed), path_col, cap_col, label_col, labels)
    return Source(items, describe, len(rows), labels.classes)


def _iter_table(table: Path, base: Path, rows: list[tuple[int, dict[str, Any] | None, str]], path_col: str, cap_col: str,
                label_col: str | None, labels: Labels) -> Iterator[Item]:
    for n, row, err in rows:
        where = f"{table.name}:{n}"
        if row is None:
            yield BadSample(where, "bad_row", f"{table}:{n}: {err}")
            continue
        rel = str(row.get(path_col) or "").strip()
        path = base / rel
        if not rel or not path.is_file():
            yield BadSample(where, "missing_file", f"{table}:{n} ({path_col}={rel!r}): file {path} does not exist")
            continue
        caption = str(row.get(cap_col) or "").strip()
        if not caption:
            yield BadSample(where, "no_caption", f"{table}:{n} ({path_col}={rel!r}): empty {cap_col!r}")
            continue
        raw = row.get(label_col) if label_col else None
        try:
            label = labels(raw)
        except ValueError as e:
            yield BadSample(where, "bad_label", f"{table}:{n} ({label_col}={raw!r}): bad label ({e})")
            continue
        yield RawSample(f"{table}:{n} ({path_col}={rel!r})", path.read_bytes(), caption, label, {"source": rel})


# -- existing WebDataset shards ---------------------------------------------------------


def expand_shards(specs: list[str]) -> list[Path]:
    """Shard files from paths, directories (every ``*.tar`` in it) and brace patterns ``a-{000..009}.tar``."""
    from webdataset.shardlists import expand_urls  # type: ignore[import-untyped]  # braceexpand, as WebDataset does

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


def _scan_wds(shards: list[Path]) -> tuple[int, Labels]:
    """(samples, labels) of the input shards, reading only tar headers and the small cls/json members.

    Costs a second pass over the headers (the image data is skipped, not read): the
    label ids must be fixed before the first sample is written.
    """
    samples, raw = 0, []
    for shard in shards:
        try:
            for _key, group in _tar_groups(shard, "r:*", frozenset({"cls", "json"})):
                samples += 1
                raw.append(_raw_label(group, _meta(group)))
        except (tarfile.TarError, EOFError, OSError):
            pass  # the reading pass reports the damage, naming the shard
    return samples, Labels(raw)


def wds_source(specs: list[str]) -> Source:
    shards = expand_shards(specs)
    samples, labels = _scan_wds(shards)
    describe = {"kind": "webdataset", "shards": [str(s) for s in shards]}
    return Source(_iter_wds(shards, labels), describe, samples, labels.classes)


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
                where = f"{shard}: key {key}"
                image_ext = next((e for e in IMAGE_MEMBERS if e in group), None)
                if image_ext is None:
                    yield BadSample(where, "no_image", f"{shard}: key {key} has no image member ({'/'.join(IMAGE_MEMBERS)})")
                    continue
                meta = _meta(group)
                caption = group["txt"].decode("utf-8", "replace").strip() if "txt" in group else str(meta.get("caption") or "").strip()
                if not caption:
                    yield BadSample(where, "no_caption", f"{shard}: key {key} has no caption (no txt member, no 'caption' in json)")
                    continue
                raw = _raw_label(group, meta)
                try:
                    label = labels(raw)
                except ValueError as e:
                    yield BadSample(where, "bad_label", f"{shard}: key {key} label {raw!r}: bad label ({e})")
                    continue
                keep: dict[str, Any] = {k: meta[k] for k in ("url", "key", "width", "height") if k in meta}
                yield RawSample(where, group[image_ext], caption, label, {"source": f"{shard.name}:{key}", **keep})
        except (tarfile.TarError, EOFError, OSError) as e:
            # A truncated or corrupt tar: what was read before the damage is kept.
            yield BadSample(shard.name, "corrupt_tar", f"{shard}: truncated or corrupt tar ({e})")
            continue
        if groups == 0:
            yield BadSample(shard.name, "empty_tar", f"{shard}: tar holds no samples")
