"""What fits where: the planner's verdict for every model × strategy on one machine shape.

Torch-free, like the rest of the planner; ``scaleladder plan --fits-table`` prints it and
``figures.plan_plots.fits_chart`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaleladder.flavors import FLAVORS
from scaleladder.planner.memory import Device, predict

# The seeds' claims live beside the seeds' other facts (their hardware is named there only).
from scaleladder.planner.seeds import SEED_CLAIMS as SEED_CLAIMS
from scaleladder.planner.seeds import SeedClaim as SeedClaim
from scaleladder.spec import RunSpec, SpecError, default_knobs, parse_strategy

# The ladder a fits table shows, cheapest-memory last.
# fsdp-full-ac-reentrant is the FLAVA seed's AC form (units inside the checkpoint wrappers):
# for FLAVA it differs from fsdp-full-ac, whose units stay gathered across the two passes.
TABLE_STRATEGIES = ("single", "ddp", "fsdp-no-shard", "fsdp-hybrid2", "fsdp-grad-op", "fsdp-full", "fsdp-full-ac",
                    "fsdp-full-ac-reentrant", "fsdp2-grad-op", "fsdp2-full", "fsdp2-full-ac")  # FSDP2 at its default knobs (pf0)


@dataclass(frozen=True)
class FitsCell:
    model: str
    strategy: str
    fits: bool | None  # None: the strategy cannot run on this world (single on 8 ranks, a hybrid group that does not divide it)
    max_batch: int | None
    peak_bytes: int | None  # at the requested batch (or at max_batch when none was requested)
    reason: str = ""


def fits_table(device: str | Device, nodes: int, gpus_per_node: int, precision: str = "bf16-mixed", batch: int | None = None,
               models: list[str] | None = None, strategies: tuple[str, ...] = TABLE_STRATEGIES,
               data: str = "synthetic") -> list[FitsCell]:
    """What fits where: every model × strategy on ``nodes`` × ``gpus_per_node`` ranks of ``device``.

    With ``batch``, a cell fits when that local batch fits; without, when batch 1 does,
    and ``max_batch`` says how far it goes. By default every built-in flavor but the debug ones:
    a models-file model has no analytic plan (its cells are its traces':
    ``campaign/plan_trace.fits_cells``).
    """
    world = nodes * gpus_per_node
    models = models or [m for m, f in FLAVORS.items() if not f.debug and not f.entry]
    cells = []
    for m in models:
        for s in strategies:
            strat = parse_strategy(s)
            try:
                strat.check_world(world)
            except SpecError as e:
                cells.append(FitsCell(m, s, None, None, None, str(e)))
                continue
            spec = RunSpec(m, strat, precision, default_knobs(strat), nodes, batch if batch is not None else "max")
            p = predict(spec, world, gpus_per_node, device, data=data)
            fits = p.fits if batch is not None else p.max_batch is not None
            cells.append(FitsCell(m, s, fits, p.max_batch, p.peak_bytes))
    return cells


# -- the seeds' claims, for a fits table to be held against ----------------------------------------


def seed_differences(cells: list[FitsCell], device: str | Device, world: int, precision: str,
                     batch: int | None) -> dict[tuple[str, str], str]:
    """The cells whose prediction differs from a seed's claim: (model, strategy) -> why, in words.

    With ``batch``, a cell is held against the claims made at that batch; without, its max
    batch against each claim's batches (a max of 4 fits batch 1, not batch 8)."""
    name = device if isinstance(device, str) else device.name
    out: dict[tuple[str, str], str] = {}
    for claim in SEED_CLAIMS:
        if (claim.device, claim.world, claim.precision) != (name, world, precision):
            continue
        for c in cells:
            if c.fits is None or c.strategy not in claim.strategies or c.model not in claim.models:
                continue
            seed_fits = c.model in claim.fit
            for b in claim.batches if batch is None else [b for b in claim.batches if b == batch]:
                predicted = bool(c.fits) if batch is not None else (c.max_batch or 0) >= b
                if predicted != seed_fits:
                    out.setdefault((c.model, c.strategy), f"{claim.seed}: \"{claim.claim}\"; predicted "
                                   f"{'to fit' if predicted else 'not to fit'} at local batch {b}")
    return out
