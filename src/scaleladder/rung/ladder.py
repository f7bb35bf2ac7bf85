"""The ladder: one function applies a strategy to a model.

Order is fixed (torchtitan's): activation checkpointing first, then the data-
parallel wrapper. With FSDP the auto-wrap policy then wraps each *checkpointed*
layer, giving ``FSDP(CheckpointWrapper(layer))`` — the structure PyTorch's own
FSDP+AC tests use: the recompute in backward runs inside an FSDP unit whose
parameters the pre-backward hook has already gathered.

Proof that wrapping happened is part of the result: the number of FSDP units,
of units that hold a transformer layer, and of checkpointed layers is recorded,
and a policy that misses any layer raises. Counting all units is not enough:
FLAVA's codebook is always a unit of its own, so a wrong layer class (the trap
of the FLAVA blog's class name) still gives root + codebook = 2 units — an
"FSDP" that shards nothing per layer. So every layer_cls instance must sit in
its own unit (``FSDP(layer)``, or ``FSDP(CheckpointWrapper(layer))`` under AC),
and under AC every one must be checkpointed.

FLAVA and DDP: FLAVA pretraining never uses some parameters (the unimodal
MLM/MIM heads, the encoders' poolers when the multimodal path is taken).
Instead of ``find_unused_parameters=True`` — a graph walk every step — we find
them once, structurally, on the flavor's layout and freeze them, so DDP's
reducer never waits for them. They would get no gradient anyway, so the math
is unchanged; their count is recorded as ``frozen_unused_params``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from scaleladder.models.build import TrainModule
from scaleladder.rung.precision import PrecisionPolicy
from scaleladder.spec import Knobs, SpecError, Strategy


@dataclass(frozen=True)
class LadderReport:
    fsdp_units: int  # every FSDP instance, the root included
    fsdp_layer_units: int  # FSDP units whose module is a transformer layer (or its checkpoint wrapper)
    ac_layers: int
    frozen_unused_params: int


def _checkpoint(model: TrainModule) -> int:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    # NO_REENTRANT: reentrant checkpointing under DDP fails with "mark a variable
    # ready only once" (multimodal #404) and ignores inputs that need no grad.
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, model.layer_cls),
    )
    return count_checkpointed(model)


def count_checkpointed(model: nn.Module) -> int:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return sum(isinstance(m, CheckpointWrapper) for m in model.modules())


def count_fsdp_units(model: nn.Module) -> int:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return sum(isinstance(m, FSDP) for m in model.modules())


def count_layers(model: nn.Module, layer_cls: type[nn.Module]) -> int:
    return sum(isinstance(m, layer_cls) for m in model.modules())


def count_fsdp_layer_units(model: nn.Module, layer_cls: type[nn.Module]) -> int:
    """FSDP units that wrap exactly one transformer layer, bare or checkpointed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    n = 0
    for m in model.modules():
        if not isinstance(m, FSDP):
            continue
        inner = m.module
        if isinstance(inner, CheckpointWrapper):
            inner = inner._checkpoint_wrapped_module
        n += isinstance(inner, layer_cls)
    return n


