"""What each precision name means, in one table.

| name        | storage (params, grads, Adam) | compute            | FSDP MixedPrecision (param/reduce/buffer) | scaler |
|-------------|-------------------------------|--------------------|-------------------------------------------|--------|
| fp32        | fp32                          | fp32, TF32 off     | none                                      | no     |
| tf32        | fp32                          | TF32 matmuls       | none                                      | no     |
| bf16-mixed  | fp32                          | autocast bf16, TF32 on | bf16 / fp32 / fp32                        | no     |
| fp16-mixed  | fp32                          | autocast fp16, TF32 on | fp16 / fp32 / fp32                        | yes (ShardedGradScaler under FSDP) |
| bf16-true   | bf16 params/grads; fp32 master weights + fp32 Adam in the optimizer | bf16 | none (already bf16) | no |

bf16-true keeps fp32 master weights in the optimizer (optim.MasterWeightAdamW): with a
bf16 AdamW state an lr 1e-4 update is below half a bf16 step for |w| > ~0.026, so most
weights never moved and the precision did not train (docs/strategies.md).

TF32 is on under the mixed modes because the FLAVA seed ran that way (bf16
autocast + TF32 on A100); it only touches the few matmuls autocast leaves fp32.

Why reduce in fp32: DDP all-reduces fp32 gradients under autocast, so FSDP
does the same and the two differ only in how they shard, not in what they sum.
The bf16 param dtype under FSDP halves the all-gather volume, which is what
the FSDP seeds measured.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    autocast_dtype: torch.dtype | None
    storage_dtype: torch.dtype
    allow_tf32: bool
    scaler: bool

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def fsdp_mixed_precision(self) -> Any:
        from torch.distributed.fsdp import MixedPrecision

        if self.autocast_dtype is None:
            return None
        return MixedPrecision(param_dtype=self.autocast_dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32)

    def apply_backend_flags(self) -> None:
        # Set both ways on purpose: a previous rung in the same process must not leak TF32 in.
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        torch.backends.cudnn.allow_tf32 = self.allow_tf32


POLICIES: dict[str, PrecisionPolicy] = {
    "fp32": PrecisionPolicy("fp32", None, torch.float32, False, False),
    "tf32": PrecisionPolicy("tf32", None, torch.float32, True, False),
    "bf16-mixed": PrecisionPolicy("bf16-mixed", torch.bfloat16, torch.float32, True, False),
    "fp16-mixed": PrecisionPolicy("fp16-mixed", torch.float16, torch.float32, True, True),
    "bf16-true": PrecisionPolicy("bf16-true", None, torch.bfloat16, False, False),
}


def policy(name: str) -> PrecisionPolicy:
    return POLICIES[name]  # names were validated by spec.parse_precision
