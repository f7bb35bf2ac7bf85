"""The validated config, typed: :class:`SiteConfig`, built once when the DAG is built.

:func:`scaleladder.site.ladder.prepare` validates Snakemake's config dict (site/config.py) and
then reads it ONCE into these frozen dataclasses; the rules (``SETTINGS`` in common.smk) and
site/commands.py read their fields instead of string-keying the dict, so a misspelt key is an
AttributeError where the DAG is built, not a KeyError in one rule.

Every field has the schema's default (workflow/schemas/config.schema.yaml), so a partial
mapping (a test's ``{"device": "cuda"}``) reads as the rules would read the whole config.
The dict stays too: the provenance records its blocks as given, and ``converge`` and the
report rules read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

__all__ = ["Site", "Data", "MaxBatch", "SiteConfig"]

T = TypeVar("T")


def _known(cls: type[T], section: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``section`` that ``cls`` has a field for, without None (a field's default then)."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return {k: v for k, v in section.items() if k in names and v is not None}


@dataclass(frozen=True)
class Site:
    """``config["site"]``: everything about one machine (the schema's ``site``)."""

    name: str = ""
    ranks_per_node: int | str = "auto"  # as configured: a count, or 'auto' (ladder.resolve_ranks_per_node)
    cpu_ranks: int = 2
    device: str = "auto"
    max_nodes: int | None = None
    plan_device: str = ""
    image: str = ""
    scaleladder: str = "scaleladder"  # SHELL: the site strings are shell by design (docs/workflow.md)
    launcher: str = ""
    prologue: str = ""
    supervise: str = "launch"
    max_batch_cap: int | None = None
    local_data: bool = False
    supervisor_can_launch: bool = True
    env: tuple[tuple[str, str | int], ...] = ()  # site.env in the site's order, loader/profiling included

    @classmethod
    def of(cls, site: Site | Mapping[str, Any]) -> Site:
        """``site`` itself, or the typed reading of a ``site`` mapping."""
        if isinstance(site, Site):
            return site
        return cls(**(_known(cls, site) | {"env": tuple((site.get("env") or {}).items())}))


@dataclass(frozen=True)
class Data:
    """``config["data"]``: where the shards come from and how many (the schema's ``data``)."""

    source: str = "embedded"
    images: str | None = None  # DATA: shell-quoted wherever it reaches a command (commands.shard_sources)
    captions: str | None = None
    wds: tuple[str, ...] = ()
    vocab: str | None = None
    samples: int = 256
    per_shard: int = 64
    seed: int = 0
    slices: int = 1

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Data:
        return cls(**(_known(cls, data) | {"wds": tuple(data.get("wds") or ())}))


@dataclass(frozen=True)
class MaxBatch:
    """``config["maxbatch"]``: the probe settings given (None: ``scaleladder maxbatch``'s own default)."""

    max_retries: int | None = None
    probe_steps: int | None = None
    probe_warmup: int | None = None


@dataclass(frozen=True)
class SiteConfig:
    """The whole config the rules read, typed (the schema's top level)."""

    site: Site = field(default_factory=Site)
    data: Data = field(default_factory=Data)
    maxbatch: MaxBatch = field(default_factory=MaxBatch)
    steps: int = 0
    warmup: int = 0
    seed: int = 0
    workers: int | str = 0  # a count, or 'auto' (loader.workers; data/cores.py resolves it per rank)
    repeats: int = 1
    run_predicted_oom: bool = False

    @classmethod
    def of(cls, cfg: SiteConfig | Mapping[str, Any]) -> SiteConfig:
        """``cfg`` itself, or the typed reading of a (validated, or partial) config mapping."""
        if isinstance(cfg, SiteConfig):
            return cfg
        scalars = {k: v for k, v in _known(cls, cfg).items() if k not in ("site", "data", "maxbatch")}
        return cls(site=Site.of(cfg.get("site") or {}), data=Data.of(cfg.get("data") or {}),
                   maxbatch=MaxBatch(**_known(MaxBatch, cfg.get("maxbatch") or {})), **scalars)
