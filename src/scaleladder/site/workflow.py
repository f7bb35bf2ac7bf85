"""The workflow's logic, out of the Snakefile: what `workflow/rules/*.smk` call.

Snakemake needs input and params functions, wildcard constraints and a target list; the
decisions behind them live here as plain functions, so that they are unit-tested
(tests/test_workflow_logic.py) without a Snakemake run:

1. **Config.** :func:`validate_config` checks the merged config ONCE against
   workflow/schemas/config.schema.yaml, filling the schema's ``default``s as it goes,
   then checks the names in the ladder with the run-spec grammar itself. A bad config
   raises :class:`ConfigError` naming the key (``config key 'ladders[0].models[0]': ...``);
   common.smk turns it into Snakemake's WorkflowError, so it fails before any job.
2. **The ladder.** :func:`expand_ladder` turns the config's blocks into run specs
   (each block a cross product; combinations that do not exist are skipped with a note);
   :func:`planned_not_to_fit` is the memory planner's verdict, made while the DAG is
   built, which routes a rung to the local ``predicted_oom`` rule.
3. **Site strings.** What a rule's shell command needs from ``config["site"]``: the
   launcher and prologue with their placeholders filled, the ``export`` line, the
   ``--ranks-per-node``, ``--device``, planner and max-batch arguments, and the
   provenance the aggregate records.

Nothing here uses Snakemake's globals (``workflow``, ``config``, ``rules``): they come in
as arguments. Nothing here names a site either (tests/test_profiles.py checks): every
site value comes from the profile's site.yaml.
"""

from __future__ import annotations

import copy
import difflib
import functools
import itertools
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import jsonschema  # type: ignore[import-untyped]
import yaml  # type: ignore[import-untyped]

from scaleladder.models.flavors import get_flavor
from scaleladder.spec import (
    AnyKnobs,
    Fsdp2Knobs,
    Knobs,
    RunSpec,
    SpecError,
    Strategy,
    default_knobs,
    parse_batch,
    parse_knobs,
    canonical_precision,
    parse_precision,
    parse_steps_warmup,
    parse_strategy,
)

__all__ = [
    "ConfigError", "Ladder", "prepare", "validate_config", "check_data_values", "DATA_KEYS", "coerce_config_strings", "expand_ladder", "knobs_for",
    "resolve_ranks_per_node", "ranks_of", "rank_args", "is_selected", "planned_not_to_fit", "rung_path",
    "result_path", "result_paths", "repeats", "rung_data_path", "rung_inputs", "rung_shards", "shards_settled", "data_source", "spec_of", "fill", "env_exports", "launcher", "prologue", "ranks_arg",
    "device_arg", "plan_args", "maxbatch_args", "shard_sources", "shard_slices", "shard_slice_records", "provenance_json", "wildcard_constraints",
    "final_targets", "select_note", "check_select", "plan_figures", "plan_chart_args", "FIGURES",
]

#: The header every config error starts with; tests and users grep for the key after it.
INVALID = "invalid scaleladder config:\n"


class ConfigError(ValueError):
    """A config the workflow cannot run, with the key that is wrong in the message.

    Not Snakemake's WorkflowError: Snakemake is the optional ``[workflow]`` extra (the GPU
    images install it; a bare ``pip install scaleladder`` has none), and this module stays
    importable without it. common.smk re-raises it as a WorkflowError, which Snakemake
    prints without a traceback and exits 1 on, before any job."""


# -- 1. config --------------------------------------------------------------------------------


def config_key(path: Iterable[str | int]) -> str:
    """jsonschema's error path as the dotted key a user would type: ``ladders[0].models``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def as_int(value: Any) -> Any:
    """'8' -> 8; anything else unchanged. TRAP: only digits: '-1' stays a string, so the
    schema names it ("'-1' is not of type 'integer'") instead of a later minimum check."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


def as_bool(value: Any) -> Any:
    """'true'/'false' in any case -> True/False; anything else unchanged (the schema refuses it)."""
    return {"true": True, "false": False}.get(value.lower(), value) if isinstance(value, str) else value


