"""The workflow's config, checked once before any job: schema, defaults, data values.

:func:`validate_config` checks the merged config ONCE against
workflow/schemas/config.schema.yaml, filling the schema's ``default``s as it goes, then
checks the names in the ladder with the run-spec grammar itself. A bad config raises
:class:`ConfigError` naming the key (``config key 'ladders[0].models[0]': ...``); common.smk
turns it into Snakemake's WorkflowError, so it fails before any job.
:func:`check_data_values` refuses a data value (a path, a URL) the jobs' command lines
cannot carry intact; :func:`run_arg_rows` lists the settings of every rung (the schema's rows
that name a ``run`` flag), which the rung rules pass on as arguments.

Nothing here uses Snakemake's globals (``workflow``, ``config``, ``rules``): they come in as
arguments (tests/test_workflow_logic.py calls them directly).
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from scaleladder.flavors import get_flavor
from scaleladder.spec import (
    SpecError,
    parse_batch,
    parse_knobs,
    parse_precision,
    parse_steps_warmup,
    parse_strategy,
)

__all__ = [
    "INVALID", "ConfigError", "config_key", "as_int", "as_bool", "coerce_config_strings", "load_schema",
    "schema_errors", "validate_config", "DATA_KEYS", "data_values", "check_data_values", "run_arg_rows",
]


#: The header every config error starts with; tests and users grep for the key after it.
INVALID = "invalid scaleladder config:\n"


class ConfigError(ValueError):
    """A config the workflow cannot run, with the key that is wrong in the message.

    Not Snakemake's WorkflowError: Snakemake is the optional ``[workflow]`` extra (the GPU
    images install it; a bare ``pip install scaleladder`` has none), and this module stays
    importable without it. common.smk re-raises it as a WorkflowError, which Snakemake
    prints without a traceback and exits 1 on, before any job."""


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


def as_number(value: Any) -> Any:
    """'0.8' -> 0.8; anything float() refuses unchanged (the schema names it)."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


#: What a CLI string becomes where the schema declares the type, and no string besides.
_COERCE: dict[str, Callable[[Any], Any]] = {"boolean": as_bool, "integer": as_int, "number": as_number}

#: The schema the workflow validates against (what :func:`coerce_config_strings` reads when given none).
SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node``, or what its ``$ref`` (``#/definitions/x``) names."""
    while isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"):
        target: Any = root
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node


def _scalar_types(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[str]:
    """'boolean', 'integer' and/or 'number', in that order, where a string at ``node`` must become
    one of them (``site.pack``: a boolean or an integer); none where the schema allows a string too
    (a model name made of digits stays a string) or declares no type."""
    types: set[str] = set()
    for alt in [node, *(node.get("anyOf") or []), *(node.get("oneOf") or [])]:
        declared = _resolve(alt, root).get("type")
        types |= set(declared) if isinstance(declared, list) else {declared} if declared else set()
    return [] if "string" in types else [t for t in _COERCE if t in types]


def _coerce(value: Any, node: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    """``value`` with every string the schema wants as a number or boolean made one (dicts in place)."""
    node = _resolve(node, root)
    if isinstance(value, str):
        for kind in _scalar_types(node, root):
            if not isinstance(made := _COERCE[kind](value), str):
                return made
        return value
    if isinstance(value, dict):
        props, extra = node.get("properties") or {}, node.get("additionalProperties")
        for key in list(value):
            sub = props.get(key, extra)
            if isinstance(sub, Mapping):
                value[key] = _coerce(value[key], sub, root)
    elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [_coerce(v, node["items"], root) for v in value]
    return value


def coerce_config_strings(cfg: dict[str, Any], schema: Mapping[str, Any] | None = None) -> None:
    """Make numbers and booleans of the strings ``--config`` gives, in place.

    TRAP: Snakemake parses ``--config`` values with YAML's BaseLoader, so ``batches: [8]``
    arrives as ``['8']`` and ``run_predicted_oom=true`` as ``'true'``. Only the keys the
    schema declares as integer, number or boolean (and not also as a string) are touched,
    found by walking the schema itself (``$ref``, ``anyOf``, items and properties): a model
    name made of digits stays a string, and ``ranks_per_node: auto`` stays 'auto'.
    """
    root = load_schema(SCHEMA) if schema is None else schema
    _coerce(cfg, root, root)


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
    loaded = schema if isinstance(schema, Mapping) else load_schema(schema)
    coerce_config_strings(cfg, loaded)
    lines = schema_errors(cfg, loaded)
    if lines:
        # the hint (last line, if any) follows the keys without its own "config key"
        raise ConfigError(INVALID + "\n".join(lines))
    site = cfg["site"]
    device = site.get("plan_device")
    if device:
        from scaleladder.planner.memory import (
            DEVICES,  # torch-free, like everything the DAG build imports
        )

        if device not in DEVICES:
            raise ConfigError(f"{INVALID}  config key 'site.plan_device': unknown device {device!r}; "
                              f"expected one of {', '.join(DEVICES)} (or '' for no planner)")
    try:  # the runner's own check, so that no job fails on it later
        parse_steps_warmup(cfg["steps"], cfg["warmup"])
    except SpecError as e:
        raise ConfigError(f"{INVALID}  config key 'warmup': {e}") from None
    trace = int((cfg.get("profiling") or {}).get("trace_steps") or 0)
    if trace > cfg["steps"] - cfg["warmup"]:  # every rung would refuse it (rung/profiling.check_profiling)
        raise ConfigError(f"{INVALID}  config key 'profiling.trace_steps': {trace}, but a rung measures only "
                          f"{cfg['steps'] - cfg['warmup']} steps after its {cfg['warmup']} warm-up step(s); trace at most that many")
    register_models_file(cfg.get("models_file"))  # before the ladder's names: they may be its entries
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


def register_models_file(path: str | None) -> None:
    """The config's ``models_file``, checked and its names registered, torch-free (models/models_file.py):
    its syntax and every entry's keys here, when the DAG is made; what timm and transformers say
    about an entry, in the first job that builds the model (importing them here would cost
    Snakemake's process seconds, and torch)."""
    if not path:
        return
    if _CONTROL.search(path):
        raise ConfigError(f"{INVALID}  config key 'models_file': {path!r} holds a control character (a newline?); rename it")
    from scaleladder.models.models_file import register_models_file as register

    try:
        register(path)
    except SpecError as e:
        raise ConfigError(f"{INVALID}  config key 'models_file': {e}") from None


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


def run_arg_rows(schema: Mapping[str, Any] | None = None) -> list[tuple[tuple[str, ...], str, object]]:
    """The settings of every rung: (their key path, their ``run`` flag, the schema's default) for each
    schema row with ``run_arg``, in the schema's order (site/commands.rung_options passes them on)."""
    root = load_schema(SCHEMA) if schema is None else schema
    rows: list[tuple[tuple[str, ...], str, object]] = []

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        node = _resolve(node, root)
        if isinstance(node.get("run_arg"), str):
            rows.append((path, node["run_arg"], node.get("default")))
        for key, sub in (node.get("properties") or {}).items():
            if isinstance(sub, Mapping):
                walk(sub, (*path, key))

    walk(root, ())
    return rows
