"""What the planner knows about a rung's step before it picks a batch: its units' sizes,
its forward passes and backward order, its resident bytes, and the seeds' counterfactual
switches (:class:`Variant`). :mod:`scaleladder.planner.timeline` replays the step from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from scaleladder.flavors import Flavor, get_flavor
from scaleladder.models.batch_layout import SYNTHETIC_POOL
from scaleladder.models.flava_impl import DEFAULT as FLAVA_DEFAULT
from scaleladder.models.flava_impl import parse_flava_impl
from scaleladder.planner.activations import Call, backward_order, forward_passes
from scaleladder.planner.inventory import Inventory, fsdp1_units, inventory, layer_units
from scaleladder.planner.static import (
    ALLOC_BLOCK_BYTES,
    LocalCounts,
    Sharding,
    aligned_numel,
    bytes_of,
    flat_layout,
    fsdp1_use_orig_params,
    fsdp2_padded,
    fsdp_param_bytes,
    local_counts,
    sharding,
    storage_bytes,
)
from scaleladder.spec import AnyKnobs, Strategy, check_unit_knobs


@dataclass(frozen=True)
class InputBatches:
    """Input batches on the device: all step long, and one more for a moment between steps."""

    resident: int
    at_step_start: int = 0


def input_batches(data: str) -> InputBatches:
    """How the runner holds its inputs for ``--data`` (``synthetic``, else a shard loader).

    Synthetic: the pool, made on the device up front and cycled. A loader: rung.loop.train_loop
    copies each host batch to the device (``non_blocking``) at the top of a step, while the
    variable still holds the previous step's batch — two for a moment, then one for the
    whole forward, backward and optimizer step (nothing prefetches onto the device).
    """
    return InputBatches(SYNTHETIC_POOL) if data == "synthetic" else InputBatches(1, 1)


ADAMW_IMPLS = ("fused", "foreach", "for-loop")  # Variant.adamw


@dataclass(frozen=True)
class Variant:
    """Counterfactuals for explaining a disagreement with a seed — NOT the runner's setup.

    The default is exactly what scaleladder's runner does. Each field switches one
    mechanism to what a seed's code did instead, so a test can show which difference
    moves a prediction across the line (docs/planner.md, "Seed claims").
    """

    # FLAVA runs each encoder layer twice. With NON-reentrant AC (ours) or no AC, FSDP1's
    # post-backward hook fires once per unit per backward, after BOTH passes: the unit stays
    # gathered with an unsharded gradient in between. The FLAVA seed used REENTRANT AC under
    # FSDP, whose nested backward runs the hook once per pass (torch's FSDP permits this):
    # False models that. (A rung's own -ac-reentrant strategy does the same, without a Variant.)
    gather_across_passes: bool = True
    # Bytes of an all-gathered parameter. The FLAVA seed left MixedPrecision's param_dtype
    # unset ("not working" in its train.py), so it gathered fp32: 4. None = the precision's.
    gathered_param_bytes: int | None = None
    # Text length of the FLAVA batches (the seed's text-only MLM batches were 512 tokens).
    text_len: int | None = None
    # DDP's gradient_as_bucket_view. Ours is DDP's default, False: the buckets are a second
    # copy of the gradients, resident all run. The FLAVA seed's train.py set it True: the
    # gradients ARE views into the buckets, one copy.
    bucket_view: bool = False
    # Which AdamW implementation steps the parameters. Ours (scaleladder.rung.optim.make_optimizer):
    # "fused", in every precision — in place, no temporaries, its `step` counters are device
    # tensors (512 B blocks each). "foreach" (torch 2.x's default on GPUs when neither
    # foreach nor fused is given) allocates sqrt(exp_avg_sq) for every state at once: 4 more
    # bytes per trainable element in the step; counters on the host. "for-loop" (torch <= 1.13's
    # default — the FLAVA seed's code, written Aug–Oct 2022 for "PyTorch 1.13 or nightly") steps
    # one tensor at a time: `exp_avg_sq.sqrt() / c` holds two temporaries of that tensor, so
    # 2 × 4 bytes × its largest tensor; counters on the host.
    adamw: str = "fused"
    # FSDP1: FLAVA's unused heads and poolers frozen, each a unit of its own (ours, because a
    # FlatParameter cannot mix frozen and trained parameters). The FLAVA seed trained them in
    # the root unit: False keeps them there (its state for them is still not modelled).
    frozen_units: bool = True
    # Which FLAVA the rung builds (models/flava_impl.py): ours is `sdpa` (fused attention, the
    # twin encoder passes batched, sync-free losses), what `scaleladder run` builds by default.
    # The seeds ran TorchMultimodal's own modules: "torchmultimodal" (also `--flava-impl`'s other value).
    flava_impl: str = FLAVA_DEFAULT

    def __post_init__(self) -> None:
        if self.adamw not in ADAMW_IMPLS:
            raise ValueError(f"Variant.adamw must be one of {ADAMW_IMPLS}, got {self.adamw!r}")
        parse_flava_impl(self.flava_impl)

    @property
    def foreach_temp(self) -> bool:
        """Does the optimizer step allocate foreach AdamW's sqrt(exp_avg_sq) temporaries?"""
        return self.adamw == "foreach"


RUNNER = Variant()


