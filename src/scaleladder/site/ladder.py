"""The ladder, decided once while Snakemake builds the DAG: the config's blocks as run specs.

:func:`expand_ladder` turns the config's blocks into run specs (each block a cross product;
combinations that do not exist are skipped with a note); :func:`is_selected` and
:func:`check_select` are the config's ``select``; :func:`planned_not_to_fit` is the memory
planner's verdict, which routes a rung to the local ``predicted_oom`` rule; the result and
shard paths of each rung; :func:`prepare` does it all once and returns the :class:`Ladder`
the rules read; :func:`final_targets` is what ``rule all`` asks for.

Nothing here uses Snakemake's globals, and nothing names a site (tests/test_profiles.py
checks): every site value comes from the profile's site.yaml.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from scaleladder.figures import registry as figure_registry
from scaleladder.flavors import get_flavor
from scaleladder.site.config import ConfigError, check_data_values, validate_config
from scaleladder.site.settings import Site, SiteConfig
from scaleladder.spec import (
    AnyKnobs,
    Fsdp2Knobs,
    Knobs,
    RunSpec,
    SpecError,
    Strategy,
    canonical_precision,
    default_knobs,
    parse_batch,
    parse_knobs,
    parse_strategy,
)

__all__ = [
    "torch_gpu_count", "resolve_ranks_per_node", "ranks_of", "rank_args", "knobs_for", "expand_ladder",
    "is_selected", "check_select", "data_source", "spec_of_file", "rung_path", "repeats", "rung_data_path",
    "shards_settled", "rung_shards", "rung_inputs", "planned_not_to_fit", "unjudged_note", "result_path", "result_paths",
    "Ladder", "prepare", "wildcard_constraints", "FIGURES", "plan_figures", "final_targets",
    "select_note",
]


def torch_gpu_count() -> int:
    """Every GPU torch sees, of any vendor (ROCm torch answers to torch.cuda)."""
    import torch  # late: only a site with ranks_per_node 'auto' pays for importing torch

    return int(torch.cuda.device_count())


def resolve_ranks_per_node(site: Site, gpu_count: Callable[[], int] = torch_gpu_count) -> int:
    """``site.ranks_per_node``; for 'auto', every visible GPU, else ``site.cpu_ranks`` CPU
    processes (gloo). ``gpu_count`` is asked only for 'auto'."""
    if site.ranks_per_node == "auto":
        return gpu_count() or site.cpu_ranks
    return site.ranks_per_node


def ranks_of(spec: RunSpec, ranks_per_node: int) -> int:
    """A rung's world size. ``single`` is the unwrapped one-process reference: exactly one
    rank, whatever the site."""
    return 1 if spec.strategy.wrapper == "single" else spec.nodes * ranks_per_node


def rank_args(spec: RunSpec, ranks_per_node: int) -> tuple[int, int]:
    """(world, ranks per node) of a rung as the site launches it."""
    world = ranks_of(spec, ranks_per_node)
    return world, min(ranks_per_node, world)


def knobs_for(strategy: Strategy, names: Sequence[str]) -> list[str]:
    """The knobs a block's ``knobs`` list gives ``strategy``: FSDP1's to FSDP1 rungs, FSDP2's
    ``pf<k>`` to FSDP2 rungs. A block that names none of the strategy's generation (and any
    non-FSDP rung) gets its one default: knobs mean nothing across generations, and a
    second name for the same run would be a duplicate result."""
    def mine(knobs: AnyKnobs) -> bool:
        return strategy.is_fsdp1 and isinstance(knobs, Knobs) or strategy.is_fsdp2 and isinstance(knobs, Fsdp2Knobs)

    own = [k for k in names if mine(parse_knobs(k))]
    return own or [str(default_knobs(strategy))]


def expand_ladder(blocks: Sequence[Mapping[str, Any]], ranks_per_node: int) -> tuple[list[RunSpec], list[str]]:
    """All rungs of all blocks, in config order, without duplicates; plus what was skipped.

    Expects validated blocks (defaults filled). A block is a cross product, so some of its
    combinations do not exist: knobs apply per FSDP generation (:func:`knobs_for`; DDP
    collapses onto the one default-knob rung, not a skip), ``single`` runs on one node, a
    hybrid group must divide the world size. Those are skipped with the reason, not errors.
    """
    specs: dict[str, RunSpec] = {}
    skipped: list[str] = []
    for block in blocks:
        for m, s, p, n, b in itertools.product(
            block["models"], block["strategies"], block["precisions"], block["nodes"], block["batches"]
        ):
            strategy = parse_strategy(s)
            for k in knobs_for(strategy, block["knobs"]):
                try:
                    spec = RunSpec(model=m, strategy=strategy, precision=p, knobs=parse_knobs(k), nodes=int(n), batch=parse_batch(b))
                    if strategy.wrapper == "single" and spec.nodes != 1:
                        raise SpecError("strategy 'single' runs in one process on one node")
                    strategy.check_world(ranks_of(spec, ranks_per_node))
                except SpecError as e:
                    skipped.append(f"{m}/{s}/{p}/{k}/n{n}/b{b}: {e}")
                    continue
                specs.setdefault(spec.path, spec)  # first block wins: its place in the order
    return list(specs.values()), skipped


def _as_list(value: Any) -> list[str]:
    """A select value as strings: a list, or one comma-separated string from --config."""
    if isinstance(value, list):
        return [str(x) for x in value]
    return [s.strip() for s in str(value).split(",") if s.strip()]


def _select_fields(spec: RunSpec) -> dict[str, str]:
    """A rung's value of each field ``select`` may name, as a select value reads."""
    return {
        "models": spec.model,
        "strategies": str(spec.strategy),
        "precisions": spec.precision,
        "knobs": str(spec.knobs),
        "nodes": str(spec.nodes),
        "batches": str(spec.batch),
    }


