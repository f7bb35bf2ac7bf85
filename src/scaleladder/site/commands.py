"""What the rules' shell commands need: the site's strings filled for one rung, and the arguments.

``workflow/rules/*.smk`` import this module as ``swf``: the launcher and prologue with
their placeholders filled (:func:`fill`), the ``export`` line, the ``--ranks-per-node``,
planner and max-batch arguments, the rung's options (:func:`rung_options`: ``--device`` and
every setting of every rung, from the schema's ``run_arg`` rows), the shard sources
(shell-quoted: they are user data), the provenance the aggregate records and the planner
chart's arguments. Every function reads the typed config (site/settings.py), never the dict.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from typing import Any, Protocol

from scaleladder.rung.run_config import rule_args
from scaleladder.site.config import run_arg_rows
from scaleladder.site.ladder import Ladder, plan_figures, rank_args, ranks_of
from scaleladder.site.settings import Site, SiteConfig
from scaleladder.spec import RunSpec

# plan_figures is the ladder's (its targets); report.smk reads it as swf.plan_figures
__all__ = [
    "plan_figures", "RungWildcards", "spec_of", "fill", "env_exports", "launcher", "prologue",
    "ranks_arg", "device_arg", "rung_options", "rung_workers", "plan_args", "maxbatch_args", "shard_sources", "shard_slices",
    "shard_slice_records", "RUNG_ARGS", "rung_shell", "provenance_json", "plan_chart_args",
    "export_repo",
]


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


def fill(template: str, site: Site, ranks_per_node: int, spec: RunSpec | None = None) -> str:
    """Substitute the site placeholders {image} and {ranks_per_node}, and with a rung also
    {nodes} and {ranks}. TRAP: str.replace, not str.format: site strings hold shell
    syntax such as ``${SCALELADDER_IMAGE:-...}``, whose braces format() would eat."""
    values = {"{image}": str(site.image), "{ranks_per_node}": str(ranks_per_node)}
    if spec is not None:
        values |= {"{nodes}": str(spec.nodes), "{ranks}": str(ranks_of(spec, ranks_per_node))}
    for k, v in values.items():
        template = template.replace(k, v)
    return template


def env_exports(site: Site) -> str:
    """``export K="V"; ...`` for every ``site.env`` variable, in the site's order.
    Double quotes: values may use $VARS, which the job's shell expands on the node that
    runs it. TRAP: a value is not escaped, so one holding a double quote breaks the line."""
    return "".join(f'export {k}="{v}"; ' for k, v in site.env)


def launcher(site: Site, ranks_per_node: int, spec: RunSpec) -> str:
    """The launcher prefix that starts this rung's ranks (ends with the program)."""
    return fill(site.launcher, site, ranks_per_node, spec)


def prologue(site: Site, ranks_per_node: int, spec: RunSpec) -> str:
    """``site.prologue`` for this rung and a ``; ``, or nothing."""
    p = fill(site.prologue, site, ranks_per_node, spec).strip()
    return f"{p}; " if p else ""


def ranks_arg(spec: RunSpec, ranks_per_node: int) -> str:
    """``launch`` checks the rung's world (a hybrid group must divide it) before any rank starts."""
    return f" --ranks-per-node {rank_args(spec, ranks_per_node)[1]}"


def device_arg(site: Site) -> str:
    """`` --device cuda`` where the site expects GPUs (site.device), so a rank that finds
    none fails naming why instead of training on the CPU; nothing for 'auto' (the
    runner's default)."""
    return "" if site.device == "auto" else f" --device {site.device}"


def _value(cfg: SiteConfig, path: tuple[str, ...]) -> object:
    value: object = cfg
    for key in path:
        value = getattr(value, key)
    return value


