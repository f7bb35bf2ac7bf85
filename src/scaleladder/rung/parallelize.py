"""How a strategy is applied to a model: what torchtitan calls ``parallelize``.

Order is fixed: FLAVA's unused parameters frozen (``rung/unused_params.py``), activation
checkpointing, then ``torch.compile`` of each transformer block, then the data-parallel
wrapper (FSDP1 on each checkpointed layer, FSDP2's ``fully_shard`` per block, or per k
consecutive blocks of a stack with the knobs' ``-u<k>``, codebook and root, bottom-up, with its
explicit prefetch). Proof that wrapping happened is part of the result (:class:`WrapReport`):
units, layer units (and the blocks each holds), checkpointed and compiled layers are counted from
the wrapped model (``rung/what_ran.py``), and a policy that misses any layer raises. What a block
is and which modules are units besides the blocks, the model's family says (``models/family.py``:
``block_classes``, ``extra_unit_classes``, and ``stacks`` for units of k; asked once per wrap, never
per step).
Why: docs/strategies.md (the table, "FSDP2 against FSDP1", "Traps we hit").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaleladder.models.build import TrainModule
from scaleladder.models.families import family_of
from scaleladder.planner.static import fsdp1_use_orig_params
from scaleladder.rung.precision import PrecisionPolicy
from scaleladder.rung.unused_params import freeze_unused
from scaleladder.rung.what_ran import (
    block_layer,
    count_checkpointed,
    count_compiled,
    count_fsdp_layer_units,
    count_fsdp_units,
    count_layers,
    fsdp_layer_unit_sizes,
    uncompiled,
)
from scaleladder.spec import (
    COMPILE_BACKENDS,
    AnyKnobs,
    Fsdp2Knobs,
    Knobs,
    SpecError,
    Strategy,
    check_unit_knobs,
    check_unit_layers,
)


@dataclass(frozen=True)
class WrapReport:
    """What wrapping did (counted from the wrapped model): the record's build attributes."""

    fsdp_units: int  # every FSDP unit, the root included (a grouped fully_shard([...]) is one)
    fsdp_layer_units: int  # FSDP units that hold transformer layers (one each; k each under -u<k>)
    ac_layers: int
    frozen_unused_params: int
    compiled_layers: int = 0  # transformer blocks replaced by a torch.compile'd OptimizedModule
    compile_backend: str = ""  # the torch.compile backend that compiled them ("" when not compiled)


def _checkpoint(model: TrainModule, reentrant: bool = False, selective: bool = False,
                blocks: tuple[type[nn.Module], ...] | None = None) -> int:
    """Wrap each block (``blocks``; default: the family's) in a checkpoint wrapper; return how many."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    # NO_REENTRANT by default: reentrant checkpointing under DDP fails with "mark a variable
    # ready only once" (multimodal #404) and ignores inputs that need no grad. REENTRANT only
    # where the spec allows it (FSDP1, single: the FLAVA seed's form). TRAP: a reentrant
    # checkpoint whose inputs need no grad silently gives its parameters no gradient; every
    # checkpointed layer here takes hidden states computed from trainable embeddings, and the
    # parity test (tests/test_parity.py) would see a layer that stopped learning.
    classes = blocks if blocks is not None else _blocks(model)
    impl = CheckpointImpl.REENTRANT if reentrant else CheckpointImpl.NO_REENTRANT
    # -sac: the same wrapper, non-reentrant, with an op-level policy (rung/sac.py); the
    # unit structure, FSDP's nesting and the proof below stay those of -ac.
    extra: dict[str, Any] = {}
    if selective:
        from scaleladder.rung.sac import context_fn

        extra["context_fn"] = context_fn()
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=impl, **extra),
        check_fn=lambda m: isinstance(m, classes),
    )
    return count_checkpointed(model)


def _outermost(root: nn.Module, match: Callable[[nn.Module], bool]) -> Iterator[tuple[nn.Module, str, nn.Module]]:
    """(parent, name, module) for every outermost module that matches, in registration
    order, without descending into a match (a compiled block's ``_orig_mod`` is the same
    block again, and a checkpoint wrapper holds its layer)."""
    for name, child in root.named_children():
        if match(child):
            yield root, name, child
        else:
            yield from _outermost(child, match)


def _unit_classes(model: TrainModule, ac: bool) -> set[type[nn.Module]]:
    """Modules that become their own FSDP unit (FSDP1's wrap policy; FSDP2 shards the
    outermost module of each of these classes, looking through compile's wrapper): the
    family's blocks (their checkpoint wrappers under AC) and its extra units (FLAVA's frozen
    codebook: models/families/flava.py says why)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    family = family_of(model.flavor)
    classes: set[type[nn.Module]] = {CheckpointWrapper} if ac else set(family.block_classes(model))
    return classes | family.extra_unit_classes(model)


