"""Parquet through pyarrow (the ``parquet`` extra), written in row groups of :data:`CHUNK` rows,
so that a long table (``export --steps``) is never held whole.

Each column's type is its kind in ``kinds`` (the caller's hint), else its values' kind in the
first row group: booleans ``bool``, integers ``int64``, numbers with a float among them
``double``, anything else ``string`` (a mixed column is written as text); gaps are nulls.
Later row groups are written with the first one's types.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

NEEDS = ("pyarrow", "parquet")
CHUNK = 65_536


def kind_of(values: list[object]) -> str:
    seen = {type(v) for v in values if v is not None}
    if seen == {bool}:
        return "bool"
    if seen and seen <= {int}:
        return "int64"
    if seen and seen <= {int, float}:
        return "double"
    return "string"


def _values(values: list[object], kind: str) -> list[object]:
    if kind == "double":
        return [None if v is None else float(v) for v in values]  # type: ignore[arg-type]
    if kind == "string":
        return [None if v is None else str(v) for v in values]
    return values


def write(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, object]],
          kinds: Mapping[str, str] | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"bool": pa.bool_(), "int64": pa.int64(), "double": pa.float64(), "string": pa.string()}
    it = iter(rows)
    chunk = list(itertools.islice(it, CHUNK))
    cols = {c: [r.get(c) for r in chunk] for c in columns}
    known = {c: (kinds or {}).get(c) or kind_of(cols[c]) for c in columns}
    schema = pa.schema([(c, types[known[c]]) for c in columns])
    with pq.ParquetWriter(str(path), schema) as w:
        while True:
            w.write_table(pa.Table.from_arrays([pa.array(_values(cols[c], known[c]), type=types[known[c]]) for c in columns],
                                               schema=schema))
            chunk = list(itertools.islice(it, CHUNK))
            if not chunk:
                break
            cols = {c: [r.get(c) for r in chunk] for c in columns}
