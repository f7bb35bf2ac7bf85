"""Which convergence rungs the workflow's ``converge`` config asks for, and their run specs.

Torch-free (Snakemake imports it while it builds the DAG); ``workflow/rules/converge.smk``
calls these with the typed ``converge`` block, ``scaleladder converge``
(:mod:`scaleladder.campaign.converge`) runs each rung.
"""

from __future__ import annotations

from scaleladder.site.settings import Converge
from scaleladder.spec import RunSpec, SpecError, default_knobs, parse_precision, parse_strategy

SHARDS = "results/converge/shards"
RECORD = "results/converge/rungs/{strategy}/{precision}/s{seed}.h5"


def world_of(strategy: str, ranks_per_node: int) -> int:
    """One rank for ``single``, the node's ranks otherwise (one node: digits are small)."""
    return 1 if parse_strategy(strategy).wrapper == "single" else ranks_per_node


def rung_spec(cv: Converge, strategy: str, precision: str, ranks_per_node: int) -> RunSpec:
    """The rung as the site launches it. The local batch is the global batch over the
    ranks, so every rung sees the same global batch, and so the same learning problem."""
    s = parse_strategy(strategy)
    world = world_of(strategy, ranks_per_node)
    if cv.global_batch % world:
        raise SpecError(f"converge.global_batch {cv.global_batch} does not divide over {world} ranks ({strategy})")
    return RunSpec(cv.model, s, parse_precision(precision), default_knobs(s), 1, cv.global_batch // world)


def data_path(cv: Converge, split: str) -> str:
    """The shard manifest of ``split`` ('train' | 'test'): the digits' unless the config names one."""
    given = cv.train if split == "train" else cv.test
    return f"{SHARDS}/{split}/manifest.json" if given == "digits" else given


def records(cv: Converge) -> list[str]:
    """Every convergence record the config asks for (none unless ``enabled``)."""
    if not cv.enabled:
        return []
    return [RECORD.format(strategy=st, precision=pr, seed=seed)
            for st in cv.strategies for pr in cv.precisions for seed in cv.seeds]


def launcher_arg(strategy: str, launcher: str) -> str:
    """`` --launcher '<prefix>'`` for a multi-rank rung; nothing for ``single`` (this process)."""
    import shlex

    return "" if parse_strategy(strategy).wrapper == "single" else f" --launcher {shlex.quote(launcher)}"