def _hybrid_mesh(world: int, group: int, device: torch.device) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    # Rows replicate, columns shard: ranks 0..g-1 shard one replica (ORNL's
    # arange(world).view(-1, g)). On Frontier the g closest GCDs are consecutive ranks.
    return init_device_mesh(device.type, (world // group, group), mesh_dim_names=("replicate", "shard"))


#: torch's FSDP1 switch (torch/distributed/fsdp/_flat_param.py), read by each FlatParamHandle
#: when it is made: "1" sets the unit's parameter views with plain attribute writes.
FSDP1_UNSAFE_SETATTR = "FSDP_USE_UNSAFE_SETATTR"


@contextmanager
def _fsdp1_plain_setattr(model: nn.Module) -> Iterator[None]:
    """FSDP1 units made inside set their views by plain attribute writes.

    Each forward, FSDP1 re-makes every parameter of a unit as a view of its flat parameter and
    sets it on its module, by default with ``delattr`` + ``nn.Module.__setattr__`` (a few
    Parameter/Buffer/Module checks per parameter): a quarter of the Python calls FSDP1 adds to
    a step (vit-debug, one rank: 3,008 calls a step against 2,432 with the switch; single 873;
    tests/test_host_fsdp1.py). Torch's own switch for this overhead writes the same view into
    the module's ``__dict__`` and drops it from ``_parameters``, where the safe path leaves it
    too (a ``Parameter``, for state dicts, goes into ``_parameters`` as there, and into
    ``__dict__`` as well): the same tensors, the same numerics. Rank-local Python bookkeeping,
    no collective, so it holds at any world size and on NCCL as on gloo.
    TRAP: it bypasses ``__setattr__``/``__delattr__`` overrides and global parameter-registration
    hooks; where the model has either, the safe path stays. The variable is set only while the
    units are made (torch reads it then, once per handle) and restored, so nothing else in the
    process (another rung, a child process) sees it.
    """
    from torch.nn.modules import module as nn_module

    plain = not nn_module._global_parameter_registration_hooks and all(
        type(m).__setattr__ is nn.Module.__setattr__ and type(m).__delattr__ is nn.Module.__delattr__
        for m in model.modules())
    before = os.environ.get(FSDP1_UNSAFE_SETATTR)
    if plain:
        os.environ[FSDP1_UNSAFE_SETATTR] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FSDP1_UNSAFE_SETATTR, None)
        else:
            os.environ[FSDP1_UNSAFE_SETATTR] = before


def wrap_fsdp(
    model: TrainModule,
    strategy: Strategy,
    knobs: Knobs,  # FSDP1's (apply_strategy checks the generation)
    prec: PrecisionPolicy,
    device: torch.device,
    param_init_fn: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import CustomPolicy

    sharding = {
        "full": ShardingStrategy.FULL_SHARD,
        "grad-op": ShardingStrategy.SHARD_GRAD_OP,
        "no-shard": ShardingStrategy.NO_SHARD,
        "hybrid": ShardingStrategy.HYBRID_SHARD,
    }[strategy.sharding or ""]
    prefetch = {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST, "none": None}[knobs.backward_prefetch]
    extra: dict[str, Any] = {}
    if strategy.sharding == "hybrid" and strategy.group == 1:
        # TRAP (torch FSDP1): HYBRID_SHARD whose shard group has ONE rank warns
        # "switching to NO_SHARD" and then applies NO_SHARD to that 1-rank group only,
        # dropping the all-reduce across replicas: gradients are never synchronised and
        # the replicas silently diverge (tests/test_parity.py shows it). Sharding over
        # groups of 1 and replicating everywhere IS NO_SHARD over the world, so that is
        # what hybrid1 runs. See docs/strategies.md on the ViT seed's "HYBRID 1GPU".
        sharding = ShardingStrategy.NO_SHARD
    elif strategy.sharding == "hybrid":
        # On CPU, HYBRID_SHARD needs both device_id and device_mesh (anchors.md).
        extra["device_mesh"] = _hybrid_mesh(dist.get_world_size(), strategy.group or 1, device)
    if param_init_fn is not None:
        extra["param_init_fn"] = param_init_fn
    classes = tuple(_unit_classes(model, strategy.ac and not strategy.reentrant))
    frozen = {id(m) for _, _, m in _outermost(model, _all_frozen)}
    with _fsdp1_plain_setattr(model):
        return FSDP(
            model,
            sharding_strategy=sharding,
            # Under REENTRANT AC the unit goes INSIDE the checkpoint wrapper, CheckpointWrapper(FSDP(layer)),
            # as in the FLAVA seed (AC applied first, then a wrap policy on the layer class). TRAP:
            # FSDP(CheckpointWrapper(layer)) with reentrant AC breaks on FLAVA's second encoder pass: the
            # first pass's nested backward reshards the unit (post-backward hook), the pre-backward hook
            # runs once per backward, so the other pass recomputes on freed parameters ("weight of
            # shape [0]"). Inside the wrapper, every recompute is a call of the FSDP unit, which gathers.
            # A unit per layer class, plus one per outermost module whose parameters are all frozen
            # (FLAVA: the codebook, the unused heads and poolers). TRAP: without use_orig_params a
            # unit's FlatParameter must be all trainable or all frozen ("FlatParameter requires
            # uniform requires_grad"), and freeze_unused froze heads that sit in the root unit.
            auto_wrap_policy=CustomPolicy(lambda m: isinstance(m, classes) or id(m) in frozen),
            mixed_precision=prec.fsdp_mixed_precision(),
            backward_prefetch=prefetch,
            forward_prefetch=knobs.forward_prefetch,
            limit_all_gathers=knobs.limit_all_gathers,
            # The FLAVA seed's call (its default): the optimizer steps one FlatParameter per unit,
            # and FSDP's hooks keep no per-parameter views in sync (less host work per step).
            # Not under -ac-reentrant: why in planner.static.fsdp1_use_orig_params.
            use_orig_params=fsdp1_use_orig_params(strategy),
            device_id=device,
            **extra,
        )


def unit_groups(stacks: list[list[nn.Module]], k: int) -> list[list[nn.Module]]:
    """The blocks in FSDP units of ``k`` consecutive blocks, within each stack (``Family.stacks``,
    the bare blocks, taken before AC and compile wrap them): a stack of n blocks gives ceil(n / k)
    units, and its last unit holds the remainder (n = 5, k = 2: 2, 2, 1). A unit never spans two
    stacks: FLAVA's encoders run in different passes. Each becomes ``fully_shard``'s list form,
    one parameter group and one set of hooks for the k: the lever pytorch#173680 suggests against
    FSDP's per-unit host cost."""
    return [stack[i:i + k] for stack in stacks for i in range(0, len(stack), k)]


def wrap_fsdp2(
    model: TrainModule,
    strategy: Strategy,
    knobs: Fsdp2Knobs,
    prec: PrecisionPolicy,
    device: torch.device,
    param_init_fn: Callable[[nn.Module], None] | None = None,
    groups: list[list[nn.Module]] | None = None,
) -> nn.Module:
    """FSDP2: ``fully_shard`` each block, FLAVA's codebook, then the root (bottom-up).

    * Units of k blocks (``groups``: :func:`unit_groups`, :func:`_shard_groups`): one
      ``fully_shard([b_i, ..., b_{i+k-1}])`` each; the explicit prefetch (pf<n>) counts units.

    * Mesh: 1-D over the world (``full``, ``grad-op``), or HSDP's 2-D ``(world/g, g)``
      mesh ``("replicate", "shard")`` for ``hybrid<g>``: parameters are sharded over
      the g ranks of a row and gradients all-reduced across rows. Unlike FSDP1, a shard
      dimension of 1 needs no workaround (FSDP2 keeps the replicate all-reduce); the
      parity test runs fsdp2-hybrid1 to prove it.
    * ``reshard_after_forward``: True (``full``, ``hybrid``), False (``grad-op``, the
      SHARD_GRAD_OP analogue) for the blocks and the codebook; the root keeps FSDP2's
      default, which never reshards it after forward (torchtitan's apply_fsdp does the same).
    * Precision: the mixed modes gather parameters in the autocast dtype and reduce
      gradients in fp32 (``MixedPrecisionPolicy``), as FSDP1's MixedPrecision does here;
      fp32 and bf16-true gather what is stored.
    * Meta init (``param_init_fn``): each unit's modules are materialised on the device
      just before fully_shard shards them, so at most one unit exists unsharded at once.
    * Scalar parameters: fully_shard rejects 0-dim parameters ("fully_shard doesn't
      support scalar parameters"), as FSDP1 does; FLAVA's ``logit_scale`` is already a
      1-element parameter (models/build.py), so nothing is needed here.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    world = dist.get_world_size()
    if strategy.sharding == "hybrid":
        mesh = _hybrid_mesh(world, strategy.group or 1, device)
    else:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    if prec.autocast_dtype is not None:
        mp = MixedPrecisionPolicy(param_dtype=prec.autocast_dtype, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    shard = partial(fully_shard, mesh=mesh, mp_policy=mp)
    reshard = strategy.sharding != "grad-op"

    def materialize(module: nn.Module) -> None:
        if param_init_fn is None:
            return
        for m in module.modules():
            # Only modules still on meta: a unit sharded before holds DTensors, and the init
            # function's codebook-weights copy into one would mix a plain tensor and a DTensor.
            if any(t.is_meta for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]):
                param_init_fn(m)

    classes = tuple(_unit_classes(model, strategy.ac))
    blocks = _blocks(model)
    units = list(_outermost(model, lambda m: isinstance(uncompiled(m), classes)))
    if groups is not None and knobs.unit_layers > 1:
        firsts = _shard_groups(units, groups, blocks, materialize, partial(shard, reshard_after_forward=reshard))
        materialize(model)
        shard(model)  # the root: see the two TRAPs below
        _set_prefetch(firsts, knobs.prefetch_layers)
        return model
    for _, _, unit in units:
        materialize(unit)
        shard(unit, reshard_after_forward=reshard)
    materialize(model)
    # TRAP: without this root call the root's own parameters (embeddings, heads, norms) are
    # never reduced: the rung trains, but its loss leaves the single-process reference from
    # the third step (anchors.md).
    # TRAP: the root keeps reshard_after_forward=None. Only then does FSDP2 keep the root
    # gathered from forward into backward (it would be all-gathered again at once); an
    # explicit True, as for the blocks, reshards it after forward and gathers it twice.
    shard(model)
    _set_prefetch([[u for p, _, u in units if p is parent and isinstance(block_layer(u), blocks)]
                   for parent in _unique(p for p, _, _ in units)], knobs.prefetch_layers)
    return model


def _shard_groups(units: list[tuple[nn.Module, str, nn.Module]], groups: list[list[nn.Module]],
                  blocks: tuple[type[nn.Module], ...], materialize: Callable[[nn.Module], None],
                  shard: Callable[[nn.Module | list[nn.Module]], object]) -> list[list[nn.Module]]:
    """``fully_shard`` each group of blocks as one unit (the list form), every other unit alone, in
    module order; return each stack's units as their first modules, for the explicit prefetch
    (a grouped unit's modules share one state: any of them stands for the unit)."""
    group_of = {id(b): i for i, g in enumerate(groups) for b in g}
    members: dict[int, list[nn.Module]] = {}
    for _, _, unit in units:
        inner = block_layer(unit)
        if isinstance(inner, blocks) and id(inner) in group_of:
            members.setdefault(group_of[id(inner)], []).append(unit)
    if sorted(members) != list(range(len(groups))) or any(len(members[i]) != len(g) for i, g in enumerate(groups)):
        raise SpecError(f"FSDP2 units of k blocks: the wrapped blocks ({sum(map(len, members.values()))}) are not "
                        f"the {sum(map(len, groups))} blocks of the model's stacks")
    done: set[int] = set()
    for _, _, unit in units:
        inner = block_layer(unit)
        i = group_of.get(id(inner)) if isinstance(inner, blocks) else None
        if i is None:
            materialize(unit)
            shard(unit)
        elif i not in done:
            done.add(i)
            for m in members[i]:
                materialize(m)
            shard(members[i] if len(members[i]) > 1 else members[i][0])
    stacks: dict[int, list[nn.Module]] = {}  # the stack of each group: its first block's parent
    parent_of = {id(u): p for p, _, u in units}
    for i in range(len(groups)):
        stacks.setdefault(id(parent_of[id(members[i][0])]), []).append(members[i][0])
    return list(stacks.values())


def _all_frozen(m: nn.Module) -> bool:
    """Has parameters, and none of them trains (FSDP1 gives such a module a unit of its own)."""
    params = list(m.parameters())
    return bool(params) and not any(p.requires_grad for p in params)


def _unique(items: Iterator[nn.Module]) -> list[nn.Module]:
    seen: dict[int, nn.Module] = {}
    for m in items:
        seen.setdefault(id(m), m)
    return list(seen.values())


def _set_prefetch(stacks: list[list[nn.Module]], depth: int) -> None:
    """Explicit FSDP2 prefetch, ``depth`` layers ahead, within each stack of layers.

    A stack is the layers of one encoder (ViT has one; FLAVA three: image, text,
    multimodal). Within a stack, layer i gathers layers i+1..i+depth when its forward
    starts and, in backward, layers i-1..i-depth (nearest first: FSDP2 issues them in
    list order). Why not across stacks: FLAVA runs the image and text encoders twice per
    step (unmasked, then masked), so the last text layer is followed once by the first
    image layer and once by the first multimodal layer; a static list would gather the
    wrong one half the time and hold it gathered until it runs. Where a layer has no
    explicit backward target (the first of each stack) FSDP2's implicit backward prefetch
    stays on: it prefetches the unit before it in the forward order it recorded, with
    repeated passes counted. ``depth`` 0 sets nothing at all (pf0: FSDP2's defaults).
    """
    if depth == 0:
        return
    for stack in stacks:
        for i, layer in enumerate(stack):
            ahead = stack[i + 1:i + 1 + depth]
            behind = stack[max(0, i - depth):i][::-1]
            if ahead:
                layer.set_modules_to_forward_prefetch(ahead)  # type: ignore[operator]
            if behind:
                layer.set_modules_to_backward_prefetch(behind)  # type: ignore[operator]


def _compile_blocks(model: TrainModule, blocks: tuple[type[nn.Module], ...], backend: str, device: torch.device) -> int:
    """Replace each transformer block (the layer, or its checkpoint wrapper) by
    ``torch.compile(block, backend=backend, fullgraph=True, dynamic=False)``; return how many.

    As torchtitan's ``apply_compile``: the block becomes an ``OptimizedModule`` in its
    parent, so a wrapper applied afterwards (DDP's hooks, FSDP2's unit hooks) runs
    eagerly around the compiled region and never inside it.

    NEVER a silent eager run labelled compiled. The ways torch.compile falls back to
    eager without an error, and what closes each:
    * a graph break: ``fullgraph=True`` makes it an error;
    * a compile error: ``suppress_errors`` (``TORCHDYNAMO_SUPPRESS_ERRORS``) would run the
      frame eagerly; forced off here;
    * the recompile limit: past it Dynamo runs the frame eagerly; made an error;
    * Dynamo disabled (``TORCH_COMPILE_DISABLE=1``): refused, one line;
    * inductor without a C++ compiler on the CPU: refused up front, one line.
    Dynamo's caches are reset so the rung compiles from scratch: its compile time and
    graph count are its own (rung.loop records ``compile_s``, ``compile_graphs``).
    """
    import torch._dynamo

    if backend not in COMPILE_BACKENDS:
        raise SpecError(f"compile backend {backend!r}: expected one of {', '.join(COMPILE_BACKENDS)}")
    if torch._dynamo.config.disable:
        raise SpecError("torch.compile is disabled in this process (TORCH_COMPILE_DISABLE=1): a -compile rung would run eager")
    if backend == "inductor" and device.type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as e:  # InvalidCxxCompiler: no g++/clang++ on PATH
            raise SpecError(f"inductor needs a C++ compiler on the CPU ({type(e).__name__}); install g++, "
                            f"or run --compile-backend aot_eager (graph capture without code generation)") from None
    torch._dynamo.reset()
    torch._dynamo.config.suppress_errors = False
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    # DDP's graph splitting (DDPOptimizer) is for a model compiled whole under DDP; here
    # each block is its own graph and DDP's reducer hooks run between blocks, eagerly.
    torch._dynamo.config.optimize_ddp = False
    for parent, name, block in list(_outermost(model, lambda m: isinstance(block_layer(m), blocks))):
        # dynamic=False: a rung's shapes are fixed (one batch), so each block shape gets a static
        # graph. TRAP: blocks of different widths share one forward (ConvNeXt's four stages), and
        # Dynamo's automatic dynamic shapes then recompile it symbolic, which inductor can fail on
        # ("cannot determine truth value of Relational": timm's convnext_atto, torch 2.14).
        setattr(parent, name, torch.compile(block, backend=backend, fullgraph=True, dynamic=False))
    return count_compiled(model)


def apply_strategy(
    model: TrainModule,
    strategy: Strategy,
    knobs: AnyKnobs,
    prec: PrecisionPolicy,
    device: torch.device,
    param_init_fn: Callable[[nn.Module], None] | None = None,
    compile_backend: str = "inductor",
) -> tuple[nn.Module, WrapReport]:
    """AC, then compile, then DDP or FSDP1/FSDP2. The process group must be initialised.

    ``compile_backend`` is used only by ``-compile`` strategies (and then recorded)."""
    world = dist.get_world_size()
    strategy.check_world(world)
    if strategy.is_fsdp2 and not isinstance(knobs, Fsdp2Knobs) or strategy.is_fsdp1 and not isinstance(knobs, Knobs):
        raise SpecError(f"knobs {str(knobs)!r} are not {str(strategy)!r}'s generation of FSDP (spec.default_knobs)")
    blocks = _blocks(model)
    named = _qualname(*blocks)
    layers = count_layers(model, blocks)
    if layers == 0 and (strategy.ac or strategy.is_fsdp or strategy.compile):
        raise SpecError(f"{model.flavor.name} has no {named} to checkpoint, compile or wrap: wrong layer class")
    groups = _groups_for(model, strategy, knobs)
    stack_sizes = [len(s) for s in family_of(model.flavor).stacks(model)] if groups is not None else []
    frozen = freeze_unused(model)
    ac_layers = _checkpoint(model, strategy.reentrant, strategy.selective, blocks) if strategy.ac else 0
    if ac_layers != (layers if strategy.ac else 0):
        raise SpecError(f"activation checkpointing wrapped {ac_layers} of the {layers} {named} in {model.flavor.name}")
    compiled = _compile_blocks(model, blocks, compile_backend, device) if strategy.compile else 0
    if compiled != (layers if strategy.compile else 0):
        raise SpecError(f"torch.compile wrapped {compiled} of the {layers} {named} in {model.flavor.name}")
    backend = compile_backend if strategy.compile else ""
    if strategy.wrapper == "single":
        return model.to(device), WrapReport(0, 0, ac_layers, frozen, compiled, backend)
    if strategy.wrapper == "ddp":
        model = model.to(device)
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids), WrapReport(0, 0, ac_layers, frozen, compiled, backend)
    if strategy.is_fsdp2:
        # No model.to(device) first: like FSDP1 with device_id, fully_shard moves each unit
        # to the mesh's device as it shards it, so the model never sits there whole.
        wrapped = wrap_fsdp2(model, strategy, knobs, prec, device, param_init_fn, groups)  # type: ignore[arg-type]
    else:
        wrapped = wrap_fsdp(model, strategy, knobs, prec, device, param_init_fn)  # type: ignore[arg-type]
    if groups is not None:
        # units of k: every block in a unit, each unit k blocks of one stack (the last the remainder)
        sizes = fsdp_layer_unit_sizes(wrapped, blocks)
        k = knobs.unit_layers
        want = [min(k, n - i) for n in stack_sizes for i in range(0, n, k)]
        if sizes != want or sum(sizes) != layers:
            raise SpecError(f"the FSDP2 units of {knobs.unit_layers} blocks hold {sizes} of the {layers} {named} "
                            f"in {model.flavor.name}, not {want}")
        return wrapped, WrapReport(count_fsdp_units(wrapped), len(sizes), ac_layers, frozen, compiled, backend)
    layer_units = count_fsdp_layer_units(wrapped, blocks)
    if layer_units != layers:
        raise SpecError(f"the FSDP wrap policy gave {layer_units} of the {layers} {named} "
                        f"in {model.flavor.name} a unit of their own")
    return wrapped, WrapReport(count_fsdp_units(wrapped), layer_units, ac_layers, frozen, compiled, backend)


def _groups_for(model: TrainModule, strategy: Strategy, knobs: AnyKnobs) -> list[list[nn.Module]] | None:
    """The units of k blocks the knobs ask for (None: a unit per block, the seeds' wrapping, as it was).
    Refused in one line: k on a rung that is not FSDP2 (spec.check_unit_knobs), k larger than a stack."""
    k = knobs.unit_layers
    if k == 1:
        return None
    check_unit_knobs(strategy, knobs)
    stacks = family_of(model.flavor).stacks(model)  # before AC and compile wrap the blocks
    check_unit_layers(model.flavor.name, knobs, [len(s) for s in stacks])
    return unit_groups(stacks, k)


def _blocks(model: TrainModule) -> tuple[type[nn.Module], ...]:
    """The family's block classes (models/family.py), in a fixed order: what AC checkpoints,
    ``-compile`` compiles and FSDP wraps, and what the proofs count."""
    return tuple(sorted(family_of(model.flavor).block_classes(model), key=_qualname))


def _qualname(*classes: type) -> str:
    # Two torchmultimodal classes are both called TransformerEncoderLayer: name the module.
    return ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in classes)
