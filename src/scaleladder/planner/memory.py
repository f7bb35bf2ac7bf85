"""Replay one training step as a timeline of allocations; its maximum is the peak.

The step is the runner's (rung.loop.train_loop, scaleladder.rung.optim): forward under autocast,
backward, the optimizer step (a FUSED AdamW in every precision; under fp16-mixed through
the GradScaler: ``unscale_`` in place, then the fused step), ``zero_grad(set_to_none=True)``.
Between steps a rank holds its parameters, optimizer state (moments, bf16-true's fp32
masters, one step counter per trainable tensor), DDP's gradient buckets and its input
batches (the synthetic pool, or the loader's current batch). On top of that the timeline
adds, moment by moment:

forward   activations saved / held by each call; FSDP's all-gathered (unsharded)
          units — the root for the whole step, a layer unit while it runs (at most
          two in flight with ``limit_all_gathers``), every unit until its backward
          under SHARD_GRAD_OP; autocast's cached bf16 weight copies (single/DDP;
          with AC freed when autocast exits, then one layer's again per recompute).
backward  calls in autograd's order, freeing their saved tensors; a unit's gradient
          appears at its FIRST backward touch and, under FSDP, the unit stays
          all-gathered (with an unsharded gradient) until its LAST touch, when it is
          reduced (fp32 copy + reduce-scatter output) and resharded. FLAVA runs each
          encoder layer twice, so every image/text unit stays gathered from the masked
          pass's backward to the unmasked pass's — the dominant FSDP term for FLAVA.
optimizer fused AdamW updates in place: nothing extra, except under bf16-true, where every
          fp32 master first gets an fp32 copy of its gradient (4 B per trainable
          element, freed once the masters are rounded back into the bf16 parameters).
          (The seeds' optimizers, as Variants: foreach AdamW's ``sqrt(v)`` for every
          state at once; the for-loop AdamW's two temporaries of its largest tensor.)
FSDP2     (``fsdp2-*``, the ``f2`` branches) as FSDP1 but: padded per-parameter sizes (no flat
          parameter); a copy-out moment per gathered unit (flat all-gather output + the
          unsharded parameters); ``pf`` explicit prefetch in forward, max(1, pf) in backward;
          a unit regathered and resharded per backward PASS, its unsharded gradient (param
          dtype) held from its first pass to its last, reduced once; the fp32 reduce-scatter
          input kept until the next unit's reduce; FLAVA's codebook regathered in backward.
          See docs/planner.md, "FSDP2".
step start a loader's next batch is copied to the device while the previous one is
          still referenced (never the peak in practice, but counted).

The peak is the largest of these moments. It is what ``torch.cuda`` reports as
``active_bytes.all.peak``. Whether it FITS adds what the allocator does not count
(CUDA/HIP context, NCCL/RCCL buffers) and a fragmentation margin: see
:data:`CONTEXT_BYTES`, :data:`COMM_LIB_BYTES`, :data:`FRAGMENTATION`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scaleladder.models.batch_layout import SYNTHETIC_POOL
from scaleladder.models.flavors import Flavor, get_flavor
from scaleladder.planner.activations import (
    Call,
    backward_order,
    codebook_transient,
    dtypes,
    forward_passes,
    input_bytes,
)
from scaleladder.planner.inventory import Inventory, inventory
from scaleladder.planner.static import (
    ALLOC_BLOCK_BYTES,
    LocalCounts,
    aligned_numel,
    bytes_of,
    flat_layout,
    fsdp2_padded,
    fsdp_param_bytes,
    local_counts,
    sharding,
    step_transient_bytes,
    storage_bytes,
)
from scaleladder.spec import AnyKnobs, Fsdp2Knobs, Knobs, RunSpec, SpecError, Strategy

GIB = 2**30


@dataclass(frozen=True)
class Device:
    """A device to plan for: a name and the memory PyTorch reports for it (None: unlimited)."""

    name: str
    capacity_bytes: int | None

# Usable device memory: the total capacity PyTorch reports for one rank's device
# (torch.cuda.get_device_properties().total_memory), as printed in its OOM messages:
# "39.59 GiB total capacity" (A100 40GB), "79.15 GiB" (A100 80GB), 79.1–79.3 GiB for
# H100 80GB (driver/ECC dependent; we take the low end), "139.80 GiB" (H200),
# "63.98 GiB" (one MI250X GCD under ROCm). ``cpu`` is unlimited.
DEVICES: dict[str, int | None] = {
    "a100-40gb": int(39.59 * GIB),
    "a100-80gb": int(79.15 * GIB),
    "h100-80gb": int(79.10 * GIB),
    "h200-141gb": int(139.80 * GIB),
    "mi250x-gcd": int(63.98 * GIB),
    "cpu": None,
}

# Calibration constants (no GPU in this repository's CI: these are ESTIMATES, to be refit
# from measured rungs — see docs/planner.md, "Calibration").
CONTEXT_BYTES = int(0.5 * GIB)  # CUDA/HIP context + kernels: outside the caching allocator
COMM_LIB_BYTES = int(0.5 * GIB)  # NCCL/RCCL channel buffers when world > 1: also outside it
FRAGMENTATION = 0.05  # reserved/active − 1 in steady state: the allocator's rounding and splitting


@dataclass(frozen=True)
class Overheads:
    """What must fit beyond the allocator's peak: a fraction of it, and fixed bytes.

    The calibrated values are the constants above; the seed comparison scales them
    (``scaled``) to show which verdicts hang on them (docs/planner.md, "Sensitivity").
    """

    fragmentation: float = FRAGMENTATION
    context_bytes: float = CONTEXT_BYTES
    comm_lib_bytes: float = COMM_LIB_BYTES

    def scaled(self, k: float) -> "Overheads":
        return Overheads(self.fragmentation * k, self.context_bytes * k, self.comm_lib_bytes * k)

    def fixed(self, world: int) -> float:
        return self.context_bytes + (self.comm_lib_bytes if world > 1 else 0)


CALIBRATED = Overheads()



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


MAX_BATCH_LIMIT = 1 << 16


@dataclass
class Prediction:
    """The planner's verdict for one rung on one device."""

    spec: str
    device: str
    world: int
    ranks_per_node: int
    batch: int | None  # local batch the peak is for (None when the spec says 'max' and nothing fits)
    data: str  # 'synthetic' or a loader: how many input batches sit on the device
    peak_bytes: int  # predicted torch.cuda active_bytes.all.peak on the busiest rank
    required_bytes: int  # peak + fragmentation + context + comm library: what must fit
    capacity_bytes: int | None  # the device's memory (None: unlimited)
    fits: bool
    max_batch: int | None  # the largest local batch that fits (None: unlimited device or nothing fits)
    phase: str  # where the peak happens: "forward", "backward:<call>", "optimizer", "codebook"
    breakdown: dict[str, int] = field(default_factory=dict)  # at the peak; sums to peak_bytes (+ overhead)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# -- the timeline ---------------------------------------------------------------------------