def _select_values(key: str, value: Any) -> list[str]:
    """A select field's values; precisions by their canonical name (``bf16`` is ``bf16-mixed``)."""
    values = _as_list(value)
    if key == "precisions":
        values = [canonical_precision(v) or v for v in values]
    return values


def is_selected(spec: RunSpec, select: Mapping[str, Any]) -> bool:
    """Whether ``spec`` matches every field the config's ``select`` names."""
    fields = _select_fields(spec)
    return all(fields[k] in _select_values(k, v) for k, v in select.items())


def check_select(select: Mapping[str, Any], rungs: Sequence[RunSpec]) -> None:
    """Refuse a ``select`` value that no rung of the ladder has, naming it and the nearest value
    the ladder does have (difflib): ``select={models: [vit-debg]}`` -> 'did you mean vit-debug?'."""
    for key, value in select.items():
        have = sorted({_select_fields(s)[key] for s in rungs})
        for i, v in enumerate(_select_values(key, value)):
            if v not in have:
                near = difflib.get_close_matches(v, have, n=1, cutoff=0.5)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ConfigError(f"scaleladder: config key 'select.{key}[{i}]': {v!r} matches no rung of the ladder{hint} "
                                  f"(the ladder's {key}: {', '.join(have) or 'none'})")


def data_source(cfg: SiteConfig) -> str:
    return cfg.data.source


def spec_of_file(path: str) -> RunSpec:
    """The run spec of a rung's result file (:func:`rung_path`, a repeat's too)."""
    tail = path.split("results/rungs/", 1)[-1].removesuffix(".h5")
    return RunSpec.from_path(re.sub(r"\.r[1-9][0-9]*$", "", tail))


def rung_path(spec: RunSpec, repeat: int = 0) -> str:
    """The rung's result file: its path *is* the run spec. Repeat k ≥ 1 of ``repeats: R``
    is ``<spec>.r<k>.h5`` beside it (results.aggregate reads the suffix), so a ladder
    without repeats keeps the paths it always had."""
    return f"results/rungs/{spec.path}{f'.r{repeat}' if repeat else ''}.h5"


def repeats(cfg: SiteConfig) -> int:
    """How many times each measured rung runs, each in fresh processes (config ``repeats``)."""
    return cfg.repeats


