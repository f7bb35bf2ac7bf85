"""One training step replayed as a timeline of allocations; its highest point is the peak.

:func:`simulate` runs the phases in order: the resident state, the forward, the backward
(one function per wrapper family: single/DDP, FSDP1, FSDP2) and the optimizer step.
docs/planner-internals.md, "The step as a timeline", says what each phase holds and why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from scaleladder.models.families import family_of
from scaleladder.planner.activations import Call, Dtypes, codebook_transient, dtypes, input_bytes
from scaleladder.planner.static import Sharding, fsdp_param_bytes, sharding, step_transient_bytes, storage_bytes
from scaleladder.planner.step_setup import StepSetup, lowp_params
from scaleladder.spec import AnyKnobs, Fsdp2Knobs, Knobs


@dataclass
class Timeline:
    """The bytes held now, by part, and the highest point so far (with its parts and phase)."""

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


@dataclass(frozen=True)
class StepSizes:
    """The sizes every phase reads, for one setup at one local batch (bytes unless named)."""

    batch: int
    dtypes: Dtypes  # the activations' dtypes
    storage: int  # bytes per element of a parameter and its gradient as stored
    gathered_param: int  # bytes per element of an all-gathered parameter and of FSDP's unsharded gradient
    one_batch: float  # one input batch on the device
    shard: Sharding
    gathered: bool  # does FSDP all-gather copies of the units? (NO_SHARD only when it casts)
    keep_after_forward: bool  # SHARD_GRAD_OP / fsdp2-grad-op: layer units stay gathered into backward
    prefetch_layers: int  # FSDP2's explicit prefetch (pfN, in units); 0 under FSDP1
    layer_copy: float  # one gathered layer (a unit of n layers gathers n of them: StepSetup.layers_in)
    root_copy: float  # the gathered root unit
    cast_layer: float  # autocast's cached bf16 weight copies of one layer (single/DDP, mixed precision)
    cast_root: float  # the same for the root's Linears/Convs
    recast: bool  # checkpointed layers: the copies live in autocast's cache only (the TRAP below)
    ddp_bucket_views: bool  # DDP's gradients are views into its buckets (Variant.bucket_view)
    layer_forward_extra: float  # gathered bytes beside a layer call in forward, beyond the state (per layer of its unit)
    backward_prefetch: float  # gathered bytes prefetched beside a layer call in backward
    copy_out: float  # FSDP2: the flat all-gather output, alive for a moment after a backward gather (per layer)
    forward_ahead: float = 0.0  # FSDP2 units of k: the pf units prefetched in forward, k layers each
    flat_output: bool = True  # FSDP2 all-gathers into a flat buffer (a shard group of one rank copies straight in)


def fsdp1_as_run(shard: Sharding) -> Sharding:
    """FSDP1 as torch runs it. TRAP: FSDP1 clamps every sharding strategy to NO_SHARD when its
    (shard) process group has one rank (torch/distributed/fsdp/_init_utils.py: "FSDP is switching to
    use `NO_SHARD`"): a one-rank fsdp-full or fsdp-grad-op rung gathers nothing (unless it casts
    to bf16: the mixed-precision copy), keeps no unsharded gradient beside the flat one, and
    reshards nothing. Measured against torch's MemTracker (``plan --check``): flava-debug/fsdp-full/fp32
    b4 at world 1 was +8.6% with the sharded model, the root's gathered copy and a second gradient; -0.6% now."""
    if shard.fsdp and not shard.fsdp2 and shard.group == 1 and shard.kind in ("full", "grad-op", "hybrid"):
        return dataclasses.replace(shard, kind="no-shard")
    return shard