@dataclass
class _Timeline:
    parts: dict[str, float]
    peak: float = 0.0
    peak_parts: dict[str, float] = field(default_factory=dict)
    phase: str = ""

    def add(self, part: str, n: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + n

    def point(self, phase: str, **extra: float) -> None:
        """A candidate for the peak: the current state plus transients."""
        total = sum(self.parts.values()) + sum(extra.values())
        if total > self.peak:
            self.peak = total
            self.peak_parts = dict(self.parts)
            for k, v in extra.items():
                self.peak_parts[k] = self.peak_parts.get(k, 0.0) + v
            self.phase = phase


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

    def __post_init__(self) -> None:
        if self.adamw not in ADAMW_IMPLS:
            raise ValueError(f"Variant.adamw must be one of {ADAMW_IMPLS}, got {self.adamw!r}")

    @property
    def foreach_temp(self) -> bool:
        """Does the optimizer step allocate foreach AdamW's sqrt(exp_avg_sq) temporaries?"""
        return self.adamw == "foreach"


RUNNER = Variant()


@dataclass(frozen=True)
class _Setup:
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


def _lowp_params(fsdp: bool, precision: str, variant: Variant) -> bool:
    """Does FSDP gather the parameters in the autocast dtype (bf16 residual stream)?"""
    return fsdp and (variant.gathered_param_bytes or fsdp_param_bytes(precision)) < storage_bytes(precision)


def _setup(model: str | Flavor, strategy: Strategy, precision: str, knobs: AnyKnobs, world: int,
           variant: Variant = RUNNER, inputs: InputBatches = InputBatches(SYNTHETIC_POOL)) -> _Setup:
    f = get_flavor(model) if isinstance(model, str) else model
    inv = inventory(f)
    if variant.text_len is not None:
        f = dataclasses.replace(f, text_len=variant.text_len)  # activations only: parameters are unchanged
    shard = sharding(strategy, world)
    passes = forward_passes(f, precision, strategy.ac, _lowp_params(shard.fsdp, precision, variant))
    full: dict[str, int] = {}
    chunk: dict[str, int] = {}
    gfull: dict[str, int] = {}
    gchunk: dict[str, int] = {}
    for u in (inv.root, inv.layer, inv.codebook):
        if u is None:
            continue
        if shard.fsdp2:
            # No flat parameter: each parameter is padded to ceil(rows/g) rows per rank; the
            # all-gather output and the unsharded parameters keep that padding (g × shard).
            chunk[u.kind] = sum(fsdp2_padded(p, shard.group) for p in u.params)
            gchunk[u.kind] = sum(fsdp2_padded(p, shard.group) for p in u.params if p.trainable)
            full[u.kind], gfull[u.kind] = chunk[u.kind] * shard.group, gchunk[u.kind] * shard.group
            continue
        if shard.fsdp:
            lay = flat_layout(u, aligned_numel(precision), shard.pad_to)
            full[u.kind], chunk[u.kind] = lay.total, lay.chunk(shard)
        else:
            full[u.kind] = chunk[u.kind] = u.numel
        gfull[u.kind], gchunk[u.kind] = full[u.kind], chunk[u.kind]
    # Fused AdamW's step counters are device tensors, each a whole allocator block; the
    # other implementations keep them on the host (not device memory at all).
    counter = ALLOC_BLOCK_BYTES if variant.adamw == "fused" else 0
    local = local_counts(inv, strategy, precision, world, counter_bytes=counter)
    return _Setup(inv, strategy, precision, knobs, world, passes, backward_order(f, passes),
                  bytes_of(local, precision, counter), local, full, chunk, gfull, gchunk, variant, inputs)


def _simulate(st: _Setup, batch: int) -> _Timeline:
    inv, f = st.inv, st.inv.flavor
    shard = sharding(st.strategy, st.world)
    d = dtypes(st.precision, _lowp_params(shard.fsdp, st.precision, st.variant))
    s = storage_bytes(st.precision)
    pd = st.variant.gathered_param_bytes or fsdp_param_bytes(st.precision)
    mixed = d.mode == "mixed"
    B = batch

    one_batch = B * input_bytes(f, d)
    tl = _Timeline({"params": float(st.static["params"]), "optimizer": float(st.static["optimizer"]),
                    "grads": 0.0, "activations": 0.0, "buffers": float(inv.buffer_bytes),
                    "inputs": float(st.inputs.resident * one_batch)})
    # DDP's gradient buckets, allocated when DDP is built. With bucket views they are the
    # gradients themselves (counted as such); without, a second copy next to them.
    ddp_views = st.strategy.wrapper == "ddp" and st.variant.bucket_view
    if st.strategy.wrapper == "ddp":
        tl.add("grads" if ddp_views else "buffers", inv.trainable_numel * s)
    tl.point("step-start", inputs=st.inputs.at_step_start * one_batch)

    # Which units get all-gathered copies, and when.
    fsdp = shard.fsdp
    gathered = fsdp and (shard.sharded or pd != s)  # NO_SHARD gathers nothing unless it casts to bf16
    keep_after_fwd = fsdp and not shard.reshard_after_forward  # SHARD_GRAD_OP / fsdp2-grad-op keep units gathered
    f2 = shard.fsdp2
    pf = st.knobs.prefetch_layers if isinstance(st.knobs, Fsdp2Knobs) else 0
    k1 = st.knobs if isinstance(st.knobs, Knobs) else Knobs()  # FSDP1's knobs (defaults elsewhere)
    layer_copy = st.unit_full["layer"] * pd if gathered else 0.0
    root_copy = st.unit_full["root"] * pd if gathered else 0.0
    # Autocast's weight cache (single/DDP under bf16/fp16-mixed): a copy per trainable Linear/Conv.
    # (FSDP1/FSDP2 gather bf16 parameters, MixedPrecision's param_dtype: autocast casts nothing.)
    cast_layer = 2 * inv.layer.cast_numel if (mixed and not fsdp) else 0.0
    cast_root = 2 * inv.root.cast_numel if (mixed and not fsdp) else 0.0
    # TRAP (issue 22): a CHECKPOINTED layer saves none of its forward's tensors, its bf16 weight
    # copies included, so they live only in autocast's cache, which is cleared when the step's
    # autocast context exits: after the loss, BEFORE backward(). They are not held until the
    # layer's backward, as without AC. In backward each layer's recompute enters autocast again
    # (checkpoint restores it; cleared at its exit) and casts again: one layer's copies at a
    # time, saved by the recomputed matmuls until that layer's backward is done. The same for
    # non-reentrant and reentrant checkpointing (neither saves anything in forward). Measured
    # against torch's MemTracker on fake tensors, holding them overstated
    # flava-350m/single-ac/bf16-mixed b8 by 10.1% and vit-base/single-ac/bf16-mixed b32 by 5.4%.
    recast = bool(cast_layer) and st.strategy.ac
    cached = 0.0  # the layers' copies in autocast's cache during forward
    if f2:
        # FSDP2: foreach_all_gather gathers into ONE flat output, copied out into per-parameter
        # unsharded tensors. In forward, FSDP2 keeps that flat output (all_gather_state) until
        # the NEXT unit's wait_for_unshard, to overlap the copy-out with the next all-gather
        # (torch 2.14 FSDPParamGroup.wait_for_unshard): while a layer runs, its unsharded
        # parameters AND its flat output, plus the flat outputs of the pf layers prefetched
        # explicitly (pf0: none; FSDP2 gathers each unit when it is called).
        inflight_fwd = 2 + pf
        # Backward: FSDP2's implicit prefetch gathers the previous unit (one); pf2 two.
        prefetch_bwd = max(1, pf) * layer_copy if (gathered and not keep_after_fwd) else 0.0
    else:
        inflight_fwd = (2 if k1.limit_all_gathers else 4) + (1 if k1.forward_prefetch else 0)
        prefetch_bwd = layer_copy if (gathered and not keep_after_fwd and k1.backward_prefetch != "none") else 0.0
    # Backward frees the flat output right after the copy-out: a moment of one more copy.
    copy_out = layer_copy if f2 else 0.0

    # -- forward --------------------------------------------------------------------------
    if f2:
        tl.point("forward:gather-root", buffers=2 * root_copy)  # the root's flat output + its unsharded params
    tl.add("buffers", root_copy + cast_root)
    if f.family == "flava" and inv.codebook is not None:
        cb_copy = st.unit_full["codebook"] * pd if gathered else 0.0
        if f2:
            tl.point("forward:gather-codebook", buffers=2 * cb_copy)
        tl.point("codebook", activations=B * codebook_transient(f, d), buffers=cb_copy)
        cb_keep = f2 and gathered
        if cb_keep and keep_after_fwd:
            tl.add("buffers", cb_copy)  # fsdp2-grad-op: not resharded after its forward
    cb_keep, cb_copy = False, 0.0
    seen_fwd: set[int] = set()
    held = 0.0
    for p in st.passes:
        for c in p:
            extra = 0.0
            if c.is_layer and c.unit is not None and c.unit not in seen_fwd:
                seen_fwd.add(c.unit)
                if keep_after_fwd:
                    tl.add("buffers", layer_copy)
                tl.add("buffers", cast_layer)
                cached += cast_layer
            if c.is_layer and gathered and not keep_after_fwd:
                extra = inflight_fwd * layer_copy
            elif c.is_layer and keep_after_fwd:
                # FSDP1: the next unit, gathered while this one runs. FSDP2: this unit's held
                # flat all-gather output, plus the pf prefetched.
                extra = layer_copy * ((1 + pf) if f2 else 1)
            tl.point(f"forward:{c.name}", activations=B * c.fwd_transient, buffers=extra)
            tl.add("activations", B * (c.saved + c.held))
            held += B * c.held
    tl.point("forward:end")
    tl.add("activations", -held)
    if recast:
        tl.add("buffers", -cached)  # autocast exits before backward(): its cache is cleared

    # -- backward -------------------------------------------------------------------------
    order = st.backward
    last: dict[int | None, int] = {}
    for i, c in enumerate(order):
        last[c.unit if c.is_layer else None] = i
    # A unit's backward "span": from its first backward call to its last (ours), or — in
    # the reentrant-AC counterfactual — each call on its own (not for SHARD_GRAD_OP, whose
    # forward-gathered units are simply kept).
    # The rung -ac-reentrant (FSDP1's units inside the checkpoint wrappers) is that form, measured.
    reentrant = st.strategy.reentrant or not st.variant.gather_across_passes
    per_call = fsdp and not f2 and st.strategy.ac and reentrant and not keep_after_fwd
    touched: set[int | None] = set()
    reduced: set[int | None] = set()
    resharded: set[int | None] = set()
    rd = s  # FSDP2's reduce dtype: fp32 for the mixed precisions and fp32, bf16 under bf16-true
    rs_held = [0.0]  # FSDP2 keeps the last reduce-scatter input alive until the next unit's reduce

    def span_start(unit: int | None) -> None:
        kind = "root" if unit is None else "layer"
        u = inv.root if unit is None else inv.layer
        if f2:
            if unit is not None and gathered and (not keep_after_fwd or unit in resharded):
                tl.add("buffers", layer_copy)  # all-gathered again for this backward pass
                tl.point(f"backward:gather-{kind}", buffers=copy_out + prefetch_bwd)
            if u.requires_grad and unit not in touched:
                # Unsharded gradients, in param_dtype, from the unit's FIRST backward pass: the
                # unsharded parameter is one autograd leaf for both of FLAVA's passes, so autograd
                # holds the first pass's gradient until the second's arrives (AccumulateGrad runs
                # once), and the reduce-scatter happens once, at the last pass.
                tl.add("grads", st.grad_full[kind] * pd)
        elif fsdp:
            if unit is not None and gathered and not keep_after_fwd:
                tl.add("buffers", layer_copy)  # all-gathered again for backward
            if u.requires_grad:
                tl.add("grads", st.unit_full[kind] * pd)  # the unsharded gradient it accumulates
        elif unit not in touched and not ddp_views:
            tl.add("grads", u.trainable_numel * s)
        touched.add(unit)

    def span_end(unit: int | None, final: bool = True) -> None:
        kind = "root" if unit is None else "layer"
        u = inv.root if unit is None else inv.layer
        if f2:
            if u.requires_grad and final:
                # foreach_reduce: copy the unsharded gradients into a new flat reduce-scatter
                # input (reduce dtype, padded), reduce-scatter into a new output of one shard
                # (it becomes the sharded gradient, or is added to it and freed); the previous
                # unit's input is still held.
                rs_in, rs_out = st.grad_full[kind] * rd, st.grad_chunk[kind] * rd
                # The previous unit's input is freed first (reduce_scatter_max_input_buffers = 1).
                tl.point(f"backward:reduce-{kind}", buffers=rs_in + rs_out - rs_held[0])
                tl.add("grads", -st.grad_full[kind] * pd + (0 if unit in reduced else st.grad_chunk[kind] * s))
                tl.add("buffers", rs_in - rs_held[0])
                rs_held[0] = rs_in
                reduced.add(unit)
            if unit is not None and gathered:
                tl.add("buffers", -layer_copy)
                resharded.add(unit)
            return
        if fsdp:
            if u.requires_grad:
                comm = (st.unit_full[kind] * 4 if pd < 4 else 0) + (st.unit_chunk[kind] * 4 if shard.sharded else 0)
                tl.point(f"backward:reduce-{kind}", buffers=comm)
                tl.add("grads", -st.unit_full[kind] * pd + (0 if unit in reduced else st.unit_chunk[kind] * s))
                reduced.add(unit)
            if unit is not None and gathered:
                tl.add("buffers", -layer_copy)
        elif unit is not None and not recast:
            tl.add("buffers", -cast_layer)

    # FSDP2: a unit's post-backward hook is registered per forward CALL (on its inputs), so
    # each backward pass of a unit ends with a reshard and a reduce-scatter (accumulated into
    # the sharded gradient); FLAVA's second pass gathers it again. A span is a run of
    # consecutive backward calls of one unit.
    open_f2: set[int | None] = set()
    for i, c in enumerate(order):
        unit = c.unit if c.is_layer else None
        if f2:
            if unit is not None and unit not in open_f2:
                span_start(unit)
                open_f2.add(unit)
            elif unit is None and unit not in touched:
                span_start(None)
            touched.add(unit)
        elif unit not in touched or (per_call and unit is not None):
            span_start(unit)
        # under AC each layer CALL's recompute casts its weights again (freed after its backward:
        # FLAVA's two passes of a layer cast twice, never both at once)
        again = cast_layer if (recast and c.is_layer) else 0.0
        tl.point(f"backward:{c.name}", activations=B * c.bwd_transient, buffers=(prefetch_bwd if c.is_layer else 0.0) + again)
        tl.add("activations", -B * (c.saved))
        if f2:
            nxt = order[i + 1] if i + 1 < len(order) else None
            if unit is not None and (nxt is None or not nxt.is_layer or nxt.unit != unit):
                span_end(unit, final=last[unit] == i)  # earlier passes only reshard
                open_f2.discard(unit)
        elif unit is not None and (per_call or last[unit] == i):
            span_end(unit)
    if f2 and cb_keep:
        # FSDP2's implicit backward prefetch of the first image layer targets the unit before
        # it in forward order, the frozen codebook, which never runs backward: gathered until
        # the end of backward (under fsdp2-grad-op it was never resharded after its forward).
        tl.add("buffers", cb_copy if not keep_after_fwd else 0.0)
    span_end(None)
    if f2:
        tl.add("buffers", -rs_held[0] - (cb_copy if cb_keep else 0.0))  # the root's final callback waits for and frees the last reduce
    tl.add("buffers", -(root_copy + cast_root))
    if fsdp:
        # Units that never ran backward (the frozen codebook) hold no gradient; all others'
        # sharded gradients are now allocated: the static figure, exactly.
        tl.parts["grads"] = float(st.static["grads"])

    # -- optimizer ------------------------------------------------------------------------
    tl.point("optimizer", optimizer=_optimizer_transient(st))
    return tl


def _optimizer_transient(st: _Setup) -> float:
    """Bytes the optimizer step allocates on top of the state (counted under "optimizer").

    Fused AdamW (ours) updates params, exp_avg and exp_avg_sq in place: 0. bf16-true's
    MasterWeightAdamW copies every local gradient to fp32 first (step_transient_bytes).
    fp16-mixed adds nothing: GradScaler.unscale_ divides the gradients in place and its
    found-inf flags are one float per device. The moments are fp32 in every precision,
    so the seeds' implementations' temporaries are 4 bytes an element.
    """
    extra = float(st.local.trainable * step_transient_bytes(st.precision))
    if st.variant.adamw == "foreach":
        extra += 4 * st.local.trainable  # sqrt(exp_avg_sq), every state at once
    elif st.variant.adamw == "for-loop":
        # exp_avg_sq.sqrt() and its quotient, for the largest tensor the optimizer steps. Under
        # FSDP that is taken as a whole local flat chunk: exact for FSDP1 without
        # use_orig_params (the FLAVA seed's; the optimizer then steps the flat parameters),
        # an upper bound with it.
        if sharding(st.strategy, st.world).fsdp:
            kinds = [u.kind for u in (st.inv.root, st.inv.layer) if u.requires_grad]
            largest = max((st.unit_chunk[k] for k in kinds), default=0)
        else:
            largest = max((p.numel for u in st.inv.units() for p in u.params if p.trainable), default=0)
        extra += 2 * 4 * largest
    return extra


# -- public API -------------------------------------------------------------------------------


def resolve_device(device: str | Device) -> Device:
    """A device key (``DEVICES``) or a :class:`Device` as it is."""
    if isinstance(device, Device):
        return device
    if device not in DEVICES:
        raise SpecError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)} (or a custom size in GiB)")
    return Device(device, DEVICES[device])