def rung_data_path(spec: RunSpec, source: str) -> str:
    """What the rung's ``--data`` will be: the shard manifest for its image size (one shard
    set per size: the debug flavors train on 32/64 px, the seed flavors on 224 px), or
    'synthetic' (then the rung has no input file)."""
    if source == "synthetic":
        return "synthetic"
    return f"results/shards/{get_flavor(spec.model).image_size}px/manifest.json"


def shards_settled(manifest: str, cfg: SiteConfig) -> bool:
    """Whether the finished shard set at ``manifest`` was written with the config's data settings.

    Then a rerun of its shard job writes the same bytes (sharding is deterministic), so a rung
    must not run again for it: the rung takes the manifest as ``ancient()`` input (common.smk).
    TRAP: a failed shard attempt with other settings leaves its params in Snakemake's metadata,
    so the next run reshards once; without this every finished rung would run again.
    When the settings differ (data changed on purpose) the manifest is a plain input, and the
    rungs run again on the new shards. A missing or unreadable manifest is not settled."""
    try:
        st = os.stat(manifest)
        options = _manifest_options(manifest, st.st_mtime_ns, st.st_size)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    data = cfg.data

    def as_shard_says(value: str | None) -> str | None:  # `scaleladder shard` records str(Path(value))
        return str(Path(value)) if value else None

    want = {"images": as_shard_says(data.images), "captions": as_shard_says(data.captions), "vocab": as_shard_says(data.vocab),
            "wds": list(data.wds or []) or None, "samples": data.samples, "per_shard": data.per_shard, "seed": data.seed}
    return isinstance(options, dict) and all(options.get(k) == v for k, v in want.items())


@functools.lru_cache(maxsize=16)
def _manifest_options(path: str, mtime_ns: int, size: int) -> Any:
    """A manifest's shard options, read once per version of the file (every rung of a size asks).
    TRAP: mtime alone is coarse (a clock tick): two writes within one share it, so size too."""
    with open(path) as f:
        return json.load(f)["scaleladder"]["options"]


def rung_shards(spec: RunSpec, cfg: SiteConfig) -> list[tuple[str, bool]]:
    """The rung rule's input as (path, settled): its shard manifest, or nothing for synthetic data."""
    return [(p, shards_settled(p, cfg)) for p in rung_inputs(spec, data_source(cfg))]


def rung_inputs(spec: RunSpec, source: str) -> list[str]:
    """The rung rule's input: its shard manifest, or nothing for synthetic data."""
    path = rung_data_path(spec, source)
    return [] if path == "synthetic" else [path]


def planned_not_to_fit(spec: RunSpec, cfg: SiteConfig, ranks_per_node: int, unjudged: list[SpecError] | None = None) -> bool:
    """The memory planner's verdict, made while the DAG is built so that a rung that
    cannot fit never costs an allocation. Exactly the call ``scaleladder launch
    --plan-only`` makes when it records the verdict (same spec, world, device, data).
    The planner is analytic and imports no torch, so this runs on a login node.
    False without ``site.plan_device`` or with ``run_predicted_oom``.

    A models-file model (``campaign/plan_trace.traced_model``) is judged by its CACHED trace,
    read with no torch; with none (or one that cannot be made: FSDP1 on several ranks) it is not
    judged: False, and why (``plan_trace.NotTraced`` or ``Untraceable``) is appended to
    ``unjudged`` for :func:`prepare`'s one note. The rung runs; an OOM is its result."""
    device = cfg.site.plan_device
    if not device or cfg.run_predicted_oom:
        return False
    if spec.strategy.compile:
        # A compiled rung's memory is planned as its eager rung's, an upper bound (fusion and the
        # partitioner change what is saved): a compiled rung is never skipped on a bound. It runs; an OOM is its result.
        return False
    world, rpn = rank_args(spec, ranks_per_node)
    data = rung_data_path(spec, data_source(cfg))
    from scaleladder.campaign.plan_trace import NotTraced, Untraceable, traced_model

    if traced_model(get_flavor(spec.model)):
        from scaleladder.campaign.plan_trace import predict as predict_traced

        try:
            return not predict_traced(spec, world, rpn, device, data=data, cached_only=True).prediction.fits
        except (NotTraced, Untraceable) as e:
            if unjudged is not None:
                unjudged.append(e)
            return False
    from scaleladder.planner.memory import predict  # plan.predict itself; plan imports profiles -> ladder

    return not predict(spec, world, rpn, device, data=data).fits