def step_sizes(setup: StepSetup, batch: int) -> StepSizes:
    shard = fsdp1_as_run(sharding(setup.strategy, setup.world))
    act_dtypes = dtypes(setup.precision, lowp_params(shard.fsdp, setup.precision, setup.variant))
    stored = storage_bytes(setup.precision)
    gathered_param = setup.variant.gathered_param_bytes or fsdp_param_bytes(setup.precision)
    mixed = act_dtypes.mode == "mixed"
    fsdp = shard.fsdp
    gathered = fsdp and (shard.sharded or gathered_param != stored)  # NO_SHARD gathers nothing unless it casts to bf16
    keep_after_forward = fsdp and not shard.reshard_after_forward
    layer_copy = setup.unit_full["layer"] * gathered_param if gathered else 0.0
    root_copy = setup.unit_full["root"] * gathered_param if gathered else 0.0
    # Autocast's weight cache (single/DDP under bf16/fp16-mixed): a copy per trainable Linear/Conv.
    # (FSDP1/FSDP2 gather bf16 parameters, MixedPrecision's param_dtype: autocast casts nothing.)
    cast_layer = 2 * setup.inv.layer.cast_numel if (mixed and not fsdp) else 0.0
    cast_root = 2 * setup.inv.root.cast_numel if (mixed and not fsdp) else 0.0
    # TRAP: a CHECKPOINTED layer saves none of its forward's tensors, its bf16 weight
    # copies included, so they live only in autocast's cache, which is cleared when the step's
    # autocast context exits: after the loss, BEFORE backward(). They are not held until the
    # layer's backward, as without AC. In backward each layer's recompute enters autocast again
    # (checkpoint restores it; cleared at its exit) and casts again: one layer's copies at a
    # time, saved by the recomputed matmuls until that layer's backward is done. The same for
    # non-reentrant and reentrant checkpointing (neither saves anything in forward). Measured
    # against torch's MemTracker on fake tensors, holding them overstated
    # flava-350m/single-ac/bf16-mixed b8 by 10.1% and vit-base/single-ac/bf16-mixed b32 by 5.4%.
    recast = bool(cast_layer) and setup.strategy.ac
    prefetch_layers = setup.knobs.prefetch_layers if isinstance(setup.knobs, Fsdp2Knobs) else 0
    streaming = gathered and not keep_after_forward  # layer units gathered per call, freed after it
    k = setup.knobs.unit_layers
    forward_ahead = 0.0
    if shard.fsdp2 and k > 1:
        # Units of k layers: the running unit's own copies scale with ITS layers (the last unit of a
        # stack holds fewer: _forward multiplies), the pf units prefetched ahead are whole units of k.
        units_in_flight, backward_prefetch = _fsdp2_in_flight(prefetch_layers, layer_copy, streaming)
        units_in_flight -= prefetch_layers  # the running unit's copies; the prefetched ones are forward_ahead
        backward_prefetch *= k  # whole units of k prefetched in backward
        forward_ahead = prefetch_layers * k * layer_copy if gathered else 0.0
        kept_extra = layer_copy
    elif shard.fsdp2:
        units_in_flight, backward_prefetch = _fsdp2_in_flight(prefetch_layers, layer_copy, streaming)
        kept_extra = layer_copy * (1 + prefetch_layers)
    else:
        units_in_flight, backward_prefetch = _fsdp1_in_flight(setup.knobs, layer_copy, streaming)
        kept_extra = layer_copy * 1
    # TRAP (torch 2.14 FSDPParamGroup.unshard/wait_for_unshard): with a shard group of ONE rank
    # (world 1, fsdp2-hybrid1) FSDP2 gathers nothing: unshard() only notes the request (a prefetch
    # allocates nothing) and wait_for_unshard copies each sharded parameter into its unsharded
    # storage. No flat all-gather output exists, so only the unit's unsharded parameters are held.
    # Held against torch's tracker: vit-base/fsdp2-full/bf16-mixed/pf0-u4 b8 at world 1 was +8.5%
    # with the flat outputs and prefetches counted (+1.1% at a unit per layer).
    flat_output = not (shard.fsdp2 and shard.group == 1)
    if not flat_output:
        units_in_flight, backward_prefetch, forward_ahead, kept_extra = 1, 0.0, 0.0, 0.0
    if streaming:
        layer_forward_extra = units_in_flight * layer_copy
    elif keep_after_forward:
        # FSDP1: the next unit, gathered while this one runs. FSDP2: this unit's held
        # flat all-gather output, plus the pf prefetched.
        layer_forward_extra = kept_extra
    else:
        layer_forward_extra = 0.0
    return StepSizes(
        batch=batch, dtypes=act_dtypes, storage=stored, gathered_param=gathered_param,
        one_batch=batch * input_bytes(setup.inv.flavor, act_dtypes), shard=shard, gathered=gathered,
        keep_after_forward=keep_after_forward, prefetch_layers=prefetch_layers, layer_copy=layer_copy,
        root_copy=root_copy, cast_layer=cast_layer, cast_root=cast_root, recast=recast,
        ddp_bucket_views=setup.strategy.wrapper == "ddp" and setup.variant.bucket_view,
        layer_forward_extra=layer_forward_extra, backward_prefetch=backward_prefetch,
        # Backward frees the flat output right after the copy-out: a moment of one more copy.
        copy_out=layer_copy if shard.fsdp2 and flat_output else 0.0, forward_ahead=forward_ahead,
        flat_output=flat_output,
    )


