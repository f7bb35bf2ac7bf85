# Shared helpers: config validation, the ladder as a list of run specs, and the few
# strings a rule needs from the site (its launcher, its environment).
#
# Everything a site is (launcher, container, environment, ranks per node) comes from
# `config["site"]`, which the profile's site.yaml provides. Nothing here names a site.

import itertools
import json
import os
import re
import sys

import jsonschema
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from scaleladder.models.flavors import FLAVORS, get_flavor
from scaleladder.spec import (
    DEFAULT_KNOBS,
    RunSpec,
    SpecError,
    parse_batch,
    parse_knobs,
    parse_precision,
    parse_steps_warmup,
    parse_strategy,
)


# -- 1. validation: a bad config fails here, before any job, naming the key ----------------

SCHEMA = os.path.normpath(os.path.join(workflow.current_basedir, "..", "schemas", "config.schema.yaml"))


def _key(path) -> str:
    """jsonschema's deque path as the dotted key a user would type: ladders[0].models."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _coerce_numbers(cfg: dict) -> None:
    """`--config` parses YAML with BaseLoader, so `batches: [8]` arrives as ['8'] and
    `run_predicted_oom=true` as 'true': make such strings numbers and booleans again
    where the schema wants them."""

    def num(v):
        return int(v) if isinstance(v, str) and v.isdigit() else v

    def boolean(v):
        return {"true": True, "false": False}.get(v.lower(), v) if isinstance(v, str) else v

    for key in ("run_predicted_oom",):
        if key in cfg:
            cfg[key] = boolean(cfg[key])
    if isinstance(cfg.get("site"), dict) and "supervisor_can_launch" in cfg["site"]:
        cfg["site"]["supervisor_can_launch"] = boolean(cfg["site"]["supervisor_can_launch"])
    if isinstance(cfg.get("maxbatch"), dict):
        cfg["maxbatch"] = {k: num(v) for k, v in cfg["maxbatch"].items()}

    for block in cfg.get("ladders") or []:
        if isinstance(block, dict):
            for key in ("batches", "nodes"):
                if isinstance(block.get(key), list):
                    block[key] = [num(v) for v in block[key]]
    for section, keys in (("site", ("ranks_per_node", "cpu_ranks", "max_nodes")), ("data", ("samples", "per_shard", "seed"))):
        for key in keys:
            if isinstance(cfg.get(section), dict) and key in cfg[section]:
                cfg[section][key] = num(cfg[section][key])


def check_config(cfg: dict) -> None:
    _coerce_numbers(cfg)
    with open(SCHEMA) as f:
        schema = yaml.safe_load(f)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(cfg), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  config key '{_key(e.absolute_path)}': {e.message}" for e in errors]
        hint = ""
        if any(not e.absolute_path and "'site'" in e.message for e in errors):
            hint = "\n  (the site and its ladder come from a profile: snakemake --profile profiles/<site>)"
        raise WorkflowError("invalid scaleladder config:\n" + "\n".join(lines) + hint)
    device = (cfg.get("site") or {}).get("plan_device")
    if device:
        from scaleladder.planner.memory import DEVICES  # torch-free

        if device not in DEVICES:
            raise WorkflowError(f"invalid scaleladder config:\n  config key 'site.plan_device': unknown device {device!r}; "
                                f"expected one of {', '.join(DEVICES)} (or '' for no planner)")
    try:  # warm-up < steps: the runner's own check, so no job fails on it later
        parse_steps_warmup(cfg["steps"], cfg["warmup"])
    except SpecError as e:
        raise WorkflowError(f"invalid scaleladder config:\n  config key 'warmup': {e}") from None
    # Names are checked with the run-spec grammar itself, so a typo fails here and not
    # as a job that cannot parse its own spec.
    for i, block in enumerate(cfg["ladders"]):
        checks = [
            ("models", get_flavor),
            ("strategies", parse_strategy),
            ("precisions", parse_precision),
            ("knobs", parse_knobs),
            ("batches", parse_batch),
        ]
        for key, parse in checks:
            for j, value in enumerate(block.get(key, [])):
                try:
                    parse(value)
                except SpecError as e:
                    raise WorkflowError(f"invalid scaleladder config:\n  config key 'ladders[{i}].{key}[{j}]': {e}") from None
        site = cfg["site"]
        if "max" in block["batches"] and not site.get("supervisor_can_launch", True):
            raise WorkflowError(
                f"invalid scaleladder config:\n  config key 'ladders[{i}].batches': 'max' needs a max-batch search, which "
                f"starts the launcher itself, but site '{site['name']}' has supervisor_can_launch: false"
            )
        if site.get("max_nodes") and max(block.get("nodes", [1])) > site["max_nodes"]:
            raise WorkflowError(
                f"invalid scaleladder config:\n  config key 'ladders[{i}].nodes': {max(block['nodes'])} nodes, but "
                f"site '{site['name']}' launches on at most {site['max_nodes']} (site.max_nodes)"
            )


check_config(config)
# Second pass only fills in the schema's defaults (it cannot fail after check_config).
validate(config, schema=SCHEMA, set_default=True)
for _block in config["ladders"]:
    _block.setdefault("precisions", ["fp32"])
    _block.setdefault("knobs", [DEFAULT_KNOBS])
    _block.setdefault("nodes", [1])

SITE: dict = config["site"]


# -- 2. the ladder: every rung as a RunSpec ----------------------------------------------


def _local_ranks() -> int:
    """'auto': every visible GPU (any vendor torch sees), else site.cpu_ranks CPU processes (gloo)."""
    import torch  # late: only the workstation profile pays for importing torch here

    return torch.cuda.device_count() or int(SITE.get("cpu_ranks", 2))


RANKS_PER_NODE: int = _local_ranks() if SITE["ranks_per_node"] == "auto" else int(SITE["ranks_per_node"])


def ranks_of(spec: RunSpec) -> int:
    # `single` is the unwrapped one-process reference: exactly one rank, whatever the site.
    return 1 if spec.strategy.wrapper == "single" else spec.nodes * RANKS_PER_NODE


def _as_list(v) -> list[str]:
    if isinstance(v, list):
        return [str(x) for x in v]
    return [s.strip() for s in str(v).split(",") if s.strip()]


def _selected(spec: RunSpec, select: dict) -> bool:
    fields = {
        "models": spec.model,
        "strategies": str(spec.strategy),
        "precisions": spec.precision,
        "knobs": str(spec.knobs),
        "nodes": str(spec.nodes),
        "batches": str(spec.batch),
    }
    return all(fields[k] in _as_list(v) for k, v in select.items())


def expand_ladder(cfg: dict) -> tuple[list[RunSpec], list[str]]:
    """All rungs of all blocks, in config order, without duplicates; plus what was skipped.

    A block is a cross product, so some of its combinations do not exist: FSDP knobs
    mean nothing to DDP (those collapse onto the one default-knob rung), `single` runs
    on one node, a hybrid group must divide the world size. Those are skipped, not errors.
    """
    specs: dict[str, RunSpec] = {}
    skipped: list[str] = []
    for block in cfg["ladders"]:
        for m, s, p, k, n, b in itertools.product(
            block["models"], block["strategies"], block["precisions"], block["knobs"], block["nodes"], block["batches"]
        ):
            strategy = parse_strategy(s)
            knobs = parse_knobs(k) if strategy.is_fsdp else parse_knobs(DEFAULT_KNOBS)
            try:
                spec = RunSpec(model=m, strategy=strategy, precision=p, knobs=knobs, nodes=int(n), batch=parse_batch(b))
                if strategy.wrapper == "single" and spec.nodes != 1:
                    raise SpecError("strategy 'single' runs in one process on one node")
                strategy.check_world(ranks_of(spec))
            except SpecError as e:
                skipped.append(f"{m}/{s}/{p}/{k}/n{n}/b{b}: {e}")
                continue
            specs.setdefault(spec.path, spec)
    return list(specs.values()), skipped


LADDER, SKIPPED = expand_ladder(config)
SELECTED: list[RunSpec] = [s for s in LADDER if _selected(s, config.get("select") or {})]
if SKIPPED:
    print(f"scaleladder: {len(SKIPPED)} combination(s) of the ladder do not exist and are skipped:", file=sys.stderr)
    for line in SKIPPED[:20]:
        print(f"  {line}", file=sys.stderr)
if not SELECTED:
    raise WorkflowError("scaleladder: config key 'select' matches no rung of the ladder")


def rung_path(spec: RunSpec) -> str:
    """The rung's result file: its path *is* the run spec."""
    return f"results/rungs/{spec.path}.h5"