def coerce_config_strings(cfg: dict[str, Any]) -> None:
    """Make numbers and booleans of the strings ``--config`` gives, in place.

    TRAP: Snakemake parses ``--config`` values with YAML's BaseLoader, so ``batches: [8]``
    arrives as ``['8']`` and ``run_predicted_oom=true`` as ``'true'``. Only the keys the
    schema wants as numbers or booleans are touched: a model name made of digits stays a
    string, and ``ranks_per_node: auto`` stays 'auto'.
    """
    if "run_predicted_oom" in cfg:
        cfg["run_predicted_oom"] = as_bool(cfg["run_predicted_oom"])
    if "repeats" in cfg:
        cfg["repeats"] = as_int(cfg["repeats"])
    if isinstance(cfg.get("site"), dict) and "supervisor_can_launch" in cfg["site"]:
        cfg["site"]["supervisor_can_launch"] = as_bool(cfg["site"]["supervisor_can_launch"])
    if isinstance(cfg.get("maxbatch"), dict):
        cfg["maxbatch"] = {k: as_int(v) for k, v in cfg["maxbatch"].items()}
    if isinstance(cfg.get("converge"), dict):  # the convergence rungs (workflow/rules/converge.smk)
        cv = cfg["converge"]
        for key in ("global_batch", "steps", "eval_every"):
            if key in cv:
                cv[key] = as_int(cv[key])
        if "enabled" in cv:
            cv["enabled"] = as_bool(cv["enabled"])
        if isinstance(cv.get("seeds"), list):
            cv["seeds"] = [as_int(v) for v in cv["seeds"]]
        for key in ("lr", "target"):
            if isinstance(cv.get(key), str):
                try:
                    cv[key] = float(cv[key])
                except ValueError:
                    pass  # the schema names it
    for block in cfg.get("ladders") or []:
        if isinstance(block, dict):
            for key in ("batches", "nodes"):
                if isinstance(block.get(key), list):
                    block[key] = [as_int(v) for v in block[key]]
    for section, keys in (("site", ("ranks_per_node", "cpu_ranks", "max_nodes")), ("data", ("samples", "per_shard", "seed", "slices"))):
        for key in keys:
            if isinstance(cfg.get(section), dict) and key in cfg[section]:
                cfg[section][key] = as_int(cfg[section][key])


