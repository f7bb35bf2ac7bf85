"""The table formats scaleladder writes (``export``, ``compare --table``): one module per format.

The outputs table, :data:`FORMATS`, maps a file suffix to the module that writes it. A new
format is one module with ``write(path, columns, rows, kinds=None)`` (and ``NEEDS``, the
package it imports and the extra that carries it, or ``("", "")``) plus one row here.

- ``csv_out``: CSV, standard library only
- ``jsonl_out``: JSON Lines, standard library only
- ``parquet_out``: Parquet, through pyarrow (the ``parquet`` extra)

The API the commands call:

- :func:`format_of` ``(path)``: the format's module, or a one-line ``SpecError`` (exit 2)
  naming an unknown suffix or a missing package, before any work is done;
- :func:`check` ``(path)``: :func:`format_of`, and its folder made and written to (or a
  one-line ``SpecError`` naming ``path``, exit 2), so that a command fails before its work;
- :func:`write_table` ``(path, columns, rows, kinds=None)``: the table, atomically (a
  temporary file renamed onto ``path``: a failed write leaves no partial file). ``rows`` may
  be a generator: CSV and JSON Lines stream it, Parquet writes it in row groups of 65,536.
  ``kinds`` (column -> ``bool``, ``int64``, ``double`` or ``string``) fixes a column's type
  where the values might not show it (a column empty in the first row group); only Parquet
  reads it.

A cell is ``None`` (an empty cell, JSON ``null``), a ``bool``, an ``int``, a ``float`` or a
``str``; every format keeps those kinds (CSV: pandas reads numbers as numbers, ``true``/
``false`` as booleans).
"""

from __future__ import annotations

import importlib
import importlib.util
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

from scaleladder.errors import SpecError
from scaleladder.files import atomic_file, write_error

Cell = None | bool | int | float | str
Row = Mapping[str, Cell]

#: suffix -> the module that writes it (its extra, when it needs one, named in the module's NEEDS)
FORMATS: dict[str, str] = {
    ".csv": "scaleladder.results.outputs.csv_out",
    ".jsonl": "scaleladder.results.outputs.jsonl_out",
    ".parquet": "scaleladder.results.outputs.parquet_out",
}


def format_of(path: str | Path) -> ModuleType:
    """The module that writes ``path``'s format, checked before any work: an unknown suffix or a
    format whose package is not installed is one line naming it (SpecError, exit 2)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise SpecError(f"{path}: unknown table format {suffix or '(no suffix)'!r} (known: {', '.join(FORMATS)})")
    module = importlib.import_module(FORMATS[suffix])
    needs, extra = getattr(module, "NEEDS", ("", ""))
    if needs and importlib.util.find_spec(needs) is None:
        raise SpecError(f"{path}: a {suffix} table needs {needs}: pip install 'scaleladder[{extra}]'")
    return module


def check_folder(path: str | Path) -> None:
    """``path``'s folder made and written to now: a file in its way, a read-only folder or
    filesystem is bad input, one line naming ``path`` (SpecError, exit 2)."""
    folder = Path(path).parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise SpecError(str(write_error(path, e))) from None


def check(path: str | Path) -> ModuleType:
    """:func:`format_of` ``path``, with its folder made now (:func:`check_folder`)."""
    module = format_of(path)
    check_folder(path)
    return module


def write_table(path: str | Path, columns: Sequence[str], rows: Iterable[Row],
                kinds: Mapping[str, str] | None = None) -> None:
    """``rows`` (each a mapping of some of ``columns``; a missing key is an empty cell) as the
    table ``path``, in the format its suffix names, atomically; ``kinds``: column types where
    the values may not show them (Parquet)."""
    module = format_of(path)
    with atomic_file(path) as tmp:
        module.write(tmp, list(columns), rows, kinds)
