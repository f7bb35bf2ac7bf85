"""Markdown tables, built one way: the report's, the budget's, the planner docs' and gpu-check's.

A table is a list of lines (callers join them with their own paragraphs). Cells are
written as given; ``escape=True`` makes free text safe in a body cell (a ``|`` would
start a new column, a newline would end the table).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def row(cells: Iterable[object], *, escape: bool = False) -> str:
    """One table line: ``| a | b |``."""
    return "| " + " | ".join(_escape(c) if escape else str(c) for c in cells) + " |"


def rule(columns: int) -> str:
    """The line under the header: ``|---|---|``."""
    return "|" + "---|" * columns


def table(header: Sequence[str] | None, rows: Iterable[Sequence[object]], *, escape: bool = False) -> list[str]:
    """The header, its rule and one line per row. ``header=None``: a blank header (``| | |``,
    as wide as the first row), for a two-column list of names and values. ``escape``
    applies to the body's cells, never the header's."""
    lines = [list(r) for r in rows]
    body = [row(r, escape=escape) for r in lines]
    if header is None:
        width = len(lines[0]) if lines else 0
        return ["|" + " |" * width, rule(width), *body]
    return [row(header), rule(len(header)), *body]


def dict_table(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """A table whose header is the first row's keys, in their order; every row has them all."""
    keys = list(rows[0])
    return table(keys, [[r[k] for k in keys] for r in rows])


def _escape(cell: object) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")
