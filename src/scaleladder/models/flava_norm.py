"""FLAVA's LayerNorms in fp32 without the casts that change nothing.

TorchMultimodal's ``Fp32LayerNorm`` always runs ``layer_norm(x.float(), w.float(), b.float())``
and casts the result back with ``type_as(x)``: five dispatched ops where one computes. In most
runs the casts are identities or happen anyway:

* fp32 input and fp32 parameters (fp32, tf32, and the fp32 residual stream under autocast
  with fp32 parameters): every ``.float()`` and the ``type_as`` return their input;
* CUDA (and ROCm) autocast lists ``layer_norm`` among its fp32 ops: it casts the input and
  parameters to fp32 itself, exactly as the explicit casts did.

Only then are the casts dropped. Everywhere else the explicit fp32 computation stays, because
there it is what keeps LayerNorm in fp32:

* ``bf16-true`` (no autocast, bf16 parameters): ``layer_norm`` on bf16 tensors would be a bf16
  kernel with its own rounding;
* TRAP: CPU autocast does NOT list ``layer_norm`` (torch 2.14): a bf16 input stays bf16
  there, so CPU bf16-mixed keeps the casts and the CPU parity test still sees the same numbers.

The output keeps the input's dtype, as ``type_as(x)`` did, so what reads it (and what the
planner counts) is unchanged: under CUDA autocast with a bf16 stream the one cast back to bf16
is the cast the next Linear would otherwise make, once per Linear.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torchmultimodal.modules.layers.normalizations import Fp32LayerNorm


def _casts_change_nothing(x: Tensor, norm: nn.LayerNorm) -> bool:
    params = [p for p in (norm.weight, norm.bias) if p is not None]
    if x.dtype == torch.float32 and all(p.dtype == torch.float32 for p in params):
        return True
    return x.device.type == "cuda" and torch.is_autocast_enabled("cuda")


def fp32_layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """``Fp32LayerNorm.forward``'s result (value and dtype) with only the casts that matter."""
    w, b = norm.weight, norm.bias
    if _casts_change_nothing(x, norm):
        out = F.layer_norm(x, norm.normalized_shape, w, b, norm.eps)
    else:
        out = F.layer_norm(x.float(), norm.normalized_shape, None if w is None else w.float(),
                           None if b is None else b.float(), norm.eps)
    return out if out.dtype == x.dtype else out.to(x.dtype)


class CastFreeLayerNorm(Fp32LayerNorm):
    """An ``Fp32LayerNorm`` (same parameters, same class for ``isinstance``) without redundant casts."""

    def forward(self, x: Tensor) -> Tensor:
        return fp32_layer_norm(self, x)


def install(root: nn.Module) -> int:
    """Switch every ``Fp32LayerNorm`` under ``root`` to :class:`CastFreeLayerNorm`; how many."""
    n = 0
    for m in root.modules():
        if type(m) is Fp32LayerNorm:
            m.__class__ = CastFreeLayerNorm
            n += 1
    return n
