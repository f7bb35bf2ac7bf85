"""The house's one rule, checked: imports point down the flow, and no two modules import
each other (directly or around a loop). docs/design.md draws the same map.

Every import counts, also one inside a function: a late import hides a cycle from
Python, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first. A module may import modules of its own stage and of any stage before it.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("scaleladder.errors", "scaleladder.files", "scaleladder.markdown", "scaleladder.gitinfo", "scaleladder.log")),
    # the run spec and the model registry it reads (data every stage reads): the lowest floor above the base
    ("spec", ("scaleladder.spec", "scaleladder.flavors")),
    ("models", ("scaleladder.models",)),
    ("data", ("scaleladder.data",)),
    ("results", ("scaleladder.results",)),
    ("planner", ("scaleladder.planner",)),
    ("rung", ("scaleladder.rung",)),
    ("campaign", ("scaleladder.campaign",)),
    ("figures", ("scaleladder.figures",)),
    # the site's front doors (plan, doctor, budget, the workflow's logic): they may import every
    # stage below; nothing imports them but the CLI, which names them as strings (cli.COMMANDS)
    ("site", ("scaleladder.site",)),
    ("front doors", ("scaleladder.cli", "scaleladder.__main__", "scaleladder")),
]


def stage_of(module: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(STAGES):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, f"{module} belongs to no stage: add it to STAGES and to docs/design.md"
    return rank


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "scaleladder").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Package modules ``path`` imports, resolved to the modules that exist."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for n in names:
            if n.startswith("scaleladder"):
                # `from scaleladder.rung import loop` names the module rung.loop; a class or
                # function name resolves to the module that holds it
                while n not in known and "." in n:
                    n = n.rsplit(".", 1)[0]
                if n in known:
                    found.add(n)
    return found


GRAPH = {m: imports_of(p, set(modules())) - {m} for m, p in modules().items()}


def test_every_module_has_a_stage() -> None:
    for m in GRAPH:
        stage_of(m)


def test_no_module_imports_a_higher_stage() -> None:
    upward = [f"{m} ({STAGES[stage_of(m)][0]}) imports {d} ({STAGES[stage_of(d)][0]})"
              for m, deps in GRAPH.items() for d in sorted(deps)
              if stage_of(d) > stage_of(m) and not d == "scaleladder"]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    # Tarjan's strongly connected components: any component of two or more is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w == "scaleladder":  # the package's empty __init__: imported by every `from scaleladder import x`
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


#: The top floor: the front doors, the base, and the spec's floor: the run spec and the model
#: registry it reads (flavors), a module beside it rather than a package of one. A new module
#: goes into a package.
MAX_TOP_LEVEL_MODULES = 9


def test_the_top_level_stays_small() -> None:
    plain = sorted(p.stem for p in (SRC / "scaleladder").glob("*.py") if p.stem != "__init__")
    assert len(plain) <= MAX_TOP_LEVEL_MODULES, f"{len(plain)} plain modules at the top level: {', '.join(plain)}"


def test_the_rule_can_fail() -> None:
    """The walk sees imports inside functions, and the stage table ranks what it should."""
    assert "scaleladder.rung.parallelize" in GRAPH["scaleladder.rung.run"]  # imported inside a function there
    assert stage_of("scaleladder.results.store") < stage_of("scaleladder.rung.run") < stage_of("scaleladder.campaign.supervise")
    assert stage_of("scaleladder.errors") < stage_of("scaleladder.flavors") == stage_of("scaleladder.spec") \
        < stage_of("scaleladder.models.build")


# What a reader can hold. A function may run longer only with the reason in its
# docstring ("Long because ..."); no class may.
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 80, 300


def too_long(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
                found.append(f"{path.name}: class {node.name} is {lines} lines (at most {MAX_CLASS_LINES})")
            elif (not isinstance(node, ast.ClassDef) and lines > MAX_FUNCTION_LINES
                  and "Long because" not in (ast.get_docstring(node) or "")):
                found.append(f"{path.name}: {node.name}() is {lines} lines (at most {MAX_FUNCTION_LINES}, "
                             "or say 'Long because ...' in its docstring)")
    return found


def test_no_function_or_class_a_reader_cannot_hold() -> None:
    roots = [SRC / "scaleladder", SRC.parent / "benchmarks", SRC.parent / "containers"]
    found = [f for root in roots for p in sorted(root.rglob("*.py")) for f in too_long(p)]
    assert not found, "\n".join(found)


def test_the_length_rule_can_fail(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n")
    assert too_long(tmp_path / "long.py") == [f"long.py: f() is {MAX_FUNCTION_LINES + 1} lines (at most 80, "
                                              "or say 'Long because ...' in its docstring)"]
    (tmp_path / "long.py").write_text(f'def f():\n    """Long because one table."""\n{body}\n')
    assert too_long(tmp_path / "long.py") == []
