"""Parameters, gradients and AdamW states per rank, exactly, padding included.

What each strategy keeps on a rank *between* steps (after ``optimizer.step()``, before
``zero_grad``) for the runner's exact setup: ``single``/``ddp`` whole, FSDP1 as chunks of
each unit's padded flat parameter, FSDP2 as padded per-parameter shards
(:func:`fsdp2_padded`). DDP's buckets and every transient belong to the timeline
(:mod:`.memory`). Why: docs/planner-internals.md, "1. Parameters, exactly" and "FSDP2".
"""

from __future__ import annotations

from dataclasses import dataclass

from scaleladder.planner.inventory import Inventory, ParamInfo, UnitLayout, fsdp1_units, inventory
from scaleladder.spec import RunSpec, SpecError, Strategy

ALIGN_BYTES = 16  # torch.distributed.fsdp._flat_param._get_aligned_numel
# TRAP, the ``step`` counters: fused AdamW keeps each parameter's ``step`` as a 0-dim fp32
# tensor ON THE PARAMETER'S DEVICE (torch/optim/adam.py ``_init_group``: ``device=p.device if
# capturable or fused``); foreach and for-loop AdamW keep it on the host. So there is one
# small device tensor per trainable parameter tensor with elements on the rank (FSDP gives a
# parameter outside the local chunk no gradient, so no state). Each holds 4 bytes, but the
# caching allocator rounds every allocation up to ALLOC_BLOCK_BYTES: static_bytes_for counts
# ``counter_bytes`` per counter, 4 by default (what the storages hold, what the exact CPU
# test sums), ALLOC_BLOCK_BYTES in the timeline, whose peak is the allocator's active_bytes.
# (No other allocation is rounded: states are KB to GB, rounding is left to FRAGMENTATION.)
STEP_COUNTER_BYTES = 4  # fused AdamW's per-parameter `step`: a 0-dim fp32 tensor on the parameter's device
ALLOC_BLOCK_BYTES = 512  # CUDA/HIP caching allocator: kMinBlockSize, every allocation is a multiple of it


def storage_bytes(precision: str) -> int:
    """Bytes per element of parameters and gradients (the model's storage dtype)."""
    return 2 if precision == "bf16-true" else 4


def state_bytes(precision: str) -> int:
    """Optimizer state per trainable element: fp32 exp_avg + exp_avg_sq (+ the fp32 master under bf16-true)."""
    return 12 if precision == "bf16-true" else 8


def step_transient_bytes(precision: str) -> int:
    """Bytes per trainable element the runner's optimizer step allocates and frees again.

    Fused AdamW updates in place: 0. bf16-true's ``MasterWeightAdamW.step`` first gives every
    master an fp32 copy of its gradient (all of them before the fused step, freed after the
    masters are rounded back into the bf16 parameters): 4.
    """
    return 4 if precision == "bf16-true" else 0


def fsdp_param_bytes(precision: str) -> int:
    """Bytes per element of an unsharded (all-gathered) FSDP parameter: MixedPrecision's param_dtype."""
    return 2 if precision in ("bf16-mixed", "fp16-mixed") else storage_bytes(precision)


@dataclass(frozen=True)
class Sharding:
    """How FSDP splits a unit: over how many ranks, and whether at all."""

    kind: str  # "none" (single/ddp), "no-shard", "full", "grad-op", "hybrid"; FSDP2: "fsdp2-<sharding>"
    group: int  # ranks that split one replica (1 when nothing is split)
    pad_to: int  # the process-group size the flat parameter is padded to (FSDP1; 1 for FSDP2)
    fsdp2: bool = False  # fully_shard: every parameter sharded on its own (see fsdp2_local)

    @property
    def fsdp(self) -> bool:
        return self.kind != "none"

    @property
    def sharded(self) -> bool:
        return self.fsdp2 or self.kind in ("full", "grad-op", "hybrid")

    @property
    def reshard_after_forward(self) -> bool:
        """Are a layer unit's parameters freed after its forward (all but SHARD_GRAD_OP / fsdp2-grad-op)?"""
        return self.kind not in ("grad-op", "fsdp2-grad-op")


def sharding(strategy: Strategy, world: int) -> Sharding:
    strategy.check_world(world)
    # A -compile rung is planned as its eager rung: the same parameters, gradients, states and
    # units (rung.parallelize._compile_blocks compiles each block inside them), and the eager rung's
    # activations as an UPPER BOUND (inductor's partitioner saves no more than eager in the
    # common case, often fewer; plan --json says `memory_model`).
    if strategy.is_fsdp2:
        # fully_shard always shards, over the mesh's shard dimension: the world, or the g
        # ranks of an HSDP row (hybrid1 included: shards of the whole parameter, replicated).
        g = int(strategy.group or 1) if strategy.sharding == "hybrid" else world
        return Sharding("fsdp2-" + str(strategy.sharding), g, 1, fsdp2=True)
    if not strategy.is_fsdp:
        return Sharding("none", 1, 1)
    if strategy.sharding == "hybrid" and strategy.group == 1:
        # rung.parallelize.wrap_fsdp runs hybrid1 as NO_SHARD over the world (FSDP1's own
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