def unjudged_note(unjudged: Sequence[SpecError], cfg: SiteConfig, ranks_per_node: int) -> str:
    """The one note for every rung :func:`planned_not_to_fit` could not judge: how many, that they
    run, and the command that traces them so that the next DAG build judges them."""
    from scaleladder.campaign.plan_trace import NotTraced, untraced_hint

    missing = [e for e in unjudged if isinstance(e, NotTraced)]
    other = [e for e in unjudged if not isinstance(e, NotTraced)]
    text = (f"scaleladder: {len(unjudged)} rung(s) of models-file models were not judged by the planner on "
            f"{cfg.site.plan_device}: they run, and an out-of-memory is their result.")
    if other:
        text += f" {len(other)} of them the fake tensors cannot trace ({str(other[0]).split(': ', 1)[-1]})."
    if missing:
        text += (f" {len(missing)} have no cached trace; trace them and the next DAG build judges them: "
                 + untraced_hint(missing, cfg.site.plan_device, ranks_per_node, cfg.models_file))
    return text


def result_path(spec: RunSpec, predicted_oom: frozenset[str] | set[str]) -> str:
    """Where the ladder takes a rung from: its measurement, or the planner's verdict."""
    if spec.path in predicted_oom:
        return f"results/predicted/{spec.path}.h5"
    return rung_path(spec)


def result_paths(spec: RunSpec, predicted_oom: frozenset[str] | set[str], n_repeats: int = 1) -> list[str]:
    """Every file of a rung: each of its repeats, or the one predicted-oom record (a
    verdict of the planner does not vary from run to run)."""
    if spec.path in predicted_oom:
        return [result_path(spec, predicted_oom)]
    return [rung_path(spec, k) for k in range(n_repeats)]


@dataclass(frozen=True)
class Ladder:
    """Everything the rules need, decided once while Snakemake parses the workflow.

    ``settings`` is the validated config read once into typed fields (site/settings.py), which
    the rules and site/commands.py read (``SETTINGS`` in common.smk); ``config`` is Snakemake's
    own dict, validated and completed in place, kept for the provenance, which records the
    ladder's blocks as the config gives them."""

    config: dict[str, Any]
    settings: SiteConfig
    ranks_per_node: int
    rungs: tuple[RunSpec, ...]  # the whole ladder, in config order
    skipped: tuple[str, ...]  # "model/strategy/.../b<batch>: why" for each combination that does not exist
    selected: tuple[RunSpec, ...]  # the rungs `select` keeps (all of them without one)
    predicted_oom: frozenset[str]  # spec paths the planner routes to the predicted_oom rule
    refused: frozenset[str] = frozenset()  # spec paths predicted past the site's time limit, not run (site/schedule.py)

    @property
    def rung_files(self) -> list[str]:
        """What the aggregate reads: each selected rung's measurements (every repeat) or predicted-oom
        record; every rung without ``select``. So a ``select`` run ends with the ladder, figures and
        report of what it selected, and the next plain run (its input set changed) re-aggregates all.
        A rung refused for the site's time limit has none (site/schedule.py says why, once)."""
        return [f for s in self.selected if s.path not in self.refused
                for f in result_paths(s, self.predicted_oom, repeats(self.settings))]