def _fsdp1_in_flight(knobs: AnyKnobs, layer_copy: float, streaming: bool) -> tuple[int, float]:
    """FSDP1: (layer units gathered while a layer runs forward, bytes prefetched in backward).

    2 in flight with ``limit_all_gathers``, 4 without (a heuristic for the CPU running
    ahead), +1 with forward prefetch; one unit prefetched in backward unless ``none``."""
    k1 = knobs if isinstance(knobs, Knobs) else Knobs()  # FSDP1's knobs (defaults elsewhere)
    in_flight = (2 if k1.limit_all_gathers else 4) + (1 if k1.forward_prefetch else 0)
    return in_flight, (layer_copy if (streaming and k1.backward_prefetch != "none") else 0.0)


def _fsdp2_in_flight(prefetch_layers: int, layer_copy: float, streaming: bool) -> tuple[int, float]:
    """FSDP2: (layer units' worth gathered while a layer runs forward, bytes prefetched in backward),
    a unit per layer (units of k: step_sizes scales them).

    foreach_all_gather gathers into ONE flat output, copied out into per-parameter unsharded
    tensors. In forward, FSDP2 keeps that flat output (all_gather_state) until the NEXT unit's
    wait_for_unshard, to overlap the copy-out with the next all-gather (torch 2.14
    FSDPParamGroup.wait_for_unshard): while a layer runs, its unsharded parameters AND its flat
    output, plus the flat outputs of the pf layers prefetched explicitly (pf0: none; FSDP2
    gathers each unit when it is called). Backward: FSDP2's implicit prefetch gathers the
    previous unit (one); pf2 two."""
    return 2 + prefetch_layers, (max(1, prefetch_layers) * layer_copy if streaming else 0.0)


def simulate(setup: StepSetup, batch: int) -> Timeline:
    """The step's timeline at local batch ``batch``; ``.peak`` is the allocator's predicted peak."""
    sizes = step_sizes(setup, batch)
    timeline = _resident_state(setup, sizes)
    _forward(setup, sizes, timeline)
    if sizes.shard.fsdp2:
        _backward_fsdp2(setup, sizes, timeline)
    elif sizes.shard.fsdp:
        _backward_fsdp1(setup, sizes, timeline)
    else:
        _backward_replicated(setup, sizes, timeline)
    timeline.point("optimizer", optimizer=optimizer_transient(setup))
    return timeline


def _resident_state(setup: StepSetup, sizes: StepSizes) -> Timeline:
    """What a rank holds between steps, and the moment a loader's next batch arrives."""
    timeline = Timeline({"params": float(setup.static["params"]), "optimizer": float(setup.static["optimizer"]),
                         "grads": 0.0, "activations": 0.0, "buffers": float(setup.inv.buffer_bytes),
                         "inputs": float(setup.inputs.resident * sizes.one_batch)})
    # DDP's gradient buckets, allocated when DDP is built. With bucket views they are the
    # gradients themselves (counted as such); without, a second copy next to them.
    if setup.strategy.wrapper == "ddp":
        timeline.add("grads" if sizes.ddp_bucket_views else "buffers", setup.inv.trainable_numel * sizes.storage)
    timeline.point("step-start", inputs=setup.inputs.at_step_start * sizes.one_batch)
    return timeline