def aligned_numel(precision: str, orig_params: bool = True) -> int:
    """FSDP1 starts each parameter on a 16-byte boundary only with use_orig_params
    (torch ``FlatParamHandle``: ``align_addresses = use_orig_params``); else it packs them."""
    return ALIGN_BYTES // fsdp_param_bytes(precision) if orig_params else 0


def fsdp1_use_orig_params(strategy: Strategy) -> bool:
    """Does ``rung.parallelize.wrap_fsdp`` build this FSDP1 rung with ``use_orig_params=True``?

    No, the FLAVA seed's default, except under ``-ac-reentrant``: there, with bf16-mixed's
    MixedPrecision and FLAVA's two passes per step, FSDP1's flat-parameter path gave a
    different loss from the second step on (flava-debug, 2 gloo ranks: 14.24 against
    14.81 for the same rung without AC); with use_orig_params it matches
    (docs/strategies.md, "use_orig_params")."""
    return strategy.reentrant


@dataclass(frozen=True)
class LocalCounts:
    """What one rank holds between steps, in elements and tensors (bytes: :func:`bytes_of`)."""

    params: int  # parameter elements stored (FSDP: the flat chunks, padding and frozen parts included)
    grads: int  # gradient elements stored
    trainable: int  # trainable elements the optimizer keeps state for (and steps)
    tensors: int  # trainable parameter tensors with elements on this rank: one fused-AdamW step counter each


def _local_trainable(unit: UnitLayout, layout: FlatLayout, shard: Sharding, index: int) -> tuple[int, int]:
    """(trainable elements, trainable tensors with any) of ``unit`` in chunk ``index`` (all when unsharded)."""
    if not shard.sharded:
        sizes = [p.numel for p in unit.params if p.trainable]
    else:
        size = layout.total // shard.group
        lo, hi = index * size, (index + 1) * size
        sizes = [max(0, min(hi, off + p.numel) - max(lo, off)) for p, off in zip(unit.params, layout.offsets) if p.trainable]
    # A parameter with no element in this chunk gets no gradient from FSDP (_use_sharded_grad_views),
    # so the optimizer makes no state, and no step counter, for it on this rank.
    sizes = [n for n in sizes if n > 0]
    return sum(sizes), len(sizes)


def bytes_of(c: LocalCounts, precision: str, counter_bytes: int = STEP_COUNTER_BYTES) -> dict[str, int]:
    """Bytes of params / grads / optimizer state (moments, masters, ``counter_bytes`` per step counter)."""
    s = storage_bytes(precision)
    return {"params": c.params * s, "grads": c.grads * s,
            "optimizer": c.trainable * state_bytes(precision) + c.tensors * counter_bytes}


def local_counts(inv: Inventory, strategy: Strategy, precision: str, world: int, rank: int | None = None,
                 counter_bytes: int = STEP_COUNTER_BYTES, frozen_units: bool = True) -> LocalCounts:
    """What ``rank`` holds (None: the rank with the most bytes, counters at ``counter_bytes``).
    ``frozen_units``: FSDP1 gives FLAVA's frozen heads units of their own (the runner; the
    FLAVA seed's code kept them in the root, step_setup.Variant)."""
    shard = sharding(strategy, world)
    if not shard.fsdp:
        tensors = sum(1 for u in inv.units() for p in u.params if p.trainable)
        return LocalCounts(inv.numel, inv.trainable_numel, inv.trainable_numel, tensors)
    if shard.fsdp2:
        return _fsdp2_local_counts(inv, shard, precision, rank, counter_bytes)
    ranks = range(shard.group) if rank is None else [rank % shard.group]
    inv = fsdp1_units(inv) if frozen_units else inv
    orig = fsdp1_use_orig_params(strategy)
    align = aligned_numel(precision, orig)
    # Every layer unit has the same layout, hence the same chunk boundaries: count each
    # distinct unit once, times how often it occurs.
    counts: dict[UnitLayout, int] = {}
    for u in inv.units():
        counts[u] = counts.get(u, 0) + 1
    layouts = {u: flat_layout(u, align, shard.pad_to) for u in counts}
    best: LocalCounts | None = None
    for r in ranks:
        params = grads = trainable = tensors = 0
        for u, n in counts.items():
            local = layouts[u].chunk(shard)
            params += n * local
            grads += n * local if u.requires_grad else 0
            # Without use_orig_params the optimizer steps each trainable unit's FlatParameter:
            # state for its whole local chunk, padding included, and one step counter.
            t, k = _local_trainable(u, layouts[u], shard, r) if orig else (local, 1) if u.requires_grad else (0, 0)
            trainable, tensors = trainable + n * t, tensors + n * k
        cur = LocalCounts(params, grads, trainable, tensors)
        if best is None or sum(bytes_of(cur, precision, counter_bytes).values()) > sum(bytes_of(best, precision, counter_bytes).values()):
            best = cur
    assert best is not None
    return best


