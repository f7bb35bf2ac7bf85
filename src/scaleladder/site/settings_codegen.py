"""Writes site/settings.py, the typed config, from the schema: the schema is a setting's one declaration.

``python -m scaleladder.site.settings_codegen`` regenerates src/scaleladder/site/settings.py and
docs/settings.md (every setting, its type, default, ``run`` flag and description) from
workflow/schemas/config.schema.yaml; tests/test_settings.py regenerates both and fails on any
difference, so a schema row, its typed field and its doc cannot drift apart, and adding a
setting is a schema row plus this command, never a second hand-written declaration.

How the schema reads as Python types:

- an object with ``properties``: a frozen dataclass (named by the schema's ``title``, else the key
  in CamelCase), each property a field: required ones without a default first, then the rest with
  the schema's ``default`` (or ``None`` where the schema declares none: "not given");
- ``string``/``integer``/``number``/``boolean``: ``str``/``int``/``float``/``bool``; an ``enum``
  or ``const``: a ``Literal``; ``anyOf``: the union of its forms;
- an array: a tuple of its items' type; an object with only ``additionalProperties``
  (``site.env``): a tuple of ``(key, value)`` pairs in the config's order.

Each class's ``of(mapping, key)`` reads a validated (defaults filled) config section; a key the
schema does not know, or a required key that is missing, is a :class:`ConfigError` naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import yaml

SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"
TARGET = Path(__file__).with_name("settings.py")
DOC = Path(__file__).resolve().parents[3] / "docs" / "settings.md"

#: A node of the JSON schema, as YAML loads it.
Node: TypeAlias = Mapping[str, Any]

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}

_HEADER = '''\
"""The validated config, typed: :class:`SiteConfig`, read once when the DAG is built.

GENERATED from workflow/schemas/config.schema.yaml by ``python -m scaleladder.site.settings_codegen``:
do not edit; change the schema and regenerate (tests/test_settings.py fails when the two differ).

