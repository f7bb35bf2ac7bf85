"""The annotations that hold ``Any`` do not grow (benchmarks/count_any.py says what counts)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import count_any


def test_the_count_of_annotations_holding_any_does_not_grow() -> None:
    total = sum(count_any.count().values())
    assert total <= count_any.CEILING, (f"{total} annotations hold Any, over the ceiling {count_any.CEILING}: type the new "
                                        "ones (python benchmarks/count_any.py --top 10 lists where)")


def test_the_counter_counts_what_it_says(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from typing import Any, TypeAlias\nNode: TypeAlias = dict[str, Any]\n"
                 "def f(a: Any, b: int, *c: Any, **d: 'list[Any]') -> dict[str, Any]:\n    x: Any = 1\n    y: int = 2\n"
                 "def g(n: Node) -> Node: ...\n")
    ast.parse(f.read_text())
    assert count_any.count_file(f) == 1 + 3 + 1 + 1  # the alias; a, c, d; the return; x (not b, y, nor the alias's uses)