def fsdp2_padded(p: ParamInfo, g: int) -> int:
    """Elements of ``p``'s padded FSDP2 shard: ceil(rows / g) rows, on EVERY rank.

    torch 2.14 ``FSDPParam._init_sharded_param``: ``chunks = _chunk_with_empty(param, g,
    dim=0)``; ``padded_sharded_size = chunks[0].size()`` ("0th always padded");
    ``padded_sharded_param = param_data.new_zeros(padded_sharded_size)`` and the local
    shard is copied into its front; ``_sharded_param_data`` is that padded storage and the
    DTensor's local tensor a ``narrow`` of it. So every rank ALLOCATES ceil(rows/g) rows of
    every parameter, even a rank whose real chunk is short or empty (a (1, N, H) position
    embedding is held whole by every rank). The reduce-scatter output, hence the sharded
    gradient, is laid out with the same padded sizes (``foreach_reduce``).
    """
    rows = p.rows
    return -(-rows // g) * (p.numel // rows)


def fsdp2_real(p: ParamInfo, g: int, index: int) -> int:
    """Elements of ``p`` that really belong to shard ``index`` (what ``to_local()``'s shape says)."""
    rows = p.rows
    per = -(-rows // g)
    return max(0, min(per, rows - index * per)) * (p.numel // rows)


def _fsdp2_local_counts(inv: Inventory, shard: Sharding, precision: str, rank: int | None,
                        counter_bytes: int) -> LocalCounts:
    """FSDP2 (``fully_shard``): per-parameter Shard(0), no flat parameter, no alignment.

    * params: the padded shard of every parameter (:func:`fsdp2_padded`), frozen ones too;
    * grads: the padded shard of every TRAINABLE parameter only — FSDP2 reduce-scatters the
      parameters that have a gradient (FSDP1 reduces its whole flat gradient, frozen
      parts included);
    * optimizer: AdamW's states are ``zeros_like`` of the DTensor, i.e. of the local
      (narrowed, unpadded) tensor: the real elements of this rank's chunk; bf16-true's
      masters are ``to_local().float()``, the same. One step counter per trainable
      parameter, even one whose local chunk is empty (it still gets a DTensor gradient).
    """
    g = shard.group
    counts: dict[UnitLayout, int] = {}
    for u in inv.units():
        counts[u] = counts.get(u, 0) + 1
    params = sum(n * sum(fsdp2_padded(p, g) for p in u.params) for u, n in counts.items())
    grads = sum(n * sum(fsdp2_padded(p, g) for p in u.params if p.trainable) for u, n in counts.items())
    tensors = sum(n * sum(1 for p in u.params if p.trainable) for u, n in counts.items())
    ranks = range(g) if rank is None else [rank % g]
    trainable = max(sum(n * sum(fsdp2_real(p, g, r) for p in u.params if p.trainable) for u, n in counts.items())
                    for r in ranks)  # rank 0 holds the most: every chunk of it is full
    return LocalCounts(params, grads, trainable, tensors)


def static_bytes_for(inv: Inventory, strategy: Strategy, precision: str, world: int, rank: int | None = None,
                     counter_bytes: int = STEP_COUNTER_BYTES) -> dict[str, int]:
    """Bytes of params / grads / optimizer states on ``rank`` (None: the largest over ranks).

    ``counter_bytes`` per fused-AdamW step counter: 4 (storage) or :data:`ALLOC_BLOCK_BYTES` (allocator).
    """
    return bytes_of(local_counts(inv, strategy, precision, world, rank, counter_bytes), precision, counter_bytes)


def static_bytes_per_rank(spec: RunSpec, world: int, rank: int | None = None) -> dict[str, int]:
    """Exact bytes of the storages of parameters, gradients and optimizer state on one rank.

    ``optimizer`` is the runner's fused AdamW: moments (and bf16-true's fp32 masters)
    plus 4 bytes per ``step`` counter — what the tensors hold; on a GPU the caching
    allocator makes each counter a 512-byte block (the timeline counts that).
    ``rank=None`` gives the rank with the most (the last chunk holds the padding,
    so ranks can differ by a few elements). Raises SpecError for a world the
    strategy cannot run on.
    """
    if world < 1:
        raise SpecError(f"world size must be >= 1, got {world}")
    return static_bytes_for(inventory(spec.model), spec.strategy, spec.precision, world, rank)