:func:`scaleladder.site.ladder.prepare` validates Snakemake's config dict (site/config.py), filling
the schema's defaults, and reads it ONCE into these frozen dataclasses; the rules (``SETTINGS`` in
common.smk) and site/commands.py read their fields. A field is ``None`` where the schema declares
no default and the config gives none. ``site.env`` and the other free-form mappings are tuples of
``(key, value)`` pairs in the config's order.
"""

# ruff: noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scaleladder.site import settings_read as read
'''


def _camel(key: str) -> str:
    return "".join(part.capitalize() for part in key.replace("-", "_").split("_"))


class _Gen:
    """Walks the schema once, emitting one dataclass per object (dependencies before their users)."""

    def __init__(self, schema: Node) -> None:
        self.root = schema
        self.classes: list[str] = []
        self.done: dict[int, str] = {}  # id(schema node) -> class name: a $ref'd object is one class

    def resolve(self, node: Node) -> Mapping[str, Any]:
        while isinstance(node.get("$ref"), str):
            target: Any = self.root
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    def type_of(self, node: Node, name: str) -> str:
        """The Python annotation of a schema node (classes for objects are emitted as a side effect)."""
        ref_title = None
        if isinstance(node.get("$ref"), str):
            ref_title = _camel(node["$ref"].rsplit("/", 1)[-1])
        node = self.resolve(node)
        if "const" in node:
            return f"Literal[{node['const']!r}]"
        if "enum" in node:
            return f"Literal[{', '.join(repr(v) for v in node['enum'])}]"
        if "anyOf" in node:
            forms: list[str] = []
            for alt in node["anyOf"]:
                t = self.type_of(alt, name)
                if t not in forms:
                    forms.append(t)
            return " | ".join(forms)
        kind = node.get("type")
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array":
            items = node.get("items")
            inner = self.type_of(items, name) if isinstance(items, Mapping) else "str | int"
            return f"tuple[{inner}, ...]"
        if kind == "object":
            if "properties" in node:
                return self.dataclass(node, node.get("title") or ref_title or _camel(name), name)
            extra = node.get("additionalProperties")
            value = self.type_of(extra, name) if isinstance(extra, Mapping) else "Any"
            return f"tuple[tuple[str, {value}], ...]"
        raise ValueError(f"settings_codegen: the schema node of {name!r} has no type this generator knows: {dict(node)}")

    def reader(self, node: Node, expr: str, key: str) -> str:
        """The expression that reads ``expr`` (a config value, already present) as the node's type."""
        node = self.resolve(node)
        kind = node.get("type")
        if kind == "object" and "properties" in node:
            return f"{self.done[id(node)]}.of({expr}, {key})"
        if kind == "object":
            return f"read.pairs({expr})"
        if kind == "array":
            items = node.get("items")
            if isinstance(items, Mapping) and self.resolve(items).get("type") == "object" and "properties" in self.resolve(items):
                cls = self.done[id(self.resolve(items))]
                return f'tuple({cls}.of(x, f"{{{key}}}[{{i}}]") for i, x in enumerate({expr}))'
            return f"tuple({expr})"
        if "anyOf" in node and any(self.resolve(a).get("type") == "array" for a in node["anyOf"]):
            return f"read.as_tuple({expr})"
        return expr

    def default_of(self, node: Node, annotation: str, name: str) -> tuple[str, str, str]:
        """(the field's default, its annotation, and the expression ``of`` takes where the config has no value).

        No schema default: ``None``, and the annotation made Optional."""
        node_r = self.resolve(node)
        if "default" not in node:
            return "None", f"{annotation} | None", "None"
        value = node["default"]
        if node_r.get("type") == "object" and "properties" in node_r:
            cls = self.done[id(node_r)]
            return (f"field(default_factory=lambda: {cls}.of({value!r}, {name!r}))", annotation,
                    f"{cls}.of({value!r}, read.key_of(key, {name!r}))")
        if isinstance(value, dict):
            return "()", annotation, f"read.pairs({value!r})"  # a free-form mapping: its pairs
        if isinstance(value, list):
            return repr(tuple(value)), annotation, repr(tuple(value))
        return repr(value), annotation, repr(value)

    def dataclass(self, node: Node, cls: str, name: str) -> str:
        if id(node) in self.done:
            return self.done[id(node)]
        props: Node = node["properties"]
        required = [k for k in node.get("required", []) if "default" not in props[k]]
        fields_req: list[str] = []
        fields_opt: list[str] = []
        readers: list[str] = []
        annotations = {k: self.type_of(v, k) for k, v in props.items()}  # nested classes first
        self.done[id(node)] = cls
        for k, sub in props.items():
            doc = " ".join(str(sub.get("description", "")).split())
            comment = f"  #: {doc}" if doc else ""
            if k in required:
                fields_req.append(f"    {k}: {annotations[k]}{comment}")
                readers.append(f"            {k}={self.reader(sub, f'read.required(m, {k!r}, key)', f'read.key_of(key, {k!r})')},")
            else:
                default, annotation, fallback = self.default_of(sub, annotations[k], k)
                fields_opt.append(f"    {k}: {annotation} = {default}{comment}")
                reading = self.reader(sub, f"m[{k!r}]", f"read.key_of(key, {k!r})")
                present = f"{k!r} in m" if reading == f"m[{k!r}]" else f"m.get({k!r}) is not None"
                readers.append(f"            {k}={reading} if {present} else {fallback},")
        if cls == "SiteConfig":
            doc = "The whole config, typed: the schema's top level."
        else:
            doc = " ".join(str(node.get("description", "")).split()) or f"The config's ``{name}``."
        lines = ["", "", "", "@dataclass(frozen=True)", f"class {cls}:", f'    """{doc}"""', ""]
        lines += fields_req + fields_opt
        known = ", ".join(repr(k) for k in props) + ("," if len(props) == 1 else "")
        lines += ["", "    @classmethod", f"    def of(cls, section: object, key: str) -> {cls}:",
                  '        """The validated section at config key ``key``, typed (an unknown key, a missing required one: :class:`ConfigError`)."""',
                  f"        m = read.section(section, key, ({known}))", "        return cls(", *readers, "        )"]
        self.classes.append("\n".join(lines))
        return cls


