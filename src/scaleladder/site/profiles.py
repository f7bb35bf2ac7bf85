"""A site's profile folder (``profiles/<site>/``) read as Snakemake and the job's shell will read it:
the merged config and its ladder (:func:`load_profile`), the rules' resources, and what a site
string becomes in the job's bash (:func:`expand`) and in apptainer's ``--bind`` (:func:`bind_entries`).
`scaleladder doctor`, `scaleladder budget` and the workflow's `site_check` share it."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import yaml

from scaleladder.errors import SpecError
from scaleladder.site import commands as swf
from scaleladder.site import config as site_config
from scaleladder.site import ladder as site_ladder
from scaleladder.site.settings import Site, SiteConfig


@dataclass
class SiteProfile:
    """A profile as Snakemake will run it: its folder, the merged config, its ladder and the
    Snakemake options of config.v8+.yaml."""

    name: str
    folder: Path
    repo: Path
    smk: dict[str, Any]
    ladder: site_ladder.Ladder | None
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
        value = eval(value[1:], names)
        if not isinstance(value, str):
            return value
    try:  # then Snakemake's: a resource string is a Python expression ("'srun'", "int(wildcards.nodes)")
        return eval(value, names, {"wildcards": argparse.Namespace(nodes=str(nodes))})
    except Exception:
        return value


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Snakemake's configfile merge: nested dicts updated key by key, anything else replaced."""
    for k, v in top.items():
        base[k] = _merge(dict(base[k]), v) if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
    return base


def parse_config(entries: Sequence[str]) -> dict[str, Any]:
    """``--config KEY=VALUE ...`` as Snakemake parses it (snakemake.cli.parse_config): each value
    an int, a float, a bool, YAML read with the BaseLoader (every scalar a string), or the string;
    the workflow's own check then makes numbers of the keys that want them."""
    out: dict[str, Any] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        if not sep or not re.fullmatch(r"[a-zA-Z_][\w-]*\w", key.strip()):
            raise SpecError(f"--config {entry!r}: expected KEY=VALUE, KEY a name (e.g. 'select={{models: [vit-base]}}')")
        value: Any = None
        if text:
            for parse in (int, float, _bool, lambda t: yaml.load(t, Loader=yaml.BaseLoader), str):
                try:
                    value = parse(text)
                    break
                except (ValueError, yaml.YAMLError):
                    continue
        out = _merge(out, {key.strip(): value})
    return out


def _bool(text: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ValueError(text)


def profile_names(profiles: Path) -> list[str]:
    """The profiles a ``profiles/`` folder holds: its subfolders with a site.yaml."""
    return sorted(p.name for p in profiles.iterdir() if (p / "site.yaml").is_file()) if profiles.is_dir() else []


def find_profile(name: str, repo: Path) -> Path:
    """The folder of profile ``name`` under ``repo/profiles``; ``profiles/NAME`` (as snakemake's
    ``--profile`` takes it) is read as NAME. SpecError in one line naming the folder looked in,
    the profiles there and the nearest name; or, where there is no ``profiles/`` (a subfolder of
    the checkout), the checkout above."""
    profiles = repo / "profiles"
    short = Path(name).name if Path(name).parent.name == "profiles" and len(Path(name).parts) == 2 else name
    folder = profiles / short
    if (folder / "site.yaml").is_file():
        return folder
    if not profiles.is_dir():
        up = next((d for d in repo.parents if (d / "profiles").is_dir() and (d / "Snakefile").is_file()), None)
        where = f"; the checkout is {up}: run from there, or pass --repo {up}" if up else \
            " (run from the checkout's root, where the Snakefile is, or pass --repo)"
        raise SpecError(f"no profile {name!r}: {repo} has no profiles/ folder{where}")
    have = profile_names(profiles)
    near = difflib.get_close_matches(short, have, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise SpecError(f"no profile {name!r} in {profiles} (a folder with site.yaml); the profiles there: "
                    f"{', '.join(have) or 'none'}{hint}")


def profile_config(repo: Path, folder: Path, configfiles: Sequence[str | Path] | None = None,
                   overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The config as Snakemake merges it: config/config.yaml (the Snakefile's), then the profile's
    site.yaml, or instead the ``configfiles`` given (snakemake's ``--configfile`` replaces the
    profile's ``configfile``), then the ``--config`` ``overrides``. SpecError for a file that cannot
    be read, and for ``configfiles`` that hold no ``site`` (the Snakefile would then fall back
    to the workstation's site: the wrong site's prices)."""
    cfg = yaml.safe_load((repo / "config" / "config.yaml").read_text()) or {}
    files = [folder / "site.yaml"] if configfiles is None else [Path(f) for f in configfiles]
    for f in files:
        try:
            cfg = _merge(cfg, yaml.safe_load(Path(f).read_text()) or {})
        except (OSError, yaml.YAMLError) as e:
            raise SpecError(f"--configfile {f}: cannot read it: {str(e).splitlines()[0]}") from None
    if configfiles is not None and "site" not in cfg:
        raise SpecError(f"--configfile {' '.join(map(str, configfiles))}: no 'site' in them; as in snakemake, --configfile "
                        f"replaces the profile's own site.yaml: give it first (--configfile {folder / 'site.yaml'} ...)")
    return _merge(cfg, overrides or {})


def load_profile(name: str, repo: Path, plan: bool = False, configfiles: Sequence[str | Path] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> SiteProfile:
    """The profile's merged config (:func:`profile_config`), validated by the workflow's own code;
    with ``plan`` also the planner's verdict on every rung (a second or more on a big ladder: the
    doctor does not need it)."""
    folder = find_profile(name, repo)
    name = folder.name
    smk = yaml.safe_load((folder / "config.v8+.yaml").read_text()) or {}
    cfg = profile_config(repo, folder, configfiles, overrides)
    schema = repo / "workflow" / "schemas" / "config.schema.yaml"
    try:
        if plan:
            ladder = site_ladder.prepare(cfg, schema, log=StringIO(), gpu_count=lambda: 0, cli_config=overrides)
        else:
            site_config.validate_config(cfg, schema)
            settings = SiteConfig.of(cfg, "")
            rpn = site_ladder.resolve_ranks_per_node(settings.site, lambda: 0)
            rungs, skipped = site_ladder.expand_ladder(cfg["ladders"], rpn)
            ladder = site_ladder.Ladder(cfg, settings, rpn, tuple(rungs), tuple(skipped), tuple(rungs), frozenset())
        return SiteProfile(name, folder, repo, smk, ladder, cfg)
    except site_config.ConfigError as e:
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


def fill_site(template: str, site: Site, rpn: int, nodes: int, ranks: int) -> str:
    """A site's command template (launcher, scaleladder, prologue) filled for ``nodes`` nodes and ``ranks`` ranks."""
    out = swf.fill(template, site, rpn)
    return out.replace("{nodes}", str(nodes)).replace("{ranks}", str(ranks))
