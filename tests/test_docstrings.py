"""Every package's docstring names each of its modules, one line each, and nothing else.

The form (docs/design.md, "The house": a package's ``__init__.py`` says its one idea): a
bullet line whose first word is the module's name, in double backquotes or as ``:mod:`.x```::

    - ``store``: result files, one HDF5 per rung
    * ``loader``     the WebDataset loader
    * :mod:`.static` parameters, gradients and optimizer state per rank

One bullet, one module (a bullet's other names are prose, not the list). A subpackage may be
listed like a module; a listed name must exist. Packages are found on disk, so a new one
(or a new module) is held to this without touching the test. Read with ``ast``: nothing
is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "scaleladder"
LISTED = re.compile(r"^\s*[*-]\s+(?:``(\w+)``|:mod:`\.?(\w+)`)")


def packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py"))


def listed(package: Path) -> list[str]:
    """The names the package's docstring lists, in order (a name listed twice appears twice)."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return [m.group(1) or m.group(2) for m in map(LISTED.match, doc.splitlines()) if m]


def on_disk(package: Path) -> tuple[set[str], set[str]]:
    """(module files, subpackages) of ``package``."""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    subpackages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return modules, subpackages


def _id(package: Path) -> str:
    return str(package.relative_to(PACKAGE.parent)).replace("/", ".")


@pytest.mark.parametrize("package", packages(), ids=_id)
def test_the_docstring_lists_each_module_once_and_only_what_exists(package: Path) -> None:
    names = listed(package)
    modules, subpackages = on_disk(package)
    missing = sorted(modules - set(names))
    stale = sorted(set(names) - modules - subpackages)
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not (missing or stale or twice), (
        f"{_id(package)}/__init__.py's docstring: "
        + "; ".join(f"{what}: {', '.join(ns)}" for what, ns in
                    (("not listed (one bullet each: '- ``name``: ...')", missing), ("listed but not on disk", stale),
                     ("listed twice", twice)) if ns))


def test_the_form_is_read_as_documented() -> None:
    doc = '"""Idea.\n\n- ``store``: x\n* ``loader``     y\n* :mod:`.static` z\n- ``a``, ``b``: prose\nsee ``c``\n"""\n'
    tree = ast.parse(doc)
    lines = (ast.get_docstring(tree) or "").splitlines()
    assert [m.group(1) or m.group(2) for m in map(LISTED.match, lines) if m] == ["store", "loader", "static", "a"]
