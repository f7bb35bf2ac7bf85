"""JSON Lines: one JSON object per row, every column present (``null`` for a gap), standard
library only. NaN and infinities are written as ``null`` (they are not JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

NEEDS = ("", "")


def _cell(v: object) -> object:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, object]],
          kinds: Mapping[str, str] | None = None) -> None:
    del kinds  # JSON has no column types beyond its values'
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps({c: _cell(r.get(c)) for c in columns}, allow_nan=False) + "\n")
