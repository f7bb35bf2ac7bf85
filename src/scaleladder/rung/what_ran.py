"""What ran: the wrapped model read back, never the spec.

Counts of what wrapping built (checkpointed, compiled and FSDP units, layers, and the blocks each
FSDP unit holds: :func:`fsdp_layer_unit_sizes`), with which ``rung/parallelize.py`` proves that a
policy missed no layer and grouped them in units of k (knobs ``-u<k>``), and :func:`sharding_ran`: what
the data-parallel wrapper actually does on this rank, read from torch's own (private)
attributes of the wrapped model (record attributes ``Build.sharding_ran`` and
``Build.param_shard_fraction``: results/record.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from scaleladder.results.record import Build


def count_checkpointed(model: nn.Module) -> int:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return sum(isinstance(m, CheckpointWrapper) for m in model.modules())


def count_fsdp_units(model: nn.Module) -> int:
    """FSDP1 instances plus FSDP2 units (modules fully_shard swapped to an FSDPModule class; a
    grouped ``fully_shard([a, b, ...])`` swaps each of its modules and is one unit: one state)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    fsdp1 = sum(isinstance(m, FSDP) for m in model.modules())
    return fsdp1 + len({id(m._get_fsdp_state()) for m in model.modules() if isinstance(m, FSDPModule)})


#: A block class, or several (a family's ``block_classes``, as a tuple for isinstance).
Blocks = type[nn.Module] | tuple[type[nn.Module], ...]


def count_layers(model: nn.Module, layer_cls: Blocks) -> int:
    return sum(isinstance(m, layer_cls) for m in model.modules())


def count_compiled(model: nn.Module) -> int:
    from torch._dynamo.eval_frame import OptimizedModule

    return sum(isinstance(m, OptimizedModule) for m in model.modules())


def uncompiled(m: nn.Module) -> nn.Module:
    """The module torch.compile wrapped (``OptimizedModule._orig_mod``), else ``m``."""
    from torch._dynamo.eval_frame import OptimizedModule

    return m._orig_mod if isinstance(m, OptimizedModule) else m


def block_layer(m: nn.Module) -> nn.Module:
    """What a block holds: through compile's OptimizedModule, then AC's CheckpointWrapper."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    inner = uncompiled(m)
    if isinstance(inner, CheckpointWrapper):
        inner = inner._checkpoint_wrapped_module
    return inner


def count_fsdp_layer_units(model: nn.Module, layer_cls: Blocks) -> int:
    """FSDP units that wrap exactly one transformer layer, bare, checkpointed or compiled.

    FSDP1: ``FSDP(layer)`` / ``FSDP(CheckpointWrapper(layer))``, the layer is ``unit.module``.
    FSDP2: fully_shard keeps the module and swaps its class (``FSDP<Class>``), so the unit
    IS the block: the layer, its checkpoint wrapper, or compile's OptimizedModule.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    n = 0
    for m in model.modules():
        if isinstance(m, FSDP):
            n += isinstance(block_layer(m.module), layer_cls)
        elif isinstance(m, FSDPModule):
            n += isinstance(block_layer(m), layer_cls)
    return n


def fsdp_layer_unit_sizes(model: nn.Module, layer_cls: Blocks) -> list[int]:
    """The blocks each FSDP unit holds, for the units that hold blocks, in module order.

    FSDP1: one per ``FSDP(layer)`` (always 1 here: FSDP1 does not group, spec.FSDP1_UNIT_REFUSAL).
    FSDP2: the modules of one unit share one state, so a grouped ``fully_shard([b_i, ..., b_{i+k-1}])``
    is one entry of k; each of its modules is a block (bare, checkpointed or compiled). A unit that
    mixed a block with anything else would not be counted as holding blocks, and the proof in
    ``rung/parallelize.py`` would fail.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    sizes: dict[int, int] = {}
    order: list[int] = []
    for m in model.modules():
        if isinstance(m, FSDP):
            if isinstance(block_layer(m.module), layer_cls):
                order.append(id(m))
                sizes[id(m)] = 1
        elif isinstance(m, FSDPModule) and isinstance(block_layer(m), layer_cls):
            key = id(m._get_fsdp_state())
            if key not in sizes:
                order.append(key)
                sizes[key] = 0
            sizes[key] += 1
    return [sizes[k] for k in order]


def sharding_ran(model: nn.Module) -> dict[str, Any]:
    """What the data-parallel wrapper actually does on this rank, read from the WRAPPED
    model, never from the spec (record attributes ``Build.sharding_ran``,
    ``Build.param_shard_fraction``: results/record.py).

    TRAP (torch FSDP1, ``_init_utils._init_core_state``): at world size 1 FSDP1 silently
    replaces FULL_SHARD and SHARD_GRAD_OP with NO_SHARD (a warning only), so one-GPU
    ``fsdp-full``, ``fsdp-grad-op`` and ``fsdp-no-shard`` rungs run the same strategy; their
    records say ``fsdp1:NO_SHARD``. FSDP2 (``fully_shard``) keeps its schedule on a one-rank
    mesh (it still copies each unit into an unsharded buffer before use and, with
    reshard-after-forward, frees it after forward) but shards over 1 rank: it holds the
    whole model, ``param_shard_fraction`` 1.0.

    * ``sharding_ran``: ``none`` (single), ``ddp``, ``fsdp1:<ShardingStrategy>`` (the
      strategies of all units, ``+``-joined if they differ), or
      ``fsdp2:shard<S>[xreplicate<R>]:<reshard|keep>`` (the block units' mesh and
      reshard-after-forward; the root never reshards after forward and is not counted).
    * ``param_shard_fraction``: parameter elements this rank holds ÷ the model's (padding
      excluded); 1.0 where nothing is sharded.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, nn.parallel.DistributedDataParallel):
        return {Build.sharding_ran: "ddp", Build.param_shard_fraction: 1.0}
    fsdp1 = [m for m in model.modules() if isinstance(m, FSDP)]
    if fsdp1:
        names = sorted({m.sharding_strategy.name for m in fsdp1})
        local = full = 0
        for m in fsdp1:
            handle = m._handle
            if handle is None:  # a unit with no parameters of its own
                continue
            flat = handle.flat_param
            full += flat._unpadded_unsharded_size.numel()
            # the shard's padding is not model state; the unpadded count is what the rank owns
            local += flat.numel() - int(getattr(flat, "_shard_numel_padded", 0))
        return {Build.sharding_ran: "fsdp1:" + "+".join(names), Build.param_shard_fraction: local / full if full else 1.0}
    fsdp2 = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if fsdp2:
        kinds = set()
        for unit in fsdp2:
            if unit is model:
                continue  # the root: FSDP2 never reshards it after forward
            group = unit._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            # an FSDPMeshInfo (HSDPMeshInfo on a hybrid mesh); torch types the field as their base class
            info: Any = group.mesh_info
            mesh = f"shard{info.shard_mesh_size}"
            if hasattr(info, "replicate_mesh_size"):
                mesh += f"xreplicate{info.replicate_mesh_size}"
            kinds.add(f"{mesh}:{'reshard' if group.post_forward_mesh_info is not None else 'keep'}")
        local = full = 0
        for p in model.parameters():
            full += p.numel()
            local += p._local_tensor.numel() if hasattr(p, "_local_tensor") else p.numel()
        return {Build.sharding_ran: "fsdp2:" + "+".join(sorted(kinds)), Build.param_shard_fraction: local / full if full else 1.0}
    return {Build.sharding_ran: "none", Build.param_shard_fraction: 1.0}