def load_schema(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        schema: dict[str, Any] = yaml.safe_load(f)
    return schema


def _filling_defaults(cls: type[jsonschema.protocols.Validator]) -> type[jsonschema.protocols.Validator]:
    """``cls`` that also sets each absent property to its schema ``default`` (the
    jsonschema FAQ's recipe, the one Snakemake's ``validate(set_default=True)`` uses).

    It runs wherever "properties" is checked, so nested objects (``site``, ``data``, each
    ladder block) get theirs too, and a default object such as ``data: {}`` is then
    filled in turn. TRAP: the recipe puts the schema's own default object into the
    config, so two blocks would share one ``precisions`` list and the schema would change
    under later validations; a deep copy gives each its own.
    """
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
        if isinstance(instance, dict):  # "properties" ignores a non-object, and so must this
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    extended: type[jsonschema.protocols.Validator] = jsonschema.validators.extend(cls, {"properties": set_defaults})
    return extended


def _form(sub: Mapping[str, Any]) -> str:
    """One alternative of an anyOf/oneOf, in words: ``{type: integer, minimum: 1}`` -> 'an integer >= 1'."""
    if "const" in sub:
        return repr(sub["const"])
    if "enum" in sub:
        return " or ".join(map(repr, sub["enum"]))
    kind = {"integer": "an integer", "number": "a number", "string": "a string", "array": "a list",
            "object": "a mapping", "boolean": "true or false"}.get(str(sub.get("type")), json.dumps(dict(sub)))
    for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in sub:
            kind += f" {op} {sub[key]}"
    return kind


def _message(e: jsonschema.ValidationError) -> str:
    """jsonschema's message, with the allowed forms named where it says only 'is not valid under
    any of the given schemas' (``batches: [four]``: an integer >= 1, or 'max')."""
    if e.validator == "additionalProperties" and isinstance(e.instance, Mapping) and isinstance(e.schema.get("properties"), Mapping):
        known = sorted(e.schema["properties"])
        extra = [k for k in e.instance if k not in known]
        if extra:  # name the nearest key a typo meant: select={model: ...} -> 'models'
            near = difflib.get_close_matches(str(extra[0]), known, n=1, cutoff=0.5)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            return f"unknown key {extra[0]!r}{hint} (the keys here: {', '.join(known)})"
    if e.validator in ("anyOf", "oneOf") and isinstance(e.validator_value, list):
        forms = [_form(sub) for sub in e.validator_value if isinstance(sub, Mapping)]
        if forms:
            return f"{e.instance!r} is none of the allowed forms: {', or '.join(forms)}"
    return str(e.message)


def schema_errors(cfg: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Every schema violation as ``config key 'K': message``, sorted by key; fills the
    schema's defaults into ``cfg`` in the same pass."""
    validator = _filling_defaults(jsonschema.Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(e.absolute_path))
    lines = [f"  config key '{config_key(e.absolute_path)}': {_message(e)}" for e in errors]
    if any(not e.absolute_path and "'site'" in e.message for e in errors):
        lines.append("  (the site and its ladder come from a profile: snakemake --profile profiles/<site>)")
    return lines


def validate_config(cfg: dict[str, Any], schema: str | Path | Mapping[str, Any]) -> None:
    """Check the merged config once, before any job, and complete it in place.

    In order: --config strings made numbers (:func:`coerce_config_strings`); the schema,
    which also fills every ``default`` it declares (a block's ``precisions``, ``knobs``
    and ``nodes``, ``site.device``, ``data.source``, ...); then what the schema cannot
    know: the planner device, warm-up < steps, every ladder name parsed with the run-spec
    grammar (so a typo fails here, not as a job that cannot parse its own spec), 'max'
    only where the site's supervisor can launch, and no more nodes than the site has.
    Raises :class:`ConfigError` naming the first wrong key (all of them for the schema).
    """
    coerce_config_strings(cfg)
    lines = schema_errors(cfg, schema if isinstance(schema, Mapping) else load_schema(schema))
    if lines:
        # the hint (last line, if any) follows the keys without its own "config key"
        raise ConfigError(INVALID + "\n".join(lines))
    site = cfg["site"]
    device = site.get("plan_device")
    if device:
        from scaleladder.planner.memory import DEVICES  # torch-free, like everything the DAG build imports

        if device not in DEVICES:
            raise ConfigError(f"{INVALID}  config key 'site.plan_device': unknown device {device!r}; "
                              f"expected one of {', '.join(DEVICES)} (or '' for no planner)")
    try:  # the runner's own check, so that no job fails on it later
        parse_steps_warmup(cfg["steps"], cfg["warmup"])
    except SpecError as e:
        raise ConfigError(f"{INVALID}  config key 'warmup': {e}") from None
    checks: list[tuple[str, Callable[[Any], object]]] = [
        ("models", get_flavor),
        ("strategies", parse_strategy),
        ("precisions", parse_precision),
        ("knobs", parse_knobs),
        ("batches", parse_batch),
    ]
    for i, block in enumerate(cfg["ladders"]):
        for key, parse in checks:
            for j, value in enumerate(block.get(key, [])):
                try:
                    parse(value)
                except SpecError as e:
                    raise ConfigError(f"{INVALID}  config key 'ladders[{i}].{key}[{j}]': {e}") from None
        if "max" in block["batches"] and not site.get("supervisor_can_launch", True):
            raise ConfigError(
                f"{INVALID}  config key 'ladders[{i}].batches': 'max' needs a max-batch search, which "
                f"starts the launcher itself, but site '{site['name']}' has supervisor_can_launch: false"
            )
        if site.get("max_nodes") and max(block.get("nodes", [1])) > site["max_nodes"]:
            raise ConfigError(
                f"{INVALID}  config key 'ladders[{i}].nodes': {max(block['nodes'])} nodes, but "
                f"site '{site['name']}' launches on at most {site['max_nodes']} (site.max_nodes)"
            )


#: The config keys whose values are DATA (paths, URLs): they reach the jobs' shell lines
#: only shell-quoted (:func:`shard_sources`, ``:q`` in the rules). Every ``site`` key that
#: builds a command (``scaleladder``, ``launcher``, ``prologue``, ``env``, ``image``) is SHELL
#: by design instead (docs/workflow.md, "Shell keys and data keys").
DATA_KEYS: tuple[str, ...] = ("data.images", "data.captions", "data.vocab", "data.wds", "converge.train", "converge.test")

# Characters a --config value cannot carry into a cluster job (see check_data_values).
_CLI_UNSAFE = re.compile(r"[$`\\'\"]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def data_values(cfg: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(key as the user types it, section, value) for every data key the config sets."""
    for key in DATA_KEYS:
        section, name = key.split(".")
        value = (cfg.get(section) or {}).get(name)
        if isinstance(value, list):
            for i, v in enumerate(value):
                yield f"{key}[{i}]", section, v
        elif value is not None:
            yield key, section, value


def check_data_values(cfg: Mapping[str, Any], cli_config: Mapping[str, Any] | None = None) -> None:
    """Refuse, naming the key, a data value that the pipeline cannot carry intact.

    * A control character (a newline, a tab, ...): a path must print on one line in the
      one-line errors, the logs and the report, and Snakemake re-quotes ``--config`` values
      for cluster jobs with Python's ``repr``, which turns a newline into the two characters
      ``\\n``: another path on the compute node than on the login node.
    * Given with ``--config`` (``cli_config``, Snakemake's parsed ``--config``): ``$``, a
      backtick, a quote or a backslash. TRAP: Snakemake passes ``--config`` on to every
      cluster job as ``repr(value)`` (snakemake_interface_executor_plugins.utils.format_cli_value),
      and the SLURM plugin wraps the job in ``--wrap="..."``: the submitting shell expands
      ``$(...)`` there, before any of our quoting. The same value in a ``--configfile``
      travels as a file name and is safe.
    * ``data.images``, ``data.captions`` and ``data.vocab`` must exist (a missing folder
      would otherwise pass the dry run and fail only in the shard job).
    """
    cli = cli_config or {}
    for key, section, value in data_values(cfg):
        text = str(value)
        if _CONTROL.search(text):
            raise ConfigError(f"{INVALID}  config key '{key}': {text!r} holds a control character (a newline?), "
                              "which a path cannot carry through the jobs' command lines and one-line logs; rename it")
        given = (cli.get(section) or {}) if isinstance(cli.get(section), Mapping) else {}
        if _CLI_UNSAFE.search(text) and text in (str(v) for v in _flat(given.values())):
            raise ConfigError(f"{INVALID}  config key '{key}': {text!r} holds $, `, a quote or a backslash, which "
                              "Snakemake passes on to cluster jobs unquoted when given with --config; "
                              "put it in a file instead (--configfile FILE)")
    data = cfg.get("data") or {}
    for name, want_dir in (("images", True), ("captions", False), ("vocab", False)):
        path = data.get(name)
        if path and not (os.path.isdir(path) if want_dir else os.path.isfile(path)):
            what = "folder" if want_dir else "file"
            raise ConfigError(f"{INVALID}  config key 'data.{name}': no such {what} {str(path)!r}")


def _flat(values: Iterable[Any]) -> Iterator[Any]:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from v
        else:
            yield v


# -- 2. the ladder ----------------------------------------------------------------------------


def torch_gpu_count() -> int:
    """Every GPU torch sees, of any vendor (ROCm torch answers to torch.cuda)."""
    import torch  # late: only a site with ranks_per_node 'auto' pays for importing torch

    return int(torch.cuda.device_count())


def resolve_ranks_per_node(site: Mapping[str, Any], gpu_count: Callable[[], int] = torch_gpu_count) -> int:
    """``site.ranks_per_node``; for 'auto', every visible GPU, else ``site.cpu_ranks`` CPU
    processes (gloo). ``gpu_count`` is asked only for 'auto'."""
    if site["ranks_per_node"] == "auto":
        return gpu_count() or int(site.get("cpu_ranks", 2))
    return int(site["ranks_per_node"])


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


def data_source(cfg: Mapping[str, Any]) -> str:
    return str((cfg.get("data") or {}).get("source", "embedded"))


def rung_path(spec: RunSpec, repeat: int = 0) -> str:
    """The rung's result file: its path *is* the run spec. Repeat k ≥ 1 of ``repeats: R``
    is ``<spec>.r<k>.h5`` beside it (results.aggregate reads the suffix), so a ladder
    without repeats keeps the paths it always had."""
    return f"results/rungs/{spec.path}{f'.r{repeat}' if repeat else ''}.h5"


def repeats(cfg: Mapping[str, Any]) -> int:
    """How many times each measured rung runs, each in fresh processes (config ``repeats``)."""
    return int(cfg.get("repeats", 1))


def rung_data_path(spec: RunSpec, source: str) -> str:
    """What the rung's ``--data`` will be: the shard manifest for its image size (one shard
    set per size: the debug flavors train on 32/64 px, the seed flavors on 224 px), or
    'synthetic' (then the rung has no input file)."""
    if source == "synthetic":
        return "synthetic"
    return f"results/shards/{get_flavor(spec.model).image_size}px/manifest.json"


def shards_settled(manifest: str, cfg: Mapping[str, Any]) -> bool:
    """Whether the finished shard set at ``manifest`` was written with the config's data settings.

    Then a rerun of its shard job writes the same bytes (sharding is deterministic), so a rung
    must not run again for it: the rung takes the manifest as ``ancient()`` input (common.smk).
    TRAP: a failed shard attempt with other settings leaves its params in Snakemake's metadata,
    so the next run reshards once; without this every finished rung would run again (issue 21).
    When the settings differ (data changed on purpose) the manifest is a plain input, and the
    rungs run again on the new shards. A missing or unreadable manifest is not settled."""
    try:
        st = os.stat(manifest)
        options = _manifest_options(manifest, st.st_mtime_ns, st.st_size)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    data = cfg.get("data") or {}

    def as_shard_says(key: str) -> str | None:  # `scaleladder shard` records str(Path(value))
        return str(Path(data[key])) if data.get(key) else None

    want = {"images": as_shard_says("images"), "captions": as_shard_says("captions"), "vocab": as_shard_says("vocab"),
            "wds": list(data.get("wds") or []) or None, "samples": data.get("samples"), "per_shard": data.get("per_shard"),
            "seed": data.get("seed")}
    return isinstance(options, dict) and all(options.get(k) == v for k, v in want.items())


@functools.lru_cache(maxsize=16)
def _manifest_options(path: str, mtime_ns: int, size: int) -> Any:
    """A manifest's shard options, read once per version of the file (every rung of a size asks).
    TRAP: mtime alone is coarse (a clock tick): two writes within one share it, so size too."""
    with open(path) as f:
        return json.load(f)["scaleladder"]["options"]


def rung_shards(spec: RunSpec, cfg: Mapping[str, Any]) -> list[tuple[str, bool]]:
    """The rung rule's input as (path, settled): its shard manifest, or nothing for synthetic data."""
    return [(p, shards_settled(p, cfg)) for p in rung_inputs(spec, data_source(cfg))]


def rung_inputs(spec: RunSpec, source: str) -> list[str]:
    """The rung rule's input: its shard manifest, or nothing for synthetic data."""
    path = rung_data_path(spec, source)
    return [] if path == "synthetic" else [path]


def export_repo(root: str) -> None:
    """Set ``SCALELADDER_REPO`` (unless set) to this checkout, for the conda env's pip lines.

    workflow/envs/scaleladder.yaml installs ``-e ${SCALELADDER_REPO}[...]``, which pip expands
    from the environment. TRAP: Snakemake builds an env from its own copy of the file under
    .snakemake/conda/, so a path relative to the file (``../..``) points nowhere; conda runs
    pip as Snakemake's child, so a variable set in Snakemake's process reaches it."""
    os.environ.setdefault("SCALELADDER_REPO", os.path.normpath(root))


def planned_not_to_fit(spec: RunSpec, cfg: Mapping[str, Any], ranks_per_node: int) -> bool:
    """The memory planner's verdict, made while the DAG is built so that a rung that
    cannot fit never costs an allocation. Exactly the call ``scaleladder launch
    --plan-only`` makes when it records the verdict (same spec, world, device, data).
    The planner is analytic and imports no torch, so this runs on a login node.
    False without ``site.plan_device`` or with ``run_predicted_oom``."""
    device = cfg["site"].get("plan_device")
    if not device or cfg.get("run_predicted_oom"):
        return False
    if spec.strategy.compile:
        # A compiled rung's memory is planned as its eager rung's, an upper bound (fusion and the
        # partitioner change what is saved): a compiled rung is never skipped on a bound. It runs; an OOM is its result.
        return False
    from scaleladder.planner.memory import predict  # plan.predict itself; plan imports profiles -> workflow

    world, rpn = rank_args(spec, ranks_per_node)
    return not predict(spec, world, rpn, device, data=rung_data_path(spec, data_source(cfg))).fits


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

    ``config`` is Snakemake's own config dict, validated and completed in place (the
    rules read ``config["steps"]`` and the like from the same object)."""

    config: dict[str, Any]
    ranks_per_node: int
    rungs: tuple[RunSpec, ...]  # the whole ladder, in config order
    skipped: tuple[str, ...]  # "model/strategy/.../b<batch>: why" for each combination that does not exist
    selected: tuple[RunSpec, ...]  # the rungs `select` keeps (all of them without one)
    predicted_oom: frozenset[str]  # spec paths the planner routes to the predicted_oom rule

    @property
    def site(self) -> dict[str, Any]:
        site: dict[str, Any] = self.config["site"]
        return site

    @property
    def rung_files(self) -> list[str]:
        """What the aggregate reads: each selected rung's measurements (every repeat) or predicted-oom
        record; every rung without ``select``. So a ``select`` run ends with the ladder, figures and
        report of what it selected, and the next plain run (its input set changed) re-aggregates all."""
        return [f for s in self.selected for f in result_paths(s, self.predicted_oom, repeats(self.config))]


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
    apply_loader(cfg)
    apply_profiling(cfg)
    rpn = resolve_ranks_per_node(cfg["site"], gpu_count)
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
    predicted = frozenset(s.path for s in rungs if planned_not_to_fit(s, cfg, rpn))
    if predicted:
        print(f"scaleladder: {len(predicted)} rung(s) are predicted not to fit on {cfg['site']['plan_device']} and are "
              "recorded as 'predicted-oom' without running (run them anyway: --config run_predicted_oom=true)", file=log)
    return Ladder(cfg, rpn, tuple(rungs), tuple(skipped), tuple(selected), predicted)


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


# -- targets ----------------------------------------------------------------------------------

FIGURES: list[str] = ["throughput_by_model", "max_batch", "fsdp_knobs", "weak_scaling", "pareto"]


def plan_figures(site: Mapping[str, Any]) -> list[str]:
    """The planner's figures, where the site names a device to plan for: what fits where,
    and its predicted peaks against the measured ones."""
    return ["fits", "predicted_vs_measured"] if site.get("plan_device") else []


def final_targets(ladder: Ladder) -> list[str]:
    """The ladder file, report and figures: of the rungs ``select`` keeps, with one
    (:attr:`Ladder.rung_files`)."""
    figures = FIGURES + plan_figures(ladder.site)
    return (
        ["results/ladder.h5", "results/report.html"]
        + [f"results/plots/{f}.png" for f in figures]
        + [f"results/plots/{f}.pdf" for f in figures]
    )


def plan_chart_args(ladder: Ladder) -> str:
    """What the fits chart shows: the site's device and ranks per node, at the ladder's
    smallest node count and most common precision (ties: the first in sorted order)."""
    precisions = [s.precision for s in ladder.rungs]
    precision = max(sorted(set(precisions)), key=precisions.count)
    nodes = min(s.nodes for s in ladder.rungs)
    return (f"--device {ladder.site['plan_device']} --nodes {nodes} --gpus-per-node {ladder.ranks_per_node} "
            f"--precision {precision}")


# -- 3. rung jobs: the strings a rule needs from the site ---------------------------------------


class RungWildcards(Protocol):
    """The wildcards of a rung rule (Snakemake's Wildcards object has them as attributes)."""

    model: str
    strategy: str
    precision: str
    knobs: str
    nodes: str
    batch: str


def spec_of(wildcards: RungWildcards) -> RunSpec:
    return RunSpec.from_path(
        f"{wildcards.model}/{wildcards.strategy}/{wildcards.precision}/{wildcards.knobs}/n{wildcards.nodes}/b{wildcards.batch}"
    )


def fill(template: str, site: Mapping[str, Any], ranks_per_node: int, spec: RunSpec | None = None) -> str:
    """Substitute the site placeholders {image} and {ranks_per_node}, and with a rung also
    {nodes} and {ranks}. TRAP: str.replace, not str.format: site strings hold shell
    syntax such as ``${SCALELADDER_IMAGE:-...}``, whose braces format() would eat."""
    values = {"{image}": str(site.get("image", "")), "{ranks_per_node}": str(ranks_per_node)}
    if spec is not None:
        values |= {"{nodes}": str(spec.nodes), "{ranks}": str(ranks_of(spec, ranks_per_node))}
    for k, v in values.items():
        template = template.replace(k, v)
    return template


def env_exports(site: Mapping[str, Any]) -> str:
    """``export K="V"; ...`` for every ``site.env`` variable, in the site's order.
    Double quotes: values may use $VARS, which the job's shell expands on the node that
    runs it. TRAP: a value is not escaped, so one holding a double quote breaks the line."""
    env = site.get("env") or {}
    return "".join(f'export {k}="{v}"; ' for k, v in env.items())


def launcher(site: Mapping[str, Any], ranks_per_node: int, spec: RunSpec) -> str:
    """The launcher prefix that starts this rung's ranks (ends with the program)."""
    return fill(site["launcher"], site, ranks_per_node, spec)


def prologue(site: Mapping[str, Any], ranks_per_node: int, spec: RunSpec) -> str:
    """``site.prologue`` for this rung and a ``; ``, or nothing."""
    p = fill(site.get("prologue", ""), site, ranks_per_node, spec).strip()
    return f"{p}; " if p else ""


def ranks_arg(spec: RunSpec, ranks_per_node: int) -> str:
    """``launch`` checks the rung's world (a hybrid group must divide it) before any rank starts."""
    return f" --ranks-per-node {rank_args(spec, ranks_per_node)[1]}"


def device_arg(site: Mapping[str, Any]) -> str:
    """`` --device cuda`` where the site expects GPUs (site.device), so a rank that finds
    none fails naming why instead of training on the CPU; nothing for 'auto' (the
    runner's default)."""
    device = site.get("device", "auto")
    return "" if device == "auto" else f" --device {device}"


def plan_args(cfg: Mapping[str, Any], ranks_per_node: int, spec: RunSpec) -> str:
    """The planner: the max-batch search starts at its prediction; the predicted-oom
    rule records its verdict. Nothing without ``site.plan_device``."""
    device = cfg["site"].get("plan_device")
    if not device:
        return ""
    args = f" --plan-device {device}{ranks_arg(spec, ranks_per_node)}"
    return args + (" --run-predicted-oom" if cfg.get("run_predicted_oom") else "")


def maxbatch_args(cfg: Mapping[str, Any]) -> str:
    """The search's site cap and the config's probe settings (config key ``maxbatch``),
    only those given: ``scaleladder maxbatch`` has its own defaults."""
    mb = cfg.get("maxbatch") or {}
    cap = cfg["site"].get("max_batch_cap")
    args = f" --max-batch-cap {cap}" if cap else ""
    for key in ("max_retries", "probe_steps", "probe_warmup"):
        if key in mb:
            args += f" --{key.replace('_', '-')} {mb[key]}"
    return args


def shard_sources(cfg: Mapping[str, Any]) -> str:
    """``scaleladder shard`` source options, each value shell-quoted; none = its embedded set.

    TRAP: these values are user data that land in a shell line (workflow/rules/data.smk), so
    each one is ``shlex.quote``d here: a folder named ``my imgs; echo PWNED`` is one argument,
    never a command (tests/test_quoting.py runs every such rule with one)."""
    data = cfg.get("data") or {}
    q = shlex.quote
    args = []
    if data.get("images"):
        args.append(f"--images {q(data['images'])}")
    if data.get("captions"):
        args.append(f"--captions {q(data['captions'])}")
    if data.get("wds"):
        args.append("--wds " + " ".join(q(u) for u in data["wds"]))
    if data.get("vocab"):
        args.append(f"--vocab {q(data['vocab'])}")
    return " ".join(args)


def apply_loader(cfg: dict[str, Any]) -> None:
    """The site profile's ``loader`` block, as the rung rules pass it on (issue 15): its
    ``workers`` become ``--workers``, its ``decode`` reaches ``scaleladder run --decode``'s
    default through the site's job environment (``SCALELADDER_DECODE``)."""
    loader = cfg.get("loader") or {}
    if "workers" in loader:  # a count, or "auto" (run resolves it from each rank's cores: data/cores.py)
        cfg["workers"] = "auto" if str(loader["workers"]) == "auto" else int(loader["workers"])
    if loader.get("decode", "cpu") != "cpu":  # cpu is run's own default: nothing to export
        cfg["site"].setdefault("env", {})
        cfg["site"]["env"] = {**(cfg["site"]["env"] or {}), "SCALELADDER_DECODE": str(loader["decode"])}


def apply_profiling(cfg: dict[str, Any]) -> None:
    """The profile's ``profiling`` block (issue 22): ``trace_steps`` and ``memory_snapshot`` reach
    ``scaleladder run --trace-steps`` / ``--memory-snapshot``'s defaults through the site's job
    environment, as ``loader.decode`` does (rung/profiling.py). Absent or off: nothing exported."""
    prof = cfg.get("profiling") or {}
    env: dict[str, str] = {}
    if int(prof.get("trace_steps", 0) or 0) > 0:
        env["SCALELADDER_TRACE_STEPS"] = str(int(prof["trace_steps"]))
    if prof.get("memory_snapshot"):
        env["SCALELADDER_MEMORY_SNAPSHOT"] = "1"
    if env:
        cfg["site"].setdefault("env", {})
        cfg["site"]["env"] = {**(cfg["site"]["env"] or {}), **env}


def shard_slices(cfg: Mapping[str, Any]) -> int:
    """How many ``scaleladder shard --slice K/N`` jobs write each shard set (data.slices, default 1)."""
    return int((cfg.get("data") or {}).get("slices", 1))


def shard_slice_records(px: str | int, slices: int) -> list[str]:
    """The slice records the gather job of a ``px`` shard set waits for (one Snakemake output per slice)."""
    # The name `shard --slice K/N` writes (scaleladder.data.slices.record_name; not imported:
    # it would load PIL and tokenizers into every Snakefile parse. tests/test_shard_parallel.py checks they agree).
    return [f"results/shards/{px}px.parts/slice-{k:04d}-of-{slices:04d}.json" for k in range(slices)]


def provenance_json(ladder: Ladder) -> str:
    """What the aggregated file records about how the ladder was declared (sorted keys,
    so the same config always gives the same string)."""
    cfg = ladder.config
    return json.dumps(
        {
            "site": ladder.site["name"],
            "ranks_per_node": ladder.ranks_per_node,
            "ladders": cfg["ladders"],
            "steps": cfg["steps"],
            "warmup": cfg["warmup"],
            "repeats": cfg.get("repeats", 1),
            "seed": cfg.get("seed", 0),
            "data": cfg.get("data", {}),
            "skipped": list(ladder.skipped),
            # only with one: a plain run's provenance (a rule param: a change reruns the aggregate) is as before
            **({"select": cfg["select"]} if cfg.get("select") else {}),
        },
        sort_keys=True,
    )


def select_note(ladder: Ladder, profile: str = "profiles/<site>") -> str:
    """What a ``select`` run leaves (onsuccess prints it): the ladder, figures and report of the
    selection, and how to get every rung back."""
    return (f"scaleladder: select kept {len(ladder.selected)} of {len(ladder.rungs)} rungs: results/ladder.h5, "
            "results/plots/ and results/report.html hold those only; a plain `snakemake --profile "
            f"{profile}` puts every rung back (it re-aggregates; no finished rung runs again)")