def prepare(cfg: dict[str, Any], schema: str | Path | Mapping[str, Any], log: TextIO | None = None,
            gpu_count: Callable[[], int] = torch_gpu_count, cli_config: Mapping[str, Any] | None = None) -> Ladder:
    """Validate ``cfg`` (in place), expand its ladder and judge every rung with the planner.

    Notes for the user (skipped combinations, rungs predicted not to fit) go to ``log``
    (stderr by default). Raises :class:`ConfigError` for a bad config, and for a
    ``select`` that matches no rung (after the skip notes, which may say why).
    """
    log = sys.stderr if log is None else log
    validate_config(cfg, schema)
    check_data_values(cfg, cli_config)
    settings = SiteConfig.of(cfg, "")  # once, from the validated and completed config
    rpn = resolve_ranks_per_node(settings.site, gpu_count)
    rungs, skipped = expand_ladder(cfg["ladders"], rpn)
    check_select(cfg.get("select") or {}, rungs)
    selected = [s for s in rungs if is_selected(s, cfg.get("select") or {})]
    if skipped:
        print(f"scaleladder: {len(skipped)} combination(s) of the ladder do not exist and are skipped:", file=log)
        for line in skipped[:20]:
            print(f"  {line}", file=log)
    if not selected:  # each value is some rung's (check_select), but no rung has them all
        given = "; ".join(f"{k}: {', '.join(_select_values(k, v))}" for k, v in cfg["select"].items())
        raise ConfigError(f"scaleladder: config key 'select' matches no rung of the ladder: no rung has all of {given}")
    unjudged: list[SpecError] = []
    predicted = frozenset(s.path for s in rungs if planned_not_to_fit(s, settings, rpn, unjudged))
    if unjudged:
        print(unjudged_note(unjudged, settings, rpn), file=log)
    if predicted:
        print(f"scaleladder: {len(predicted)} rung(s) are predicted not to fit on {settings.site.plan_device} and are "
              "recorded as 'predicted-oom' without running (run them anyway: --config run_predicted_oom=true)", file=log)
    return Ladder(cfg, settings, rpn, tuple(rungs), tuple(skipped), tuple(selected), predicted)


def _alternatives(values: Iterable[object]) -> str:
    return "|".join(re.escape(str(v)) for v in sorted({str(v) for v in values}))


def wildcard_constraints(rungs: Iterable[RunSpec]) -> dict[str, str]:
    """Wildcards may only take values the ladder declares, so a typo in a target path
    cannot match a rule by accident (the rna-seq-star-deseq2 convention). ``batch`` is
    left to the rules: a number for ``rung``, 'max' for ``rung_max``."""
    rungs = list(rungs)
    return {
        "model": _alternatives(s.model for s in rungs),
        "strategy": _alternatives(s.strategy for s in rungs),
        "precision": _alternatives(s.precision for s in rungs),
        "knobs": _alternatives(s.knobs for s in rungs),
        "nodes": r"\d+",
        "px": r"\d+",
        "rep": r"(\.r[1-9][0-9]*)?",  # '' for repeat 0, '.r<k>' for repeat k (rung_path)
    }


FIGURES: list[str] = figure_registry.names("plots")  # the ladder's figures, from the one figure table


def plan_figures(site: Site) -> list[str]:
    """The planner's figures, where the site names a device to plan for: what fits where,
    and its predicted peaks against the measured ones."""
    return figure_registry.names("plan") if site.plan_device else []


def final_targets(ladder: Ladder) -> list[str]:
    """The ladder file, its table (results/rungs.csv), report and figures: of the rungs ``select`` keeps, with one
    (:attr:`Ladder.rung_files`)."""
    figures = FIGURES + plan_figures(ladder.settings.site)
    return (
        ["results/ladder.h5", "results/rungs.csv", "results/report.html"]
        + [f"results/plots/{f}.png" for f in figures]
        + [f"results/plots/{f}.pdf" for f in figures]
        + (["results/mlflow.json"] if ladder.settings.trackers.mlflow_uri else [])
    )


def select_note(ladder: Ladder, profile: str = "profiles/<site>") -> str:
    """What a ``select`` run leaves (onsuccess prints it): the ladder, figures and report of the
    selection, and how to get every rung back."""
    return (f"scaleladder: select kept {len(ladder.selected)} of {len(ladder.rungs)} rungs: results/ladder.h5, "
            "results/plots/ and results/report.html hold those only; a plain `snakemake --profile "
            f"{profile}` puts every rung back (it re-aggregates; no finished rung runs again)")
