"""The rung's optimizer and its step: fused AdamW, with no host sync, in every precision
and on every device (the CPU included, so the tests run the GPUs' code path).

Fused AdamW keeps each parameter's ``step`` counter on the parameter's device (a 0-dim
fp32 tensor), unlike foreach AdamW, which keeps it on the host. fp16-mixed takes
FSDP1's sharded scaler (its flag clamped, TRAPs below), FSDP2 and the rest the plain one;
bf16-true trains through fp32 masters (:class:`MasterWeightAdamW`).
Why: docs/strategies.md, "Precision" and "Traps we hit and how each is handled".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from scaleladder.spec import Strategy


class _InnerAdamW:
    """An optimizer that steps a fused ``torch.optim.AdamW`` of its own (``self.inner``).

    torch's FSDPMemTracker (``plan --check``, campaign/plan_check.py) hooks the optimizer's step
    to tell optimizer state from other memory: the hooks go on the inner AdamW, whose step is
    the real one and whose state is what the rank keeps."""

    inner: torch.optim.AdamW
    params: list[Tensor]  # what the rung trains (the optimizer's own tensors may be others)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> Any:
        return self.inner.state

    def register_step_pre_hook(self, hook: Any) -> Any:
        return self.inner.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Any) -> Any:
        return self.inner.register_step_post_hook(hook)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


class MasterWeightAdamW(_InnerAdamW):
    """AdamW for bf16 parameters that keeps fp32 master weights and fp32 moments.

    The fault it fixes: with bf16 weights and a bf16 AdamW state an update of lr 1e-4
    is below half a bf16 step (2^-8 relative) for any |w| above about 0.026, every
    LayerNorm weight included, so most weights never move and the loss barely falls.
    Here the model's parameters, gradients, activations and collectives stay bf16 (what
    ``bf16-true`` measures), and the optimizer owns an fp32 copy of each trainable
    parameter with fp32 ``exp_avg``/``exp_avg_sq``: 12 bytes of optimizer state per
    element (bf16 AdamW had 4). Each step copies the gradients to fp32 (a transient 4
    bytes per element), runs the fused AdamW on the masters and rounds them back into
    the bf16 parameters. Compensated (Kahan) or stochastic rounding would save the
    master copy; fp32 masters are the standard, simplest to verify, choice.

    Works on each rank's shard: FSDP1's FlatParameters (their local chunk, padding included;
    the original parameters' views under ``-ac-reentrant``, which keeps ``use_orig_params``),
    and the local tensors of FSDP2's DTensor parameters and gradients. TRAP: DTensor has no
    sharding rule for ``_foreach_copy_`` ("Operator aten._foreach_copy_.default does not
    have a sharding strategy registered"), and the update is elementwise anyway, so the
    masters are plain tensors over the local shard and every copy goes through
    :func:`_local`. The local tensors are looked up at each step, not kept: FSDP2 may
    re-point a parameter's local tensor after its lazy init.
    """

    _step_supports_amp_scaling = False  # bf16-true has no grad scaler

    def __init__(self, params: Iterable[Tensor], lr: float) -> None:
        self.params = list(params)
        self.masters = [_local(p).detach().float() for p in self.params]
        self.inner = torch.optim.AdamW(self.masters, lr=lr, fused=True)

    @torch.no_grad()
    def step(self) -> None:
        live = [(p, g, m) for p, m in zip(self.params, self.masters) if (g := p.grad) is not None]
        if not live:
            return
        for _, g, m in live:
            m.grad = _local(g).float()
        self.inner.step()
        params, _, masters = zip(*live)
        torch._foreach_copy_([_local(p) for p in params], list(masters))  # rounds fp32 -> bf16 in one launch
        for m in masters:
            m.grad = None  # the fp32 gradient copies live only for the step


class LocalShardAdamW(_InnerAdamW):
    """Fused AdamW over the local shards of FSDP2's DTensor parameters (not fp16-mixed).

    The same update as ``torch.optim.AdamW(dtensor_params, fused=True)``, elementwise on
    each rank's shard, without DTensor's dispatch: handed DTensors, every one of the
    step's ``_fused_adamw_``/``_foreach_*`` calls goes through DTensor's sharding
    propagation in Python, which made the optimizer step 3.1 ms of host time against
    0.6 ms on plain tensors (a vit-base skeleton, ``benchmarks/bench_host.py``). Each step points every local
    shard's ``.grad`` at its DTensor gradient's local tensor (views, no copy) and steps
    them. The state (moments, step counters) is per local shard, what it was over DTensors
    (planner.static's FSDP2 counts hold; tests/test_plan_exact.py).

    TRAP: not under fp16-mixed. GradScaler's ``unscale_`` checks the gradients the
    optimizer holds for infs; over DTensors that check is a MAX over the mesh, over local
    shards it would be each rank's own, and the ranks could disagree on skipping a step.
    """

    def __init__(self, params: Iterable[Tensor], lr: float) -> None:
        self.params = list(params)
        self.inner = torch.optim.AdamW([_local(p) for p in self.params], lr=lr, fused=True)

    @torch.no_grad()
    def step(self) -> None:
        group = self.inner.param_groups[0]
        if not self.inner.state:
            # FSDP2's lazy init (the first forward) may re-point a shard; no state yet to move.
            group["params"] = [_local(p) for p in self.params]
        for p, shard in zip(self.params, group["params"]):
            g = p.grad
            shard.grad = None if g is None else _local(g)
        self.inner.step()
        for shard in group["params"]:
            shard.grad = None  # the DTensor gradient keeps the storage; no second reference


def _local(t: Tensor) -> Tensor:
    """This rank's shard of a DTensor (FSDP2's parameters and gradients), else ``t``.
    ``_local_tensor`` is the shard itself: writing into it updates the parameter.

    Read as DTensor's slot, not ``isinstance(t, DTensor)``: that needs the import inside the
    function (rung.optim imports no torch.distributed at load), which cost ~4 Python calls
    per tensor, 2 tensors per parameter every step (~250 calls a vit-debug step).
    """
    local = getattr(t, "_local_tensor", None)
    return t if local is None else local


def make_optimizer(params: Iterable[Tensor], lr: float, precision: str) -> Any:
    """The optimizer every rung uses (bench_rung and the planner's checks too)."""
    from torch.distributed.tensor import DTensor

    trainable = [p for p in params if p.requires_grad]
    if precision == "bf16-true":
        return MasterWeightAdamW(trainable, lr)
    if precision != "fp16-mixed" and trainable and all(isinstance(p, DTensor) for p in trainable):
        return LocalShardAdamW(trainable, lr)  # FSDP2
    return torch.optim.AdamW(trainable, lr=lr, fused=True)


def _sharded_scaler(device: torch.device) -> Any:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class ShardedScalerForFused(ShardedGradScaler):
        """ShardedGradScaler whose all-reduced inf flag a fused optimizer accepts.

        TRAP (torch 2.14): ShardedGradScaler.unscale_ makes its flags with shape [1];
        GradScaler's are 0-dim. The fused Adam kernel's epilogue subtracts the flag from
        each 0-dim ``step`` counter in place (``_foreach_sub_``), which fails with
        "output with shape [] doesn't match the broadcast shape [1]" on the first step
        that found an inf. The flags are reshaped (views, no copy, no sync) to 0-dim.
        """

        def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
            super().unscale_(optimizer)
            state = self._per_optimizer_states[id(optimizer)]
            # 0-dim (see above), and at most 1. TRAP 2 (FSDP1 ShardedGradScaler + a fused
            # optimizer): the all-reduce in unscale_ SUMS the flags, so when k ranks find an
            # inf the flag is k. The fused AdamW kernel skips the update only when the flag is
            # exactly 1.0 (torch 2.14, CPU and CUDA): with two or more ranks seeing infs (an
            # overflow in the loss reaches every rank) it applies the inf/NaN update and
            # subtracts k from every step counter. Measured on 2 gloo ranks before the fix:
            # weights NaN, step counter -1. Clamped to 1 in place, on the device, no sync.
            state["found_inf_per_device"] = {d: f.reshape(()).clamp_(max=1.0) for d, f in state["found_inf_per_device"].items()}

        def _amp_update_scale_cpu_(self, found_inf: torch.Tensor) -> None:
            # On the CPU ShardedGradScaler.update takes a Python path that reads the flag
            # (.item()); GPUs take torch._amp_update_scale_, which runs on the CPU as well
            # (GradScaler("cpu") uses it). Taking it here keeps the CPU on the GPU's path,
            # so the tests' sync counter sees what a GPU would.
            assert self._scale is not None and self._growth_tracker is not None  # made by scale() before any update
            torch._amp_update_scale_(self._scale, self._growth_tracker, found_inf, self._growth_factor,
                                     self._backoff_factor, self._growth_interval)

    return ShardedScalerForFused(device=device.type)


def make_scaler(precision: str, strategy: Strategy, device: torch.device) -> Any:
    """fp16-mixed's loss scaler, else None.

    FSDP1: the sharded scaler (its unscale_ all-reduces the inf flag; each rank holds
    plain tensors over its shard, which the base scaler would check alone). FSDP2, DDP,
    single: the plain scaler. Under FSDP2 the gradients are DTensors whose inf check is
    itself a MAX over the mesh (torch.distributed.tensor._dispatch's
    ``found_inf_reduce_handler``; docs/strategies.md), so every rank gets the same flag.
    """
    if precision != "fp16-mixed":
        return None
    if strategy.is_fsdp1:
        return _sharded_scaler(device)
    return torch.amp.GradScaler(device.type)


def backward_and_step(loss: Tensor, optimizer: Any, scaler: Any) -> None:
    """Backward, optimizer step, zero_grad: the part of a training step after the forward.

    No host sync on any path: with a scaler, ``unscale_`` (all-reduced under FSDP1, see
    the TRAP below) and then a fused step that reads the inf flag on the device.
    """
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        # TRAP (FSDP1 ShardedGradScaler + a fused optimizer): ``scaler.step`` on an optimizer
        # that supports AMP scaling checks infs with the base class's ``_check_inf_per_device``,
        # which does NOT all-reduce the flag over the ranks: each rank sees infs only in its own
        # gradient shard, the ranks disagree on skipping the step, and the shards silently
        # diverge. ``ShardedGradScaler.unscale_`` does the all-reduce (asynchronously, no host
        # sync), so unscale_ always comes first; step then passes the reduced flag to the kernel.
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