def _unit_classes(model: TrainModule, ac: bool) -> set[type[nn.Module]]:
    """Modules that become their own FSDP unit."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    classes: set[type[nn.Module]] = {CheckpointWrapper if ac else model.layer_cls}
    if model.flavor.family == "flava":
        from torchmultimodal.models.flava.model import DalleVAEEncoder

        # The frozen codebook is a unit of its own: FSDP1 flattens a unit's parameters
        # into one tensor, which must not mix frozen and trained parameters.
        classes.add(DalleVAEEncoder)
    return classes


def _hybrid_mesh(world: int, group: int, device: torch.device) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    # Rows replicate, columns shard: ranks 0..g-1 shard one replica (ORNL's
    # arange(world).view(-1, g)). On Frontier the g closest GCDs are consecutive ranks.
    return init_device_mesh(device.type, (world // group, group), mesh_dim_names=("replicate", "shard"))


def wrap_fsdp(
    model: TrainModule,
    strategy: Strategy,
    knobs: Knobs,
    prec: PrecisionPolicy,
    device: torch.device,
    param_init_fn: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

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
    return FSDP(
        model,
        sharding_strategy=sharding,
        auto_wrap_policy=ModuleWrapPolicy(_unit_classes(model, strategy.ac)),
        mixed_precision=prec.fsdp_mixed_precision(),
        backward_prefetch=prefetch,
        forward_prefetch=knobs.forward_prefetch,
        limit_all_gathers=knobs.limit_all_gathers,
        use_orig_params=True,  # plain parameter names/grad access for the optimizer and the planner checks
        device_id=device,
        **extra,
    )


def freeze_unused(model: TrainModule) -> int:
    """Freeze the parameters FLAVA pretraining never uses; return how many elements."""
    if model.flavor.family != "flava":
        return 0
    unused = unused_parameter_names(model.flavor.family)
    n = 0
    for name, p in model.named_parameters():
        if name in unused and p.requires_grad:
            p.requires_grad_(False)
            n += p.numel()
    return n


_UNUSED_CACHE: dict[str, frozenset[str]] = {}


def unused_parameter_names(family: str) -> frozenset[str]:
    """Parameter names that get no gradient in one training step, found once on the
    family's debug flavor (names are structural: heads and poolers, not layers).

    The probe is a forward and backward ON THE CPU, so it must run before the process
    group exists (rung.run._main calls this first). TRAP: FLAVA's contrastive loss
    all-gathers whenever a group exists; an NCCL/RCCL group serves only GPU tensors and
    fails on the probe's CPU tensors ("No backend type associated with device type
    cpu") before the rung's first step, for every strategy. gloo accepts CPU tensors,
    so on the CPU this ordering error is invisible: hence the refusal below, which a
    CPU test can see.
    """
    if family not in _UNUSED_CACHE:
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError(f"the unused-parameter probe for {family} must run before the process group exists: "
                               "its CPU forward would issue collectives on CPU tensors, which NCCL/RCCL refuse")
        from scaleladder.rung.batches import synthetic_batch
        from scaleladder.models.build import build_model
        from scaleladder.models.flavors import get_flavor

        debug = get_flavor(f"{family}-debug")
        with torch.random.fork_rng():
            torch.manual_seed(0)
            probe = build_model(debug, "cpu")
        probe(synthetic_batch(debug, 10, 0, 0, 0)).backward()
        _UNUSED_CACHE[family] = frozenset(n for n, p in probe.named_parameters() if p.requires_grad and p.grad is None)
    return _UNUSED_CACHE[family]


def apply_strategy(
    model: TrainModule,
    strategy: Strategy,
    knobs: Knobs,
    prec: PrecisionPolicy,
    device: torch.device,
    param_init_fn: Callable[[nn.Module], None] | None = None,
) -> tuple[nn.Module, LadderReport]:
    """AC, then DDP or FSDP. The process group must be initialised."""
    world = dist.get_world_size()
    strategy.check_world(world)
    layers = count_layers(model, model.layer_cls)
    if layers == 0 and (strategy.ac or strategy.is_fsdp):
        raise SpecError(f"{model.flavor.name} has no {_qualname(model.layer_cls)} to checkpoint or wrap: wrong layer class")
    frozen = freeze_unused(model)
    ac_layers = _checkpoint(model) if strategy.ac else 0
    if ac_layers != (layers if strategy.ac else 0):
        raise SpecError(f"activation checkpointing wrapped {ac_layers} of the {layers} {_qualname(model.layer_cls)} in {model.flavor.name}")
    if strategy.wrapper == "single":
        return model.to(device), LadderReport(0, 0, ac_layers, frozen)
    if strategy.wrapper == "ddp":
        model = model.to(device)
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids), LadderReport(0, 0, ac_layers, frozen)
    wrapped = wrap_fsdp(model, strategy, knobs, prec, device, param_init_fn)
    layer_units = count_fsdp_layer_units(wrapped, model.layer_cls)
    if layer_units != layers:
        raise SpecError(f"the FSDP wrap policy gave {layer_units} of the {layers} {_qualname(model.layer_cls)} "
                        f"in {model.flavor.name} a unit of their own")
    return wrapped, LadderReport(count_fsdp_units(wrapped), layer_units, ac_layers, frozen)


def _qualname(cls: type) -> str:
    # Two torchmultimodal classes are both called TransformerEncoderLayer: name the module.
    return f"{cls.__module__}.{cls.__qualname__}"