@dataclass(frozen=True)
class StepSetup:
    """Everything about a rung that does not depend on the batch."""

    inv: Inventory
    strategy: Strategy
    precision: str
    knobs: AnyKnobs  # FSDP1's Knobs, or Fsdp2Knobs for fsdp2-*
    world: int
    passes: list[list[Call]]
    backward: list[Call]
    static: dict[str, int]  # bytes at the allocator level: step counters as 512-byte blocks
    local: LocalCounts  # what the busiest rank holds, in elements: the optimizer step's transients scale with it
    unit_full: dict[str, int]  # unsharded flat numel per unit kind ("root", "layer", "codebook")
    unit_chunk: dict[str, int]  # local chunk numel per unit kind
    grad_full: dict[str, int]  # unsharded gradient numel per unit kind (FSDP1: the flat F; FSDP2: trainable params, padded)
    grad_chunk: dict[str, int]  # its local chunk
    variant: Variant = RUNNER
    inputs: InputBatches = InputBatches(SYNTHETIC_POOL)
    # FSDP2's units of k layers (knobs -u<k>): layer unit id -> the layers it holds, for a unit of
    # more than one; the calls of ``passes`` and ``backward`` then name their unit, not their layer.
    # unit_full/unit_chunk/grad_full/grad_chunk stay per LAYER: a unit's gather is n of them.
    unit_layers: dict[int, int] = field(default_factory=dict)

    def layers_in(self, unit: int | None) -> int:
        """Layers in layer unit ``unit`` (1: a unit per layer, the default)."""
        return self.unit_layers.get(unit, 1) if unit is not None else 1


def lowp_params(fsdp: bool, precision: str, variant: Variant) -> bool:
    """Does FSDP gather the parameters in the autocast dtype (bf16 residual stream)?"""
    return fsdp and (variant.gathered_param_bytes or fsdp_param_bytes(precision)) < storage_bytes(precision)


def step_setup(model: str | Flavor, strategy: Strategy, precision: str, knobs: AnyKnobs, world: int,
               variant: Variant = RUNNER, inputs: InputBatches = InputBatches(SYNTHETIC_POOL)) -> StepSetup:
    flavor = get_flavor(model) if isinstance(model, str) else model
    inv = inventory(flavor)
    if variant.text_len is not None:
        flavor = dataclasses.replace(flavor, text_len=variant.text_len)  # activations only: parameters are unchanged
    shard = sharding(strategy, world)
    if shard.fsdp and not shard.fsdp2 and variant.frozen_units:
        inv = fsdp1_units(inv)  # FSDP1's frozen heads are units of their own (rung.parallelize.wrap_fsdp)
    passes = forward_passes(flavor, precision, strategy.ac, lowp_params(shard.fsdp, precision, variant), strategy.selective,
                            variant.flava_impl)
    check_unit_knobs(strategy, knobs)  # k > 1 on FSDP2 only
    unit_layers: dict[int, int] = {}
    if knobs.unit_layers > 1:
        passes, unit_layers = _grouped(passes, layer_units(flavor, knobs))
    full, chunk, grad_full, grad_chunk = _unit_sizes(inv, shard, aligned_numel(precision, fsdp1_use_orig_params(strategy)))
    # Fused AdamW's step counters are device tensors, each a whole allocator block; the
    # other implementations keep them on the host (not device memory at all).
    counter = ALLOC_BLOCK_BYTES if variant.adamw == "fused" else 0
    local = local_counts(inv, strategy, precision, world, counter_bytes=counter, frozen_units=variant.frozen_units)
    return StepSetup(inv, strategy, precision, knobs, world, passes, backward_order(flavor, passes),
                     bytes_of(local, precision, counter), local, full, chunk, grad_full, grad_chunk, variant, inputs,
                     unit_layers)


def _grouped(passes: list[list[Call]], units: list[list[int]]) -> tuple[list[list[Call]], dict[int, int]]:
    """The passes with each layer call naming its unit of k layers (:func:`inventory.layer_units`),
    and the layers of each unit. The calls of one unit run one after the other in every pass, so
    the timeline's spans (a unit's gather, its reduce) cover the k layers at once."""
    unit_of = {layer: u for u, members in enumerate(units) for layer in members}
    called = {c.unit for p in passes for c in p if c.is_layer and c.unit is not None}
    if not called <= set(unit_of):
        raise AssertionError(f"layer calls {sorted(x for x in called if x not in unit_of)} are in no unit of {units}")
    regrouped = [[dataclasses.replace(c, unit=unit_of[c.unit]) if c.is_layer and c.unit is not None else c for c in p]
                 for p in passes]
    return regrouped, {u: len(members) for u, members in enumerate(units)}


SizesByKind = dict[str, int]


def _unit_sizes(inv: Inventory, shard: Sharding,
                align: int) -> tuple[SizesByKind, SizesByKind, SizesByKind, SizesByKind]:
    """Per unit kind, in elements: (unsharded parameters, local chunk, unsharded gradient, its chunk).
    ``align``: FSDP1's per-parameter alignment in elements (static.aligned_numel)."""
    full: SizesByKind = {}
    chunk: SizesByKind = {}
    grad_full: SizesByKind = {}
    grad_chunk: SizesByKind = {}
    for u in (inv.root, inv.layer, inv.codebook):
        if u is None:
            continue
        if shard.fsdp2:
            # No flat parameter: each parameter is padded to ceil(rows/g) rows per rank; the
            # all-gather output and the unsharded parameters keep that padding (g × shard).
            chunk[u.kind] = sum(fsdp2_padded(p, shard.group) for p in u.params)
            grad_chunk[u.kind] = sum(fsdp2_padded(p, shard.group) for p in u.params if p.trainable)
            full[u.kind], grad_full[u.kind] = chunk[u.kind] * shard.group, grad_chunk[u.kind] * shard.group
            continue
        if shard.fsdp:
            lay = flat_layout(u, align, shard.pad_to)
            full[u.kind], chunk[u.kind] = lay.total, lay.chunk(shard)
        else:
            full[u.kind] = chunk[u.kind] = u.numel
        grad_full[u.kind], grad_chunk[u.kind] = full[u.kind], chunk[u.kind]
    return full, chunk, grad_full, grad_chunk
