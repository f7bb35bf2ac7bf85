"""What fits where: the planner's verdict for every model × strategy on one machine shape.

Torch-free, like the rest of the planner; ``scaleladder plan --fits-table`` prints it and
``figures.plan_plots.fits_chart`` draws it.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaleladder.models.flavors import FLAVORS
from scaleladder.planner.memory import Device, predict
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
    and ``max_batch`` says how far it goes.
    """
    world = nodes * gpus_per_node
    models = models or [m for m, f in FLAVORS.items() if not f.debug]
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


@dataclass(frozen=True)
class SeedClaim:
    """What a seed said fits, on one machine shape: the models of ``models`` that ``fit`` (the
    rest do not) under each of ``strategies`` at each local batch of ``batches``. Worded and
    recomputed in docs/planner.md, "Seed claims, recomputed" (planner/seeds.py, tests/test_plan.py)."""

    seed: str
    claim: str
    device: str
    world: int
    strategies: tuple[str, ...]
    models: tuple[str, ...]
    fit: frozenset[str]
    batches: tuple[int, ...]
    precision: str = "bf16-mixed"


_FLAVA = ("flava-350m", "flava-900m", "flava-1.8b", "flava-2.7b", "flava-4.8b", "flava-10b")
_VIT = ("vit-3b", "vit-5b", "vit-15b")
# The FLAVA seed: 8 x A100 40GB, its Figure 1 at local batch 8, "could not be trained" read at batch 1 too.
# FSDP + AC was reentrant in its code: the runner's fsdp-full-ac-reentrant is that rung, fsdp-full-ac is not.
# The ViT seed: local batch 32, AC on (ORNL's default); its "HYBRID over g GCDs" on g ranks shards over all
# of them, as fsdp-full-ac does on a world of g.
SEED_CLAIMS = (
    SeedClaim("FLAVA seed", "DDP fits 350M and 900M only", "a100-40gb", 8, ("ddp",), _FLAVA, frozenset(_FLAVA[:2]), (1, 8)),
    SeedClaim("FLAVA seed", "FSDP adds 1.8B and 2.7B", "a100-40gb", 8, ("fsdp-full",), _FLAVA, frozenset(_FLAVA[:4]), (1, 8)),
    SeedClaim("FLAVA seed", "FSDP + AC reaches 4.8B and 10B", "a100-40gb", 8, ("fsdp-full-ac", "fsdp-full-ac-reentrant"),
              _FLAVA, frozenset(_FLAVA), (1, 8)),
    SeedClaim("ViT seed", "ViT-3B fits one GCD; 5B needs sharding over 2", "mi250x-gcd", 1, ("fsdp-full-ac",), _VIT,
              frozenset(_VIT[:1]), (32,)),
    SeedClaim("ViT seed", "ViT-15B needs 4 GCDs", "mi250x-gcd", 2, ("fsdp-full-ac",), _VIT, frozenset(_VIT[:2]), (32,)),
    SeedClaim("ViT seed", "ViT-15B needs 4 GCDs", "mi250x-gcd", 4, ("fsdp-full-ac",), _VIT, frozenset(_VIT), (32,)),
)


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