def _forward(setup: StepSetup, sizes: StepSizes, timeline: Timeline) -> None:
    """The root gathered for the whole step, FLAVA's codebook, then every call of every pass."""
    batch, fsdp2 = sizes.batch, sizes.shard.fsdp2
    if fsdp2:
        # the root's flat output + its unsharded params (one rank's shard group: no flat output)
        timeline.point("forward:gather-root", buffers=(2 if sizes.flat_output else 1) * sizes.root_copy)
    timeline.add("buffers", sizes.root_copy + sizes.cast_root)
    _codebook_forward(setup, sizes, timeline)
    seen_units: set[int] = set()
    held = 0.0  # what the forward's Python objects hold until it returns
    cached = 0.0  # the layers' copies in autocast's cache during forward
    for forward_pass in setup.passes:
        for call in forward_pass:
            n = setup.layers_in(call.unit)  # layers in the call's unit (1 but for FSDP2's -u<k>)
            if call.is_layer and call.unit is not None and call.unit not in seen_units:
                seen_units.add(call.unit)
                if sizes.keep_after_forward:
                    timeline.add("buffers", n * sizes.layer_copy)
                timeline.add("buffers", sizes.cast_layer)
                cached += sizes.cast_layer
            extra = n * sizes.layer_forward_extra + sizes.forward_ahead if call.is_layer else 0.0
            timeline.point(f"forward:{call.name}", activations=batch * call.fwd_transient, buffers=extra)
            timeline.add("activations", batch * (call.saved + call.held - call.releases))
            held += batch * (call.held - call.releases)
    timeline.point("forward:end")
    timeline.add("activations", -held)
    if sizes.recast:
        timeline.add("buffers", -cached)  # autocast exits before backward(): its cache is cleared


def _codebook_forward(setup: StepSetup, sizes: StepSizes, timeline: Timeline) -> None:
    """A frozen codebook (FLAVA's dVAE) encodes the images: gathered for its forward. Only a family
    with one has a codebook unit in its inventory (``Family.codebook_prefix``)."""
    flavor = setup.inv.flavor
    if setup.inv.codebook is None:
        return
    codebook_copy = setup.unit_full["codebook"] * sizes.gathered_param if sizes.gathered else 0.0
    if sizes.shard.fsdp2:
        timeline.point("forward:gather-codebook", buffers=(2 if sizes.flat_output else 1) * codebook_copy)
    timeline.point("codebook", activations=sizes.batch * codebook_transient(flavor, sizes.dtypes), buffers=codebook_copy)
    if sizes.shard.fsdp2 and sizes.gathered and sizes.keep_after_forward:
        # fsdp2-grad-op: not resharded after its forward. Kept to the end of the step: the
        # backward regather and free that docs/planner-internals.md describes ("FLAVA's frozen
        # codebook is gathered again in backward") are switched off (a reset of the flag right
        # after this block), and turning them on would move predictions.
        timeline.add("buffers", codebook_copy)


def _last_call_of_unit(order: list[Call]) -> dict[int | None, int]:
    """Each unit's last call in backward order (None: the root)."""
    last: dict[int | None, int] = {}
    for i, call in enumerate(order):
        last[call.unit if call.is_layer else None] = i
    return last


def _backward_call(sizes: StepSizes, timeline: Timeline, call: Call, recast_bytes: float = 0.0,
                   prefetch: bool = True) -> None:
    """One call's backward: its transient at the peak check, then its saved tensors freed."""
    prefetched = sizes.backward_prefetch if call.is_layer and prefetch else 0.0
    timeline.point(f"backward:{call.name}", activations=sizes.batch * call.bwd_transient, buffers=prefetched + recast_bytes)
    timeline.add("activations", -sizes.batch * (call.saved))


def _backward_replicated(setup: StepSetup, sizes: StepSizes, timeline: Timeline) -> None:
    """single and DDP: full gradients appear at a unit's first backward call; autocast's
    weight copies of a layer are freed at its last (under AC, recast per call instead)."""
    order = setup.backward
    last = _last_call_of_unit(order)
    touched: set[int | None] = set()
    for i, call in enumerate(order):
        unit = call.unit if call.is_layer else None
        if unit not in touched:
            if not sizes.ddp_bucket_views:
                unit_layout = setup.inv.root if unit is None else setup.inv.layer
                timeline.add("grads", unit_layout.trainable_numel * sizes.storage)
            touched.add(unit)
        # under AC each layer CALL's recompute casts its weights again (freed after its backward:
        # FLAVA's two passes of a layer cast twice, never both at once)
        _backward_call(sizes, timeline, call, sizes.cast_layer if (sizes.recast and call.is_layer) else 0.0)
        if unit is not None and last[unit] == i and not sizes.recast:
            timeline.add("buffers", -sizes.cast_layer)
    timeline.add("buffers", -(sizes.root_copy + sizes.cast_root))