def rung_options(cfg: SiteConfig, schema: Mapping[str, Any] | None = None) -> str:
    """Every option of a rung beyond the rules' shared arguments (:data:`RUNG_ARGS`): ``--device``
    (:func:`device_arg`), then each setting of every rung, a schema row naming its ``run`` flag
    (``run_arg``), where the config sets it to other than its default (the rung's own: run_config).
    So a profile at its defaults adds nothing, and its rules' commands are what they were.

    The rules pass this string as their ``device`` parameter. TRAP: the name stays although the
    string carries more: Snakemake reruns a finished rung whose rule's shell template changed
    (rerun trigger "code"), and renaming the placeholder would change every rung rule's template.
    A value that changes the string reruns the rungs it reaches (trigger "params"), as it must."""
    options = device_arg(cfg.site)
    for path, flag, default in run_arg_rows(schema):
        value = _value(cfg, path)
        if value is None or value == default:
            continue
        if isinstance(value, bool):
            options += f" {flag}" if value else ""
        else:
            options += f" {flag} {shlex.quote(str(value))}"
    return options


def rung_workers(cfg: SiteConfig) -> int:
    """Loader workers per rank: the profile's ``loader.workers``, else the config's ``workers``."""
    return cfg.workers if cfg.loader.workers is None else cfg.loader.workers


def plan_args(cfg: SiteConfig, ranks_per_node: int, spec: RunSpec) -> str:
    """The planner: the max-batch search starts at its prediction; the predicted-oom
    rule records its verdict. Nothing without ``site.plan_device``."""
    if not cfg.site.plan_device:
        return ""
    args = f" --plan-device {cfg.site.plan_device}{ranks_arg(spec, ranks_per_node)}"
    return args + (" --run-predicted-oom" if cfg.run_predicted_oom else "")


def maxbatch_args(cfg: SiteConfig) -> str:
    """The search's site cap and the config's probe settings (config key ``maxbatch``),
    only those given: ``scaleladder maxbatch`` has its own defaults."""
    cap = cfg.site.max_batch_cap
    args = f" --max-batch-cap {cap}" if cap else ""
    for key in ("max_retries", "probe_steps", "probe_warmup"):
        if (value := getattr(cfg.maxbatch, key)) is not None:
            args += f" --{key.replace('_', '-')} {value}"
    return args


def shard_sources(cfg: SiteConfig) -> str:
    """``scaleladder shard`` source options, each value shell-quoted; none = its embedded set.

    TRAP: these values are user data that land in a shell line (workflow/rules/data.smk), so
    each one is ``shlex.quote``d here: a folder named ``my imgs; echo PWNED`` is one argument,
    never a command (tests/test_quoting.py runs every such rule with one)."""
    data = cfg.data
    q = shlex.quote
    args = []
    if data.images:
        args.append(f"--images {q(data.images)}")
    if data.captions:
        args.append(f"--captions {q(data.captions)}")
    if data.wds:
        args.append("--wds " + " ".join(q(u) for u in data.wds))
    if data.vocab:
        args.append(f"--vocab {q(data.vocab)}")
    return " ".join(args)


def shard_slices(cfg: SiteConfig) -> int:
    """How many ``scaleladder shard --slice K/N`` jobs write each shard set (data.slices, default 1)."""
    return cfg.data.slices or 1


def shard_slice_records(px: str | int, slices: int) -> list[str]:
    """The slice records the gather job of a ``px`` shard set waits for (one Snakemake output per slice)."""
    # The name `shard --slice K/N` writes (scaleladder.data.slices.record_name; not imported:
    # it would load PIL and tokenizers into every Snakefile parse. tests/test_shard_parallel.py checks they agree).
    return [f"results/shards/{px}px.parts/slice-{k:04d}-of-{slices:04d}.json" for k in range(slices)]


def provenance_json(ladder: Ladder) -> str:
    """What the aggregated file records about how the ladder was declared (sorted keys,
    so the same config always gives the same string)."""
    cfg, settings = ladder.config, ladder.settings  # the blocks as the config gives them; the scalars typed
    return json.dumps(
        {
            "site": settings.site.name,
            "ranks_per_node": ladder.ranks_per_node,
            "ladders": cfg["ladders"],
            "steps": settings.steps,
            "warmup": settings.warmup,
            "repeats": settings.repeats,
            "seed": settings.seed,
            "data": cfg.get("data", {}),
            "skipped": list(ladder.skipped),
            # only with one: a plain run's provenance (a rule param: a change reruns the aggregate) is as before
            **({"select": cfg["select"]} if cfg.get("select") else {}),
        },
        sort_keys=True,
    )


