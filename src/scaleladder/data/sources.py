"""Where ``scaleladder shard`` reads samples from.

Every source yields, in a deterministic order, either a :class:`RawSample` (image
bytes, caption, optional label) or a :class:`BadSample` (what is wrong, naming the
file and key). The writer decides: raise on the first bad one, or with
``--skip-bad`` count it in the manifest. Problems with the source as a whole (an
empty folder, a table without a caption column) raise :class:`DataError` at once:
there is nothing to skip to.

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
from typing import Any

from scaleladder.data import synthetic
from scaleladder.data.errors import DataError

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
    reason: str  # a short kind: corrupt_image | no_caption | missing_file | no_image | bad_label | bad_row | corrupt_tar
    message: str  # one line naming the file and key


Item = RawSample | BadSample


def _parse_label(text: str | int | None) -> int | None:
    if text is None or text == "":
        return None
    label = int(str(text).strip())
    if label < 0:
        raise ValueError(f"negative label {label}")
    return label


# -- synthetic --------------------------------------------------------------------------


def iter_synthetic(samples: int, seed: int, image_size: int) -> Iterator[Item]:
    for i in range(samples):
        s = synthetic.make_sample(seed, i, image_size)
        yield RawSample(f"synthetic sample {i}", s.jpeg, s.caption, s.label, {"index": i})


# -- a folder of images with sidecar captions ------------------------------------------


def list_images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise DataError(f"{folder}: image folder does not exist")
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not images:
        raise DataError(f"{folder}: no images found (looked for {' '.join(IMAGE_SUFFIXES)})")
    return images


def _shuffled(items: list[Any], seed: int, limit: int | None) -> list[Any]:
    # Folders are often sorted by class; shuffle once here (seeded, so still
    # reproducible) so that shards mix classes and a shard-level resample is fair.
    items = list(items)
    random.Random(seed).shuffle(items)
    return items[:limit] if limit is not None else items


def iter_folder(folder: Path, seed: int, limit: int | None) -> Iterator[Item]:
    for path in _shuffled(list_images(folder), seed, limit):
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
            label = _parse_label(cls.read_text().strip()) if cls.is_file() else None
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


def iter_table(table: Path, images: Path | None, seed: int, limit: int | None) -> Iterator[Item]:
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
    for n, row, err in _shuffled(rows, seed, limit):
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
        try:
            label = _parse_label(row.get(label_col)) if label_col else None
        except ValueError:
            yield BadSample(where, "bad_label", f"{table}:{n} ({label_col}={row.get(label_col)!r}): not a non-negative integer")
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


def _tar_groups(shard: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    current: str | None = None
    group: dict[str, bytes] = {}
    with tarfile.open(shard, mode="r|*") as tar:
        for member in tar:
            if not member.isreg():
                continue
            m = _KEY_RE.match(member.name)
            if not m:
                continue
            key, ext = m.group(1), m.group(2).lower()
            f = tar.extractfile(member)
            data = f.read() if f is not None else b""
            if key != current:
                if current is not None:
                    yield current, group
                current, group = key, {}
            group[ext] = data
    if current is not None:
        yield current, group


def _caption_label(group: dict[str, bytes]) -> tuple[str, str | None, dict[str, Any]]:
    meta: dict[str, Any] = {}
    if "json" in group:
        try:
            meta = json.loads(group["json"])
            if not isinstance(meta, dict):
                meta = {}
        except ValueError:
            meta = {}
    caption = group["txt"].decode("utf-8", "replace").strip() if "txt" in group else str(meta.get("caption") or "").strip()
    label = group["cls"].decode().strip() if "cls" in group else meta.get("label")
    return caption, (None if label is None else str(label)), meta


def _has_end_marker(shard: Path) -> bool:
    """A tar ends with two zero blocks. Trap: Python's tarfile treats a file cut at a
    member boundary as a complete archive and stops silently, so check for them."""
    size = shard.stat().st_size
    if size < 1024 or size % 512:
        return False
    with shard.open("rb") as f:
        f.seek(size - 1024)
        return f.read(1024) == bytes(1024)


def iter_wds(shards: list[Path], limit: int | None) -> Iterator[Item]:
    n = 0
    for shard in shards:
        if not _has_end_marker(shard):
            # Reported first (so it is the error without --skip-bad); with --skip-bad the
            # intact samples before the cut are still read.
            yield BadSample(shard.name, "corrupt_tar", f"{shard}: truncated tar (no end-of-archive blocks)")
        try:
            for key, group in _tar_groups(shard):
                if limit is not None and n >= limit:
                    return
                where = f"{shard}: key {key}"
                image_ext = next((e for e in IMAGE_MEMBERS if e in group), None)
                if image_ext is None:
                    yield BadSample(where, "no_image", f"{shard}: key {key} has no image member ({'/'.join(IMAGE_MEMBERS)})")
                    continue
                caption, label_text, meta = _caption_label(group)
                if not caption:
                    yield BadSample(where, "no_caption", f"{shard}: key {key} has no caption (no txt member, no 'caption' in json)")
                    continue
                try:
                    label = _parse_label(label_text)
                except ValueError:
                    yield BadSample(where, "bad_label", f"{shard}: key {key} label {label_text!r} is not a non-negative integer")
                    continue
                keep: dict[str, Any] = {k: meta[k] for k in ("url", "key", "width", "height") if k in meta}
                n += 1
                yield RawSample(where, group[image_ext], caption, label, {"source": f"{shard.name}:{key}", **keep})
        except (tarfile.TarError, EOFError, OSError) as e:
            # A truncated or corrupt tar: what was read before the damage is kept.
            yield BadSample(shard.name, "corrupt_tar", f"{shard}: truncated or corrupt tar ({e})")
