"""Parameters, gradients and AdamW states per rank — exactly, padding included.

What each strategy keeps on a rank *between* steps (after ``optimizer.step()``,
before ``zero_grad``), for the runner's exact setup (``parallel.py``, ``runner.py``):

* ``single`` / ``ddp``: every parameter; a gradient for each trainable one; AdamW's
  ``exp_avg`` and ``exp_avg_sq`` for each trainable one. (DDP's gradient buckets are
  communication buffers, counted by the timeline in :mod:`.memory`, not here.)
* FSDP1 (``use_orig_params=True``): each unit is ONE flat parameter. Building it,
  FSDP inserts padding before any parameter whose offset is not a multiple of
  16 bytes of the *compute* dtype (``_get_aligned_numel``: 4 elements for fp32, 8
  for bf16/fp16 — so bf16-mixed pads differently from fp32), then pads the total to
  a multiple of the process group's size — the shard group for HYBRID, the whole
  world for FULL/SHARD_GRAD_OP *and NO_SHARD*. A sharded strategy keeps chunk
  ``r`` of ``F/g`` elements; NO_SHARD keeps all ``F``.

  - params: the local chunk, padding and frozen parameters included;
  - grads: the local chunk of the flat gradient — also padding and frozen parts,
    since FSDP reduces the whole flat gradient (the codebook unit has none: nothing
    in it requires grad);
  - AdamW: the optimizer holds the *original* parameters, which are views into the
    chunk, so its states cover only the trainable elements that fall in this rank's
    chunk. Padding sits at the end of the last rank's chunk, hence ``rank``.

AdamW's ``step`` counters are 0-dim tensors kept on the host (non-capturable,
non-fused AdamW), so they are not device memory and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaleladder.planner.inventory import Inventory, UnitLayout, inventory
from scaleladder.spec import RunSpec, SpecError, Strategy

ALIGN_BYTES = 16  # torch.distributed.fsdp._flat_param._get_aligned_numel


def storage_bytes(precision: str) -> int:
    """Bytes per element of parameters, gradients and AdamW states."""
    return 2 if precision == "bf16-true" else 4


def compute_bytes(precision: str) -> int:
    """Bytes per element of activations produced by matmuls (autocast or true low precision)."""
    return 4 if precision in ("fp32", "tf32") else 2


def fsdp_param_bytes(precision: str) -> int:
    """Bytes per element of an unsharded (all-gathered) FSDP parameter: MixedPrecision's param_dtype."""
    return 2 if precision in ("bf16-mixed", "fp16-mixed") else storage_bytes(precision)


@dataclass(frozen=True)
class Sharding:
    """How FSDP splits a unit: over how many ranks, and whether at all."""

    kind: str  # "none" (single/ddp), "no-shard", "full", "grad-op", "hybrid"
    group: int  # ranks that split one replica (1 when nothing is split)
    pad_to: int  # the process-group size the flat parameter is padded to

    @property
    def fsdp(self) -> bool:
        return self.kind != "none"

    @property
    def sharded(self) -> bool:
        return self.kind in ("full", "grad-op", "hybrid")


def sharding(strategy: Strategy, world: int) -> Sharding:
    strategy.check_world(world)
    if not strategy.is_fsdp:
        return Sharding("none", 1, 1)
    if strategy.sharding == "hybrid" and strategy.group == 1:
        # parallel.wrap_fsdp runs hybrid1 as NO_SHARD over the world (FSDP1's own
        # hybrid-of-one drops the cross-replica all-reduce): padded to the world.
        return Sharding("no-shard", 1, world)
    if strategy.sharding == "hybrid":
        return Sharding("hybrid", int(strategy.group or 1), int(strategy.group or 1))
    if strategy.sharding == "no-shard":
        return Sharding("no-shard", 1, world)
    return Sharding(str(strategy.sharding), world, world)


@dataclass(frozen=True)
class FlatLayout:
    """One unit's flat parameter: where each parameter starts, and the padded total."""

    offsets: tuple[int, ...]  # start of each parameter in unit.params order
    total: int  # padded numel F (a multiple of pad_to)

    def chunk(self, shard: Sharding) -> int:
        return self.total // shard.group if shard.sharded else self.total


def flat_layout(unit: UnitLayout, aligned_numel: int, pad_to: int) -> FlatLayout:
    """FSDP1's ``_init_flat_param_and_metadata`` with ``align_addresses=True``."""
    offsets = []
    total = 0
    for p in unit.params:
        if aligned_numel > 0 and total % aligned_numel:
            total += aligned_numel - total % aligned_numel
        offsets.append(total)
        total += p.numel
    if total % pad_to:
        total += pad_to - total % pad_to
    return FlatLayout(tuple(offsets), total)


def aligned_numel(precision: str) -> int:
    return ALIGN_BYTES // fsdp_param_bytes(precision)


def _local_trainable(unit: UnitLayout, layout: FlatLayout, shard: Sharding, index: int) -> int:
    """Trainable elements of ``unit`` inside chunk ``index`` (all of them when unsharded)."""
    if not shard.sharded:
        return unit.trainable_numel
    size = layout.total // shard.group
    lo, hi = index * size, (index + 1) * size
    n = 0
    for p, off in zip(unit.params, layout.offsets):
        if p.trainable:
            n += max(0, min(hi, off + p.numel) - max(lo, off))
    return n


def static_bytes_for(inv: Inventory, strategy: Strategy, precision: str, world: int, rank: int | None = None) -> dict[str, int]:
    """Bytes of params / grads / optimizer states on ``rank`` (None: the largest over ranks)."""
    s = storage_bytes(precision)
    shard = sharding(strategy, world)
    if not shard.fsdp:
        return {"params": inv.numel * s, "grads": inv.trainable_numel * s, "optimizer": 2 * inv.trainable_numel * s}
    ranks = range(shard.group) if rank is None else [rank % shard.group]
    align = aligned_numel(precision)
    # Every layer unit has the same layout, hence the same chunk boundaries: count each
    # distinct unit once, times how often it occurs.
    counts: dict[UnitLayout, int] = {}
    for u in inv.units():
        counts[u] = counts.get(u, 0) + 1
    layouts = {u: flat_layout(u, align, shard.pad_to) for u in counts}
    best: dict[str, int] | None = None
    for r in ranks:
        params = grads = opt = 0
        for u, n in counts.items():
            local = layouts[u].chunk(shard)
            params += n * local * s
            grads += n * local * s if u.requires_grad else 0
            opt += n * 2 * s * _local_trainable(u, layouts[u], shard, r)
        cur = {"params": params, "grads": grads, "optimizer": opt}
        if best is None or sum(cur.values()) > sum(best.values()):
            best = cur
    assert best is not None
    return best


def static_bytes_per_rank(spec: RunSpec, world: int, rank: int | None = None) -> dict[str, int]:
    """Exact device bytes of parameters, gradients and AdamW states on one rank.

    ``rank=None`` gives the rank with the most (the last chunk holds the padding,
    so ranks can differ by a few elements). Raises SpecError for a world the
    strategy cannot run on.
    """
    if world < 1:
        raise SpecError(f"world size must be >= 1, got {world}")
    return static_bytes_for(inventory(spec.model), spec.strategy, spec.precision, world, rank)