def custom_device(name: str, gib: str | float) -> Device:
    """A device with ``gib`` GiB of usable memory (what torch reports as its total capacity)."""
    try:
        g = float(gib)
    except (TypeError, ValueError):
        raise SpecError(f"device memory must be a number of GiB, got {gib!r}") from None
    if not (g > 0 and g < float("inf")):
        raise SpecError(f"device memory must be a positive, finite number of GiB, got {gib!r}")
    if not name.strip():
        raise SpecError("a custom device needs a name")
    return Device(name, int(g * GIB))


def required_bytes(peak: float, world: int, overheads: Overheads = CALIBRATED) -> int:
    """What must fit on the device for a predicted allocator peak."""
    return int(peak * (1 + overheads.fragmentation) + overheads.fixed(world))


def _fits(st: _Setup, batch: int, capacity: int | None, overheads: Overheads = CALIBRATED) -> bool:
    if capacity is None:
        return True
    return required_bytes(_simulate(st, batch).peak, st.world, overheads) <= capacity


def max_batch_for(st: _Setup, capacity: int | None, overheads: Overheads = CALIBRATED) -> int | None:
    """The largest local batch that fits (None: unlimited, or not even batch 1)."""
    if capacity is None or not _fits(st, 1, capacity, overheads):
        return None
    lo, hi = 1, 2
    while hi <= MAX_BATCH_LIMIT and _fits(st, hi, capacity, overheads):
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_BATCH_LIMIT + 1)
    while hi - lo > 1:  # peak is non-decreasing in the batch: bisect
        mid = (lo + hi) // 2
        if _fits(st, mid, capacity, overheads):
            lo = mid
        else:
            hi = mid
    return lo


