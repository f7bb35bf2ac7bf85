"""Parquet through pyarrow (the ``parquet`` extra). Each column's type is its values' kind:
booleans ``bool``, integers ``int64``, numbers with a float among them ``double``, anything
else ``string`` (a mixed column is written as text); gaps are nulls."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

NEEDS = ("pyarrow", "parquet")


def _kind(values: list[object]) -> str:
    seen = {type(v) for v in values if v is not None}
    if seen == {bool}:
        return "bool"
    if seen and seen <= {int}:
        return "int64"
    if seen and seen <= {int, float}:
        return "double"
    return "string"


def write(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, object]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = list(rows)
    arrays = []
    for c in columns:
        values = [r.get(c) for r in data]
        kind = _kind(values)
        if kind == "double":
            values = [None if v is None else float(v) for v in values]  # type: ignore[arg-type]
        elif kind == "string":
            values = [None if v is None else str(v) for v in values]
        arrays.append(pa.array(values, type={"bool": pa.bool_(), "int64": pa.int64(), "double": pa.float64(), "string": pa.string()}[kind]))
    pq.write_table(pa.Table.from_arrays(arrays, names=list(columns)), str(path))