def generate(schema: Node) -> str:
    """settings.py's text for ``schema``."""
    gen = _Gen(schema)
    top = dict(schema)
    top.setdefault("title", "SiteConfig")
    gen.type_of(top, "SiteConfig")
    names = sorted(gen.done.values())
    body = _HEADER + "".join(gen.classes) + "\n"
    imports = "from scaleladder.site import settings_read as read\n"
    body = body.replace(imports, imports + "\n__all__ = [" + ", ".join(repr(n) for n in names) + "]\n", 1)
    return body


def _doc_type(gen: _Gen, node: Node) -> str:
    """A schema node's type in words: ``integer >= 1``, ``auto``, ``list of string``, ``mapping``."""
    node = gen.resolve(node)
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return " or ".join(f"`{v}`" for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(_doc_type(gen, alt) for alt in node["anyOf"])
    kind = str(node.get("type", "any"))
    if kind == "array":
        items = node.get("items")
        return f"list of {_doc_type(gen, items)}" if isinstance(items, Mapping) else "list"
    if kind == "object":
        extra = node.get("additionalProperties")
        return f"mapping to {_doc_type(gen, extra)}" if isinstance(extra, Mapping) else "mapping"
    for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<=")):
        if key in node:
            kind += f" {op} {node[key]}"
    return kind


def generate_doc(schema: Node) -> str:
    """docs/settings.md for ``schema``: one row per setting, nested keys dotted."""
    gen = _Gen(schema)
    gen.type_of({**schema, "title": "SiteConfig"}, "SiteConfig")
    lines = ["# Settings", "", "<!-- GENERATED from workflow/schemas/config.schema.yaml by "
             "`python -m scaleladder.site.settings_codegen`: edit the schema, then regenerate. -->", "",
             "Every key of the workflow's config (config/config.yaml, then a profile's site.yaml, then "
             "`--config`), as the schema declares it. A key with a **run flag** is a setting of every "
             "rung: its value reaches `scaleladder run` (and launch, finalize, maxbatch, converge) as "
             "that argument, and only where it differs from the default, so a profile at its defaults "
             "runs the commands it always ran. `required` keys have no default.", "",
             "| key | type | default | run flag | what it is |", "|---|---|---|---|---|"]

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    def walk(node: Node, path: str, required: bool) -> None:
        node_r = gen.resolve(node)
        if path:
            default = ("required" if required else "-") if "default" not in node else f"`{json.dumps(node['default'])}`"
            flag = f"`{node['run_arg']}`" if isinstance(node.get("run_arg"), str) else ""
            desc = node.get("description") or node_r.get("description") or ""
            lines.append(f"| `{path}` | {cell(_doc_type(gen, node))} | {cell(default)} | {flag} | {cell(str(desc))} |")
        items = node_r.get("items")
        if node_r.get("type") == "array" and isinstance(items, Mapping) and "properties" in gen.resolve(items):
            walk({k: v for k, v in gen.resolve(items).items() if k != "description"}, f"{path}[]", False)
            return
        for key, sub in (node_r.get("properties") or {}).items():
            walk(sub, f"{path}.{key}" if path else key, key in node_r.get("required", []))

    walk(schema, "", False)
    return "\n".join(lines) + "\n"


def load(path: Path = SCHEMA) -> dict[str, Any]:
    with open(path) as f:
        schema: dict[str, Any] = yaml.safe_load(f)
    return schema


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scaleladder.site.settings_codegen", description=__doc__.splitlines()[0])
    p.add_argument("--schema", default=str(SCHEMA))
    p.add_argument("--out", default=str(TARGET))
    p.add_argument("--doc", default=str(DOC))
    p.add_argument("--check", action="store_true", help="exit 1 if a file differs from what the schema gives")
    a = p.parse_args(argv)
    schema = load(Path(a.schema))
    stale = 0
    for out, text in ((Path(a.out), generate(schema)), (Path(a.doc), generate_doc(schema))):
        if a.check:
            same = out.is_file() and out.read_text() == text
            stale += not same
            print(f"{out}: {'up to date' if same else 'differs from the schema: regenerate it'}", file=sys.stderr)
        else:
            out.write_text(text)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