def rank_args(spec: RunSpec) -> tuple[int, int]:
    """(world, ranks per node) of a rung as the site launches it."""
    world = ranks_of(spec)
    return world, min(RANKS_PER_NODE, world)


def data_source() -> str:
    return (config.get("data") or {}).get("source", "embedded")


def rung_data_path(spec: RunSpec) -> str:
    """What the rung's --data will be: the shard manifest for its image size, or synthetic."""
    if data_source() == "synthetic":
        return "synthetic"
    return f"results/shards/{get_flavor(spec.model).image_size}px/manifest.json"


def planned_not_to_fit(spec: RunSpec) -> bool:
    """The memory planner's verdict, made while the DAG is built so that a rung that
    cannot fit never costs an allocation. Exactly the call `scaleladder launch
    --plan-only` makes when it records the verdict (same spec, world, device, data).
    The planner is analytic and imports no torch, so this runs on a login node."""
    if not SITE.get("plan_device") or config.get("run_predicted_oom"):
        return False
    from scaleladder.plan import predict

    world, rpn = rank_args(spec)
    return not predict(spec, world, rpn, SITE["plan_device"], data=rung_data_path(spec)).fits


PREDICTED_OOM: set[str] = {s.path for s in LADDER if planned_not_to_fit(s)}
if PREDICTED_OOM:
    print(f"scaleladder: {len(PREDICTED_OOM)} rung(s) are predicted not to fit on {SITE['plan_device']} and are recorded "
          "as 'predicted-oom' without running (run them anyway: --config run_predicted_oom=true)", file=sys.stderr)