def plan_chart_args(ladder: Ladder) -> str:
    """What the fits chart shows: the site's device and ranks per node, at the ladder's
    smallest node count and most common precision (ties: the first in sorted order)."""
    precisions = [s.precision for s in ladder.rungs]
    precision = max(sorted(set(precisions)), key=precisions.count)
    nodes = min(s.nodes for s in ladder.rungs)
    return (f"--device {ladder.settings.site.plan_device} --nodes {nodes} --gpus-per-node {ladder.ranks_per_node} "
            f"--precision {precision}")


#: The rung's own arguments, the same for every ladder rule and every command that runs a rung
#: (``run``, ``launch``, ``finalize``, ``maxbatch``, ``launch --plan-only``): the RunConfig fields
#: that name a rule placeholder (rung/run_config.rule_args). Snakemake fills the placeholders
#: from the rule's params and output (``:q``: shell-quoted, paths are data).
RUNG_ARGS = rule_args()


def rung_shell(command: str) -> str:
    """The shell command of a ladder rule (workflow/rules/ladder.smk), by what starts the rung:

    - ``launch``: ``scaleladder launch`` runs the site's launcher itself (site.supervise: launch);
    - ``finalize``: the rule runs ``<launcher> run``, then ``scaleladder finalize --rc`` (an
      Apptainer-only site); ``&& rc=0 || rc=$?`` because Snakemake runs commands under ``set -e``;
      first it removes OOM markers an earlier attempt that Slurm killed may have left;
    - ``maxbatch``: the max-batch search, several launches;
    - ``plan-only``: ``launch --plan-only``, the planner's predicted-oom record in a second.

    TRAP: a template with Snakemake's placeholders, not the finished line: Snakemake reruns a
    finished rung whose rule's shell template or params changed (rerun trigger "code", and
    "params"), so these templates must not change (tests/test_settings.py holds them byte for
    byte): a new setting of every rung travels inside ``{params.device}`` (:func:`rung_options`).
    The rest of ``run``'s arguments (``--lr``, ``--init``, ...) take their defaults.
    """
    log = " > {log:q} 2>&1"
    if command == "launch":
        return "{params.env}{params.scaleladder} launch --launcher {params.launcher:q}{params.ranks}{params.device} " + RUNG_ARGS + log
    if command == "finalize":
        return ("rm -f {output:q}.oom-rank*.json; {params.env}{params.prologue}{params.launcher} run{params.device} " + RUNG_ARGS + log
                + " && rc=0 || rc=$?; {params.scaleladder} finalize --rc $rc{params.device} " + RUNG_ARGS + " >> {log:q} 2>&1")
    if command == "maxbatch":
        return ("{params.env}{params.prologue}{params.scaleladder} maxbatch --launcher {params.launcher:q}{params.plan}{params.cap}"
                "{params.device} " + RUNG_ARGS + log)
    if command == "plan-only":
        return "{params.env}{params.scaleladder} launch --plan-only{params.plan} " + RUNG_ARGS + log
    raise ValueError(f"rung_shell: unknown command {command!r} (launch, finalize, maxbatch, plan-only)")


def export_repo(root: str) -> None:
    """Set ``SCALELADDER_REPO`` (unless set) to this checkout, for the conda env's pip lines.

    workflow/envs/scaleladder.yaml installs ``-e ${SCALELADDER_REPO}[...]``, which pip expands
    from the environment. TRAP: Snakemake builds an env from its own copy of the file under
    .snakemake/conda/, so a path relative to the file (``../..``) points nowhere; conda runs
    pip as Snakemake's child, so a variable set in Snakemake's process reaches it."""
    os.environ.setdefault("SCALELADDER_REPO", os.path.normpath(root))