def predict(spec: RunSpec, world: int, ranks_per_node: int, device: str | Device, batch: int | None = None,
            data: str = "synthetic", variant: Variant = RUNNER, overheads: Overheads = CALIBRATED) -> Prediction:
    """Predict one rung's per-rank memory on ``device`` with ``world`` ranks.

    ``batch`` overrides the spec's local batch (needed when the spec says ``max``:
    then the prediction is made at the predicted max batch). ``data`` is the runner's
    ``--data``: ``synthetic`` or a shard manifest (see :func:`input_batches`).
    ``variant`` and ``overheads`` are for explaining the seeds; the defaults are the runner.
    Imports no torch: the workflow calls it while building its DAG.
    """
    dev = resolve_device(device)
    if world < 1 or ranks_per_node < 1:
        raise SpecError(f"world ({world}) and ranks per node ({ranks_per_node}) must be >= 1")
    st = _setup(spec.model, spec.strategy, spec.precision, spec.knobs, world, variant, input_batches(data))
    mb = max_batch_for(st, dev.capacity_bytes, overheads)
    b = batch if batch is not None else (None if spec.batch == "max" else int(spec.batch))
    if b is None:
        b = mb if mb is not None else 1
    tl = _simulate(st, b)
    req = required_bytes(tl.peak, world, overheads)
    breakdown = {k: int(round(v)) for k, v in tl.peak_parts.items()}
    breakdown["overhead"] = req - int(tl.peak)
    return Prediction(
        spec=spec.path, device=dev.name, world=world, ranks_per_node=ranks_per_node, batch=b, data=data,
        peak_bytes=int(tl.peak), required_bytes=req, capacity_bytes=dev.capacity_bytes,
        fits=dev.capacity_bytes is None or req <= dev.capacity_bytes, max_batch=mb, phase=tl.phase, breakdown=breakdown,
    )