def _backward_fsdp1(setup: StepSetup, sizes: StepSizes, timeline: Timeline) -> None:
    """FSDP1: a unit's backward "span" runs from its first backward call to its last: it is
    gathered again (unless kept from forward) with an unsharded gradient at the start, and at
    the end its gradient is reduced (fp32 copy + reduce-scatter output) and it is resharded."""
    order = setup.backward
    last = _last_call_of_unit(order)
    # In the reentrant-AC counterfactual each call is a span of its own (not for SHARD_GRAD_OP,
    # whose forward-gathered units are simply kept). The rung -ac-reentrant (FSDP1's units
    # inside the checkpoint wrappers) is that form, measured.
    reentrant = setup.strategy.reentrant or not setup.variant.gather_across_passes
    per_call = setup.strategy.ac and reentrant and not sizes.keep_after_forward
    touched: set[int | None] = set()
    reduced: set[int | None] = set()
    poolers = _PoolerPileUp(setup, sizes) if not per_call else None
    for i, call in enumerate(order):
        unit = call.unit if call.is_layer else None
        if poolers is not None:
            poolers.before(call, timeline)
        if unit not in touched or (per_call and unit is not None):
            _fsdp1_span_start(setup, sizes, timeline, unit)
            touched.add(unit)
        _backward_call(sizes, timeline, call)
        if unit is not None and (per_call or last[unit] == i):
            _fsdp1_span_end(setup, sizes, timeline, unit, reduced)
    _fsdp1_span_end(setup, sizes, timeline, None, reduced)
    timeline.add("buffers", -(sizes.root_copy + sizes.cast_root))
    # Units that never ran backward (the frozen codebook) hold no gradient; all others'
    # sharded gradients are now allocated: the static figure, exactly.
    timeline.parts["grads"] = float(setup.static["grads"])


class _PoolerPileUp:
    """FSDP1, TorchMultimodal's FLAVA (two passes per encoder): the encoders' frozen poolers, units
    of their own, gathered in backward and kept until the unmasked pass's backward.

    FSDP1's backward prefetch gathers the unit that ran just before the one starting its backward:
    before the fusion layers, the masked text pass's pooler; before the masked text pass's first
    layer, the masked image pass's pooler. Nothing reshards them there (FSDP1 registers a frozen
    unit's reshard-only hook once, at its first forward, so it fires in the unmasked pass's
    backward): they stay gathered, as the layers do, until the unmasked text (resp. image) pass's
    backward. tests/test_plan_exact.py counts them on two gloo ranks: 2 beside the layers, then 1,
    then 0. Under the ``sdpa`` FLAVA (one batched pass per encoder) a pooler is only prefetched for a
    moment where a layer would be (``backward_prefetch`` already counts a layer there): nothing here.
    """

    def __init__(self, setup: StepSetup, sizes: StepSizes) -> None:
        tm = family_of(setup.inv.flavor).twin_passes({"flava_impl": setup.variant.flava_impl})
        self.on = tm and sizes.gathered and not sizes.keep_after_forward
        self.size = {enc: sum(u.numel for u in setup.inv.frozen if u.params[0].name.startswith(f"flava.model.{enc}_encoder.pooler."))
                     * sizes.gathered_param for enc in ("image", "text")}
        self.first_text_unit = setup.inv.flavor.layers
        self.held: set[str] = set()

    def _take(self, enc: str, timeline: Timeline) -> None:
        if enc not in self.held:
            self.held.add(enc)
            timeline.add("buffers", self.size[enc])

    def _drop(self, enc: str, timeline: Timeline) -> None:
        if enc in self.held:
            self.held.discard(enc)
            timeline.add("buffers", -self.size[enc])

    def before(self, call: Call, timeline: Timeline) -> None:
        """Gather or free a pooler before ``call``'s backward."""
        if not self.on:
            return
        if call.name.startswith("mm.layer"):
            self._take("text", timeline)
        elif call.name.startswith("text_masked.layer") and call.unit == self.first_text_unit:
            self._take("image", timeline)
        elif call.name.startswith("text."):
            self._drop("text", timeline)
        elif call.name.startswith("image."):
            self._drop("image", timeline)


def _fsdp1_span_start(setup: StepSetup, sizes: StepSizes, timeline: Timeline, unit: int | None) -> None:
    kind, layout = ("root", setup.inv.root) if unit is None else ("layer", setup.inv.layer)
    if unit is not None and sizes.gathered and not sizes.keep_after_forward:
        timeline.add("buffers", sizes.layer_copy)  # all-gathered again for backward
    if layout.requires_grad:
        timeline.add("grads", setup.unit_full[kind] * sizes.gathered_param)  # the unsharded gradient it accumulates