def result_path(spec: RunSpec) -> str:
    """Where the ladder takes a rung from: its measurement, or the planner's verdict."""
    if spec.path in PREDICTED_OOM:
        return f"results/predicted/{spec.path}.h5"
    return rung_path(spec)


RUNG_FILES: list[str] = [result_path(s) for s in LADDER]


def _alternatives(values) -> str:
    return "|".join(re.escape(str(v)) for v in sorted(set(values)))


# Wildcards may only take values the ladder declares, so a typo in a target path
# cannot match a rule by accident (the rna-seq-star-deseq2 convention).
wildcard_constraints:
    model=_alternatives(s.model for s in LADDER),
    strategy=_alternatives(str(s.strategy) for s in LADDER),
    precision=_alternatives(s.precision for s in LADDER),
    knobs=_alternatives(str(s.knobs) for s in LADDER),
    nodes=r"\d+",
    px=r"\d+",


FIGURES: list[str] = ["throughput_by_model", "max_batch", "fsdp_knobs", "weak_scaling", "pareto"]
# The planner's figures, where the site names a device to plan for: what fits where, and
# its predicted peaks against the measured ones.
PLAN_FIGURES: list[str] = ["fits", "predicted_vs_measured"] if SITE.get("plan_device") else []


def plan_chart_args() -> str:
    """What the fits chart shows: the site's device and ranks per node, at the ladder's
    smallest node count and most common precision."""
    precisions = [s.precision for s in LADDER]
    precision = max(sorted(set(precisions)), key=precisions.count)
    nodes = min(s.nodes for s in LADDER)
    return f"--device {SITE['plan_device']} --nodes {nodes} --gpus-per-node {RANKS_PER_NODE} --precision {precision}"


def final_targets() -> list[str]:
    """With `select`, only the selected rung files (re-aggregate afterwards with a plain run)."""
    if config.get("select"):
        return [result_path(s) for s in SELECTED]
    figures = FIGURES + PLAN_FIGURES
    return (
        ["results/ladder.h5", "results/report.html"]
        + [f"results/plots/{f}.png" for f in figures]
        + [f"results/plots/{f}.pdf" for f in figures]
    )


# -- 3. rung jobs: the strings a rule needs ----------------------------------------------


