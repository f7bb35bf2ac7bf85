"""The activation model against autograd itself.

1. Per layer, exactly: the bytes autograd saves for backward in one transformer layer
   (``saved_tensors_hooks``, unique storages, parameters and their autocast copies
   excluded) equal the planner's coefficient — FLAVA's layer and ViT's SDPA layer, in
   all four dtype modes. fp32 and bf16-true run on real CPU tensors. bf16-mixed needs
   CUDA autocast's op lists (softmax → fp32): FLAVA's layer runs on *fake* CUDA tensors
   with CUDA autocast switched on (no GPU needed, shapes and dtypes are real). ViT's
   SDPA has no fake-CUDA kernel, so its mixed modes run under CPU autocast, whose
   choices for this layer's ops (Linear → bf16, explicit fp32 LayerNorm, SDPA in bf16)
   are the same.
2. Whole step: a live-bytes tracker (every storage an op creates, freed when its
   storage dies) measures the peak of a real fp32 training step on CPU — forward,
   backward, foreach AdamW — and the planner's timeline must land within 8 %.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from scaleladder.models.flavors import get_flavor
from scaleladder.planner.activations import dtypes, flava_layer, forward_passes, vit_layer

B, T = 3, 50  # activation sizes (B·T·h = 9600, B·T·m = 38400) never equal a parameter's numel
FLAVOR = dataclasses.replace(get_flavor("vit-debug"), hidden=64, mlp=256, heads=4)


@contextlib.contextmanager
def fake_cuda_autocast(dtype: torch.dtype) -> Iterator[None]:
    """CUDA autocast on a machine without CUDA (torch.autocast refuses there): for fake tensors."""
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", False)


def _layer(kind: str) -> torch.nn.Module:
    if kind == "flava":
        from torchmultimodal.models.flava.transformer import TransformerEncoderLayer
    else:
        from torchmultimodal.modules.layers.transformer import TransformerEncoderLayer
    f = FLAVOR
    return TransformerEncoderLayer(f.hidden, f.heads, f.mlp, activation=torch.nn.GELU, norm_first=True)  # as both models build it


def _saved_bytes(layer: torch.nn.Module, x: torch.Tensor, ctx: Any) -> int:
    params = list(layer.parameters())
    param_storages = {p.untyped_storage()._cdata for p in params}
    param_numels = {p.numel() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        weight_copy = t.dtype in (torch.bfloat16, torch.float16) and t.numel() in param_numels and t.dim() <= 2
        if st._cdata not in param_storages and not weight_copy:
            seen[st._cdata] = st.nbytes()  # _cdata: a storage's identity, also for fake tensors
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        layer(x)
    return sum(seen.values())


def _fake_cuda_layer(kind: str, dtype: torch.dtype) -> torch.nn.Module:
    with torch.device("meta"):
        layer = _layer(kind)
    for mod in layer.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, device="cuda", dtype=dtype))
    return layer


COEFF = {"flava": flava_layer, "vit": vit_layer}


@pytest.mark.parametrize("kind", ["flava", "vit"])
@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16-true", torch.bfloat16)])
def test_saved_bytes_per_layer_on_real_cpu_tensors(kind: str, precision: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layer = _layer(kind).to(dtype)
    x = torch.randn(B, T, FLAVOR.hidden, dtype=dtype, requires_grad=True)
    predicted = B * COEFF[kind](T, FLAVOR, dtypes(precision))[0]
    # bf16-true: + one bias copy of ≤ 1 KiB the filter cannot tell from an activation
    assert _saved_bytes(layer, x, contextlib.nullcontext()) == pytest.approx(predicted, abs=1100)


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_flava_layer_under_cuda_autocast_on_fake_cuda(fsdp: bool) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    # DDP: fp32 parameters and residual stream; FSDP's MixedPrecision: bf16 parameters and stream.
    dtype = torch.bfloat16 if fsdp else torch.float32
    with FakeTensorMode(allow_non_fake_inputs=True):
        layer = _fake_cuda_layer("flava", dtype)
        x = torch.empty(B, T, FLAVOR.hidden, device="cuda", dtype=dtype, requires_grad=True)
        got = _saved_bytes(layer, x, fake_cuda_autocast(torch.bfloat16))
    predicted = B * flava_layer(T, FLAVOR, dtypes("bf16-mixed", fsdp))[0]
    assert got == pytest.approx(predicted, abs=1100)
    # The trap the coefficient encodes: three bf16 copies of the q/k/v input under DDP, one under FSDP.
    assert (predicted - B * flava_layer(T, FLAVOR, dtypes("bf16-mixed", True))[0] > 0) is (not fsdp)


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_vit_layer_under_autocast(fsdp: bool) -> None:
    dtype = torch.bfloat16 if fsdp else torch.float32
    layer = _layer("vit").to(dtype)
    x = torch.randn(B, T, FLAVOR.hidden, dtype=dtype, requires_grad=True)
    got = _saved_bytes(layer, x, torch.autocast("cpu", dtype=torch.bfloat16))
    assert got == pytest.approx(B * vit_layer(T, FLAVOR, dtypes("bf16-mixed", fsdp))[0], abs=1100)


# -- the whole step ----------------------------------------------------------------------------


class LiveBytes(TorchDispatchMode):
    """Bytes of every storage created by an op while active, until that storage dies."""

    def __init__(self, existing: list[torch.Tensor]):
        super().__init__()
        self.skip = {t.untyped_storage()._cdata for t in existing}  # views of these are not new memory
        self.live: dict[int, int] = {}
        self.cur = self.peak = 0

    def _free(self, key: int) -> None:
        self.cur -= self.live.pop(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key = st._cdata
                if key not in self.live and key not in self.skip and st.nbytes() > 0:
                    self.live[key] = st.nbytes()
                    self.cur += st.nbytes()
                    weakref.finalize(st, self._free, key)
        self.peak = max(self.peak, self.cur)
        return out


def _measured(flavor: Any, batch: int, ac: bool) -> tuple[int, int]:
    """(peak bytes of a steady-state step, bytes the forward left alive when it returned)."""
    from scaleladder.batches import synthetic_batch
    from scaleladder.models.build import build_model
    from scaleladder.parallel import _checkpoint, freeze_unused

    torch.manual_seed(0)
    model = build_model(flavor, "cpu")
    freeze_unused(model)
    if ac:
        _checkpoint(model)
    data = synthetic_batch(flavor, batch, 0, 0, 0)
    # foreach=True: what AdamW picks by default on a GPU (on a CPU it would loop per tensor)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    model(data).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)  # step 1 made the AdamW states: now the steady state
    existing = [*model.parameters(), *(v for s in opt.state.values() for v in s.values()), *data.values()]
    base = sum(t.untyped_storage().nbytes() for t in {t.untyped_storage()._cdata: t for t in existing if t.dim() > 0}.values())
    with LiveBytes(existing) as live:
        loss = model(data)
        forward_end = live.cur
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return base + live.peak, forward_end


VIT = ("vit-debug", dict(hidden=96, mlp=384, heads=4, layers=3, image_size=128, patch=16), 4)
FLAVA = ("flava-debug", dict(hidden=64, mlp=256, heads=4, layers=2, mm_layers=1, image_size=128, patch=16, text_len=32), 2)


# (FLAVA with AC at this size peaks in AdamW, which the ViT case already covers.)
@pytest.mark.parametrize("name,dims,batch,ac", [(*VIT, False), (*VIT, True), (*FLAVA, False)], ids=["vit", "vit-ac", "flava"])
def test_step_peak_matches_a_real_cpu_step(name: str, dims: dict[str, int], batch: int, ac: bool) -> None:
    from scaleladder.planner.memory import InputBatches, _setup, _simulate
    from scaleladder.spec import Knobs, parse_strategy

    flavor = dataclasses.replace(get_flavor(name), **dims)
    measured, forward_end = _measured(flavor, batch, ac)
    # the test holds its one batch, not the runner's synthetic pool
    st = _setup(flavor, parse_strategy("single-ac" if ac else "single"), "fp32", Knobs(), 1, inputs=InputBatches(1))
    predicted = _simulate(st, batch).peak
    print(f"{name} ac={ac}: measured {measured} predicted {predicted:.0f} ratio {predicted / measured:.3f}")
    assert predicted == pytest.approx(measured, rel=0.08)
    # What the forward leaves alive when it returns — everything saved for backward, none of
    # what was only held until then (FLAVA's attention probabilities under AC, logits) — is
    # the planner's sum of `saved` over every call: the state the backward starts from.
    saved = batch * sum(c.saved for p in forward_passes(flavor, "fp32", ac) for c in p)
    print(f"  forward end: measured {forward_end} predicted {saved:.0f} ratio {saved / forward_end:.4f}")
    assert saved == pytest.approx(forward_end, rel=0.01)