def _fsdp1_span_end(setup: StepSetup, sizes: StepSizes, timeline: Timeline, unit: int | None,
                    reduced: set[int | None]) -> None:
    kind, layout = ("root", setup.inv.root) if unit is None else ("layer", setup.inv.layer)
    if layout.requires_grad:
        fp32_copy = setup.unit_full[kind] * 4 if sizes.gathered_param < 4 else 0
        reduce_out = setup.unit_chunk[kind] * 4 if sizes.shard.sharded else 0
        timeline.point(f"backward:reduce-{kind}", buffers=fp32_copy + reduce_out)
        timeline.add("grads", -setup.unit_full[kind] * sizes.gathered_param
                     + (0 if unit in reduced else setup.unit_chunk[kind] * sizes.storage))
        reduced.add(unit)
    if unit is not None and sizes.gathered:
        timeline.add("buffers", -sizes.layer_copy)


@dataclass
class _Fsdp2Backward:
    """FSDP2's backward bookkeeping: which units have gradients, were reduced or resharded,
    and the reduce-scatter input still held (reduce_scatter_max_input_buffers = 1)."""

    touched: set[int | None] = field(default_factory=set)
    reduced: set[int | None] = field(default_factory=set)
    resharded: set[int | None] = field(default_factory=set)
    reduce_input_held: float = 0.0
    grad_layers: dict[int | None, int] = field(default_factory=dict)  # layers of a unit whose unsharded grads exist


def _backward_fsdp2(setup: StepSetup, sizes: StepSizes, timeline: Timeline) -> None:
    """FSDP2: a unit's post-backward hook is registered per forward CALL (on its inputs), so
    each backward pass of a unit ends with a reshard and a reduce-scatter (accumulated into
    the sharded gradient); FLAVA's second pass gathers it again. A span is a run of
    consecutive backward calls of one unit; only the unit's last span reduces."""
    order = setup.backward
    last = _last_call_of_unit(order)
    state = _Fsdp2Backward()
    open_units: set[int | None] = set()
    # FSDP2's implicit backward prefetch targets the unit that finished its forward before this one
    # (post_forward_order): for the first layer unit, the codebook where there is one, else none (the
    # root finishes its forward last), so it gathers nothing ahead.
    first = next((c.unit for p in setup.passes for c in p if c.is_layer), None)
    quiet = first if setup.inv.codebook is None else None
    for i, call in enumerate(order):
        unit = call.unit if call.is_layer else None
        if unit is not None and unit not in open_units:
            _fsdp2_span_start(setup, sizes, timeline, unit, state, prefetch=unit != quiet)
            open_units.add(unit)
        elif unit is None and unit not in state.touched:
            _fsdp2_span_start(setup, sizes, timeline, None, state)
        elif unit is not None and setup.inv.layer.requires_grad and state.grad_layers.get(unit, 0) < setup.layers_in(unit):
            # a unit of k layers: each layer's unsharded gradients appear at its own backward call
            timeline.add("grads", setup.grad_full["layer"] * sizes.gathered_param)
            state.grad_layers[unit] += 1
        state.touched.add(unit)
        _backward_call(sizes, timeline, call, prefetch=unit is None or unit != quiet)
        following = order[i + 1] if i + 1 < len(order) else None
        if unit is not None and (following is None or not following.is_layer or following.unit != unit):
            _fsdp2_span_end(setup, sizes, timeline, unit, state, final=last[unit] == i)  # earlier passes only reshard
            open_units.discard(unit)
    _fsdp2_span_end(setup, sizes, timeline, None, state, final=True)
    timeline.add("buffers", -state.reduce_input_held)  # the root's final callback waits for and frees the last reduce
    timeline.add("buffers", -(sizes.root_copy + sizes.cast_root))
    # Units that never ran backward (the frozen codebook) hold no gradient; all others'
    # sharded gradients are now allocated: the static figure, exactly.
    timeline.parts["grads"] = float(setup.static["grads"])