def spec_of(wildcards) -> RunSpec:
    return RunSpec.from_path(
        f"{wildcards.model}/{wildcards.strategy}/{wildcards.precision}/{wildcards.knobs}/n{wildcards.nodes}/b{wildcards.batch}"
    )


def _fill(template: str, spec: RunSpec | None = None) -> str:
    """Substitute the site placeholders. str.replace, not str.format: site strings hold
    shell syntax such as ${SCALELADDER_IMAGE:-...}, whose braces format() would eat."""
    values = {"{image}": SITE.get("image", ""), "{ranks_per_node}": str(RANKS_PER_NODE)}
    if spec is not None:
        values |= {"{nodes}": str(spec.nodes), "{ranks}": str(ranks_of(spec))}
    for k, v in values.items():
        template = template.replace(k, v)
    return template


def site_env() -> str:
    """`export K="V"; ...` for every site variable. Double quotes: values may use $VARS,
    which the job's shell expands on the node that runs it."""
    env = SITE.get("env") or {}
    return "".join(f'export {k}="{v}"; ' for k, v in env.items())


SCALELADDER: str = _fill(SITE["scaleladder"])


def launcher(wildcards) -> str:
    return _fill(SITE["launcher"], spec_of(wildcards))


def spec_path(wildcards) -> str:
    return spec_of(wildcards).path


def prologue(wildcards) -> str:
    p = _fill(SITE.get("prologue", ""), spec_of(wildcards)).strip()
    return f"{p}; " if p else ""


def ranks_arg(wildcards) -> str:
    """`launch` checks the rung's world (a hybrid group must divide it) before any rank starts."""
    return f" --ranks-per-node {rank_args(spec_of(wildcards))[1]}"


def device_arg() -> str:
    """` --device cuda` where the site expects GPUs (site.device), so a rank that finds
    none fails naming why instead of training on the CPU; nothing for 'auto' (the
    runner's default)."""
    device = SITE.get("device", "auto")
    return "" if device == "auto" else f" --device {device}"


def plan_args(wildcards) -> str:
    """The planner: the max-batch search starts at its prediction; the predicted-oom
    rule records its verdict."""
    if not SITE.get("plan_device"):
        return ""
    args = f" --plan-device {SITE['plan_device']}{ranks_arg(wildcards)}"
    return args + (" --run-predicted-oom" if config.get("run_predicted_oom") else "")


def maxbatch_args() -> str:
    """The search's site cap and the config's probe settings (config key `maxbatch`)."""
    mb = config.get("maxbatch") or {}
    args = f" --max-batch-cap {SITE['max_batch_cap']}" if SITE.get("max_batch_cap") else ""
    for key in ("max_retries", "probe_steps", "probe_warmup"):
        if key in mb:
            args += f" --{key.replace('_', '-')} {mb[key]}"
    return args


def rung_data(wildcards) -> list[str]:
    """The shard manifest a rung reads: one shard set per image size, since the debug
    flavors train on 32/64 px images and the seed flavors on 224 px."""
    path = rung_data_path(spec_of(wildcards))
    return [] if path == "synthetic" else [path]


def data_arg(wildcards, input) -> str:
    return input.data if input.get("data") else "synthetic"


def shard_sources() -> str:
    """`scaleladder shard` source options; none = its embedded sample set."""
    data = config.get("data") or {}
    args = []
    if data.get("images"):
        args.append(f"--images {data['images']}")
    if data.get("captions"):
        args.append(f"--captions {data['captions']}")
    if data.get("wds"):
        args.append("--wds " + " ".join(data["wds"]))
    if data.get("vocab"):
        args.append(f"--vocab {data['vocab']}")
    return " ".join(args)


def provenance_json() -> str:
    """What the aggregated file records about how the ladder was declared."""
    return json.dumps(
        {
            "site": SITE["name"],
            "ranks_per_node": RANKS_PER_NODE,
            "ladders": config["ladders"],
            "steps": config["steps"],
            "warmup": config["warmup"],
            "seed": config.get("seed", 0),
            "data": config.get("data", {}),
            "skipped": SKIPPED,
        },
        sort_keys=True,
    )
