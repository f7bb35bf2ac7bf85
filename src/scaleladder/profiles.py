"""A site's profile folder (``profiles/<site>/``) read as Snakemake and the job's shell will read it:
the merged config and its ladder (:func:`load_profile`), the rules' resources, and what a site
string becomes in the job's bash (:func:`expand`) and in apptainer's ``--bind`` (:func:`bind_entries`).
`scaleladder doctor`, `scaleladder budget` and the workflow's `site_check` share it."""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from scaleladder import workflow as swf
from scaleladder.errors import SpecError


@dataclass
class SiteProfile:
    """A profile as Snakemake will run it: its folder, the merged config, its ladder and the
    Snakemake options of config.v8+.yaml."""

    name: str
    folder: Path
    repo: Path
    smk: dict[str, Any]
    ladder: swf.Ladder | None
    config: dict[str, Any]
    config_error: str | None = None

    @property
    def site(self) -> dict[str, Any]:
        site: dict[str, Any] = self.config.get("site", {})
        return site

    @property
    def executor(self) -> str:
        return str(self.smk.get("executor", "local"))

    def resources(self, rule: str, nodes: int = 1) -> dict[str, Any]:
        """The rule's resources: default-resources overlaid by set-resources, each evaluated as
        Snakemake does (a Python expression; a YTE ``?expr`` in the profile's own pass)."""
        merged = dict(self.smk.get("default-resources") or {}) | dict((self.smk.get("set-resources") or {}).get(rule) or {})
        return {k: _evaluate(v, nodes) for k, v in merged.items()}


def _evaluate(value: Any, nodes: int) -> Any:
    if not isinstance(value, str):
        return value
    names = {"os": os, "int": int, "repr": repr}
    if value.startswith("?"):  # YTE's pass first: `?repr(os.environ.get(...))` -> "'abc123'"
        value = eval(value[1:], names)  # noqa: S307 - the profile's own expressions
        if not isinstance(value, str):
            return value
    try:  # then Snakemake's: a resource string is a Python expression ("'srun'", "int(wildcards.nodes)")
        return eval(value, names, {"wildcards": argparse.Namespace(nodes=str(nodes))})  # noqa: S307
    except Exception:  # noqa: BLE001 - a bare word is a string resource
        return value


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Snakemake's configfile merge: nested dicts updated key by key, anything else replaced."""
    for k, v in top.items():
        base[k] = _merge(dict(base[k]), v) if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
    return base


def load_profile(name: str, repo: Path, plan: bool = False) -> SiteProfile:
    """The profile's merged config, validated by the workflow's own code; with ``plan`` also the
    planner's verdict on every rung (a second or more on a big ladder: the doctor does not need it)."""
    folder = repo / "profiles" / name
    if not (folder / "site.yaml").is_file():
        have = ", ".join(sorted(p.name for p in (repo / "profiles").iterdir() if p.is_dir())) if (repo / "profiles").is_dir() else "none"
        raise SpecError(f"no profile {name!r} in {repo / 'profiles'} (have: {have})")
    smk = yaml.safe_load((folder / "config.v8+.yaml").read_text()) or {}
    cfg = yaml.safe_load((repo / "config" / "config.yaml").read_text()) or {}
    cfg = _merge(cfg, yaml.safe_load((folder / "site.yaml").read_text()) or {})
    schema = repo / "workflow" / "schemas" / "config.schema.yaml"
    try:
        if plan:
            ladder = swf.prepare(cfg, schema, log=StringIO(), gpu_count=lambda: 0)
        else:
            swf.validate_config(cfg, schema)
            rpn = swf.resolve_ranks_per_node(cfg["site"], lambda: 0)
            rungs, skipped = swf.expand_ladder(cfg["ladders"], rpn)
            ladder = swf.Ladder(cfg, rpn, tuple(rungs), tuple(skipped), tuple(rungs), frozenset())
        return SiteProfile(name, folder, repo, smk, ladder, cfg)
    except swf.ConfigError as e:
        return SiteProfile(name, folder, repo, smk, None, cfg, " ".join(str(e).split()))


# -- shell: what the job's bash makes of a site string --------------------------------------


def expand(value: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """``value`` as the job's ``export K="value"`` expands it, under ``set -euo pipefail``
    (Snakemake's shell prefix): (text, '') or (None, bash's complaint)."""
    script = f'set -euo pipefail\nprintf "%s" "{value}"\n'
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=dict(env), timeout=30)
    if run.returncode != 0:
        return None, (run.stderr.strip().splitlines() or ["bash failed"])[-1].replace("bash: line 2: ", "")
    return run.stdout, ""


def split_outside(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep``, except inside ``${...}``/``$(...)`` (``${VAR:-/a,b}`` stays whole)."""
    parts, depth, cur = [], 0, ""
    for i, ch in enumerate(text):
        if ch in "{(" and i and text[i - 1] == "$":
            depth += 1
        elif ch in "})" and depth:
            depth -= 1
        if ch == sep and not depth:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def bind_specs(command: str) -> list[str]:
    """The ``--bind``/``-B`` values of a command line, without the double quotes a profile puts
    around one so that an expanded path with a space stays one word (docs/workflow.md,
    "Shell keys and data keys")."""
    words = command.split()
    specs = [words[i + 1] for i, w in enumerate(words) if w in ("--bind", "-B") and i + 1 < len(words)] + \
        [w.split("=", 1)[1] for w in words if w.startswith("--bind=")]
    return [w[1:-1] if len(w) > 1 and w[0] == w[-1] == '"' else w for w in specs]


def bind_entries(command: str) -> list[tuple[str, str]]:
    """(source, destination) of each ``--bind``/``-B`` entry ``src[:dst[:opts]]`` of an
    apptainer command line, unexpanded; the destination is the source where none is given."""
    out: list[tuple[str, str]] = []
    for spec in bind_specs(command):
        for entry in filter(None, split_outside(spec, ",")):
            fields = split_outside(entry, ":")
            out.append((fields[0], fields[1] if len(fields) > 1 else fields[0]))
    return out


def bind_sources(command: str) -> list[str]:
    return [src for src, _ in bind_entries(command)]


def fill_site(template: str, site: Mapping[str, Any], rpn: int, nodes: int, ranks: int) -> str:
    """A site's command template (launcher, scaleladder, prologue) filled for ``nodes`` nodes and ``ranks`` ranks."""
    out = swf.fill(template, site, rpn)
    return out.replace("{nodes}", str(nodes)).replace("{ranks}", str(ranks))