def _fsdp2_span_start(setup: StepSetup, sizes: StepSizes, timeline: Timeline, unit: int | None,
                      state: _Fsdp2Backward, prefetch: bool = True) -> None:
    kind, layout = ("root", setup.inv.root) if unit is None else ("layer", setup.inv.layer)
    n = setup.layers_in(unit)  # a unit of n layers gathers and reduces n layers' worth at once
    if unit is not None and sizes.gathered and (not sizes.keep_after_forward or unit in state.resharded):
        timeline.add("buffers", n * sizes.layer_copy)  # all-gathered again for this backward pass
        timeline.point(f"backward:gather-{kind}", buffers=n * sizes.copy_out + (sizes.backward_prefetch if prefetch else 0.0))
    if layout.requires_grad and unit not in state.touched:
        # Unsharded gradients, in param_dtype, from the unit's FIRST backward pass: the
        # unsharded parameter is one autograd leaf for both of FLAVA's passes, so autograd
        # holds the first pass's gradient until the second's arrives (AccumulateGrad runs
        # once), and the reduce-scatter happens once, at the last pass. A unit of k layers: its
        # first layer's here, each other layer's at that layer's call (_backward_fsdp2).
        timeline.add("grads", setup.grad_full[kind] * sizes.gathered_param)
        state.grad_layers[unit] = 1
    state.touched.add(unit)


def _fsdp2_span_end(setup: StepSetup, sizes: StepSizes, timeline: Timeline, unit: int | None,
                    state: _Fsdp2Backward, final: bool) -> None:
    kind, layout = ("root", setup.inv.root) if unit is None else ("layer", setup.inv.layer)
    n = setup.layers_in(unit)
    if unit is not None and sizes.gathered:
        # post_backward reshards the unit BEFORE it reduces (torch 2.14 FSDPParamGroup.post_backward:
        # reshard(), then foreach_reduce): its gathered parameters are gone at the reduce's peak.
        timeline.add("buffers", -n * sizes.layer_copy)
        state.resharded.add(unit)
    if layout.requires_grad and final:
        # foreach_reduce: copy the unsharded gradients into a new flat reduce-scatter input
        # (reduce dtype, padded), reduce-scatter into a new output of one shard (it becomes
        # the sharded gradient, or is added to it and freed). The reduce dtype is fp32 for the
        # mixed precisions and fp32, bf16 under bf16-true: the storage dtype. A unit of n
        # layers reduces its n layers' gradients in one collective: n times each buffer.
        reduce_in = n * setup.grad_full[kind] * sizes.storage
        reduce_out = n * setup.grad_chunk[kind] * sizes.storage
        # The previous unit's input is freed first (reduce_scatter_max_input_buffers = 1).
        timeline.point(f"backward:reduce-{kind}", buffers=reduce_in + reduce_out - state.reduce_input_held)
        timeline.add("grads", -n * setup.grad_full[kind] * sizes.gathered_param
                     + (0 if unit in state.reduced else n * setup.grad_chunk[kind] * sizes.storage))
        timeline.add("buffers", reduce_in - state.reduce_input_held)
        state.reduce_input_held = reduce_in
        state.reduced.add(unit)


def optimizer_transient(setup: StepSetup) -> float:
    """Bytes the optimizer step allocates on top of the state (counted under "optimizer").

    Fused AdamW (ours) updates params, exp_avg and exp_avg_sq in place: 0. bf16-true's
    MasterWeightAdamW copies every local gradient to fp32 first (step_transient_bytes).
    fp16-mixed adds nothing: GradScaler.unscale_ divides the gradients in place and its
    found-inf flags are one float per device. The moments are fp32 in every precision,
    so the seeds' implementations' temporaries are 4 bytes an element.
    """
    extra = float(setup.local.trainable * step_transient_bytes(setup.precision))
    if setup.variant.adamw == "foreach":
        extra += 4 * setup.local.trainable  # sqrt(exp_avg_sq), every state at once
    elif setup.variant.adamw == "for-loop":
        # exp_avg_sq.sqrt() and its quotient, for the largest tensor the optimizer steps. Under
        # FSDP that is taken as a whole local flat chunk: exact for FSDP1 without
        # use_orig_params (the FLAVA seed's; the optimizer then steps the flat parameters),
        # an upper bound with it.
        if sharding(setup.strategy, setup.world).fsdp:
            kinds = [u.kind for u in (setup.inv.root, setup.inv.layer) if u.requires_grad]
            largest = max((setup.unit_chunk[k] for k in kinds), default=0)
        else:
            largest = max((p.numel for u in setup.inv.units() for p in u.params if p.trainable), default=0)
        extra += 2 * 4 * largest
    return extra
