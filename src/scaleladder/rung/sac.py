"""Selective activation checkpointing (``-sac``): which ops' outputs a checkpointed layer keeps.

Op-level, as torchtitan's ``SelectiveAC`` (torchtitan/distributed/activation_checkpoint.py):
the layer runs under ``torch.utils.checkpoint`` with a ``context_fn`` from
``create_selective_checkpoint_contexts``; the outputs of the compute-intensive ops
(:data:`SAVE_OPS`: matmuls and fused attention) are kept from the forward, everything else
(LayerNorm, GELU, softmax, adds, casts, copies) is recomputed in backward from them. The
policy is fixed, not chosen under a memory budget: why, and what the planner counts,
in docs/strategies.md, "Selective checkpointing (-sac)".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Every aten op whose outputs -sac keeps: what a TorchDispatchMode sees of a Linear (aten.linear
# is CompositeImplicit: addmm for 2-D/flattened 3-D inputs with bias, mm without, bmm for
# matmul's batched case), of FLAVA's attention matmuls, and of every SDPA backend. Named as
# strings and resolved on the installed torch, so an op a version lacks is skipped (the
# package runs on torch >= 2.4: a GPU machine's 2.11 as well as 2.14 here).
SAVE_OP_NAMES: tuple[str, ...] = (
    "mm", "addmm", "bmm", "baddbmm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)


def save_ops() -> frozenset[Any]:
    """The ``OpOverload``s of :data:`SAVE_OP_NAMES` this torch has."""
    ops = []
    for name in SAVE_OP_NAMES:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.append(packet.default)
    return frozenset(ops)


def _policy(saved: frozenset[Any]) -> Callable[..., Any]:
    from torch.utils.checkpoint import CheckpointPolicy

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        # MUST_SAVE, not PREFER_SAVE: under torch.compile PREFER_* lets the partitioner
        # override the choice, and the planner counts exactly these outputs.
        return CheckpointPolicy.MUST_SAVE if func in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def context_fn() -> Callable[[], tuple[Any, Any]]:
    """The ``context_fn`` to hand ``checkpoint_wrapper`` (a fresh pair of contexts per call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    policy = _policy(save_ops())
    return lambda: create_selective_checkpoint_contexts(policy)
