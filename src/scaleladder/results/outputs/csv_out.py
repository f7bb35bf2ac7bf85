"""CSV (RFC 4180, UTF-8, a header row), standard library only.

Cells: ``None`` is an empty cell (pandas: NaN), booleans ``true``/``false`` (pandas' default
true/false values: a column without gaps reads as ``bool``), floats in ``repr`` (round-trip
exact), text as it is, quoted where it holds a comma, quote or newline.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

NEEDS = ("", "")


def cell(v: object) -> object:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


def write(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, object]],
          kinds: Mapping[str, str] | None = None) -> None:
    del kinds  # CSV has no column types
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([cell(r.get(c)) for c in columns])
