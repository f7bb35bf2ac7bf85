"""Analytic FLOPs per trained sample, from a flavor's dimensions alone.

Counting rules (the same ones ``torch.utils.flop_counter.FlopCounterMode`` uses,
which tests/test_flops.py checks within 5% on both debug flavors):

* a matmul of ``[m,k] x [k,n]`` is ``2mkn`` FLOPs; bias adds, norms, activations
  and softmax are not counted (they are memory-bound, and every MFU convention
  leaves them out);
* a transformer layer on T tokens of width d with MLP width f does
  ``2T(4d² + 2df)`` for its projections and ``4T²d`` for QKᵀ and PV;
* a convolution is ``2 · C_in · C_out · k² · H_out · W_out``;
* backward costs twice the forward, so training = 3 × forward ("model FLOPs",
  the MFU numerator) — except the patch-embedding convolution, whose input (the
  image) needs no gradient: its backward is the weight gradient alone, 2 × forward. With activation checkpointing every checkpointed layer runs
  its forward once more; that extra forward counts towards HFU only.

FLAVA specifics: the image and text encoders each run twice (plain and masked),
the multimodal encoder once, on ``1 + T_image + T_text`` tokens; the MLM/MIM heads'
useful work is on the masked tokens of positive (matched) pairs; the frozen DALL-E
codebook runs forward only (no parameter or input needs a gradient).

Which tokens the heads run on depends on the FLAVA implementation (models/flava_impl.py):
TorchMultimodal's selects the masked tokens of positive pairs (a device sync each time);
``sdpa``'s sync-free losses run the heads on every text token and every patch of every
pair and ignore the rest in the cross entropy. MFU counts the useful work either way;
HFU (``hardware``) counts what ran: with ``heads_on_all_tokens`` the heads' extra
forward and backward over the other tokens (docs/metrics.md).

A family with no analytic count (``Family.flops`` returns None: a models-file model) is counted
by :func:`counted_flops`, with FlopCounterMode, on the meta device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scaleladder.errors import SpecError
from scaleladder.flavors import Flavor

if TYPE_CHECKING:
    from torch import Tensor, nn


@dataclass(frozen=True)
class FlopCount:
    """FLOPs for ONE sample of one training step."""

    model: float  # 3 × forward of trained parts + forward of frozen parts (MFU numerator)
    hardware: float  # model + recomputed forwards under activation checkpointing (HFU numerator)
    forward: float  # one forward pass, frozen parts included


def _layer(t: int, d: int, f: int) -> float:
    return 2 * t * (4 * d * d + 2 * d * f) + 4 * t * t * d


def _dalle_encoder(res: int, n_hid: int, vocab: int, blocks_per_group: int = 2) -> float:
    """DALL-E encoder (torchmultimodal's DalleEncoder): input 7×7 conv, 4 groups of
    residual blocks (3×3,3×3,3×3,1×1 convs at width n_out/4, 1×1 id-path conv when the
    width changes), max-pool after groups 1–3, then a 1×1 conv to the codebook."""

    def conv(cin: int, cout: int, k: int, r: int) -> float:
        return 2 * cin * cout * k * k * r * r

    total = conv(3, n_hid, 7, res)
    widths = [(n_hid, n_hid), (n_hid, 2 * n_hid), (2 * n_hid, 4 * n_hid), (4 * n_hid, 8 * n_hid)]
    r = res
    for g, (cin, cout) in enumerate(widths):
        for b in range(blocks_per_group):
            n_in = cin if b == 0 else cout
            h = cout // 4
            if n_in != cout:
                total += conv(n_in, cout, 1, r)
            total += conv(n_in, h, 3, r) + conv(h, h, 3, r) + conv(h, h, 3, r) + conv(h, cout, 1, r)
        if g < 3:
            r //= 2
    return total + conv(8 * n_hid, vocab, 1, r)


def _patch_embed(f: Flavor) -> float:
    return 2 * 3 * f.patch**2 * f.hidden * f.patches  # a p×p, stride-p convolution


def vit_flops(f: Flavor, ac: bool = False) -> FlopCount:
    t = f.patches + 1  # + CLS
    layers = f.layers * _layer(t, f.hidden, f.mlp)
    patch = _patch_embed(f)
    rest = layers + 2 * f.hidden * f.num_classes
    model = 2 * patch + 3 * rest
    return FlopCount(model=model, hardware=model + (layers if ac else 0), forward=patch + rest)


def flava_flops(
    f: Flavor,
    global_batch: int,
    masked_text_tokens: float,
    masked_patches: float,
    positive_fraction: float,
    ac: bool = False,
    heads_on_all_tokens: bool = False,
) -> FlopCount:
    """Per-sample FLOPs. Masked counts are per sample (means over the batch);
    ``positive_fraction`` is the share of matched (non-ITM-negative) pairs;
    ``heads_on_all_tokens``: the MLM/MIM heads ran on every token (the sdpa FLAVA)."""
    d, mlp = f.hidden, f.mlp
    ti, tt = f.patches + 1, f.text_len
    tm = 1 + ti + tt
    pool = 2 * d * d  # each encoder's Pooler: a d×d dense on the CLS token
    image_enc = f.layers * _layer(ti, d, mlp) + pool  # + the patch embedding, counted apart
    text_enc = f.layers * _layer(tt, d, mlp) + pool
    mm_layers = f.mm_layers * _layer(tm, d, mlp)
    mm_enc = mm_layers + pool
    # the two projections to the contrastive space (CLS only) and to the mm width (all tokens)
    proj = 2 * (2 * d * d) + 2 * (ti + tt) * d * d
    itm = 2 * d * d + 2 * d * 2
    text_head, image_head = 2 * d * d + 2 * d * f.vocab_size, 2 * d * d + 2 * d * f.image_vocab  # per token
    heads = positive_fraction * (masked_text_tokens * text_head + masked_patches * image_head)
    # The sync-free heads' work beyond the useful: every text token and patch of every pair.
    idle_heads = (tt * text_head + f.patches * image_head - heads) if heads_on_all_tokens else 0.0
    # contrastive: each positive image/text embedding against every gathered embedding, both ways
    contrastive = positive_fraction * 2 * (2 * d * global_batch * positive_fraction)
    trained = 2 * image_enc + 2 * text_enc + mm_enc + proj + itm + heads + contrastive
    codebook = _dalle_encoder(f.codebook_image_size, f.codebook_hidden, f.image_vocab)
    patch = 2 * _patch_embed(f)  # the image encoder runs twice
    recompute = 2 * f.layers * (_layer(ti, d, mlp) + _layer(tt, d, mlp)) + mm_layers
    model = 3 * trained + 2 * patch + codebook
    hardware = model + (recompute if ac else 0) + 3 * idle_heads
    return FlopCount(model=model, hardware=hardware, forward=trained + patch + codebook + idle_heads)


def counted_flops(model: nn.Module, blocks: Sequence[nn.Module], first: Mapping[str, Tensor], recompute: bool,
                  name: str) -> FlopCount:
    """FLOPs per sample of a family with no analytic count, counted by torch's FlopCounterMode.

    How: ``model`` is the rung's model built again on the meta device (no memory; the caller,
    rung/run.py, builds it with the RNG forked), every parameter and buffer then made an empty
    FAKE CPU tensor; it runs one forward and one backward on the first batch as fake tensors too
    (floats as fp32: a FLOP count does not depend on the dtype), once, before the timed loop.
    Fake tensors carry shapes only, so this costs the model's Python and nothing on the device,
    and it leaves the rung's model, its gradients and its batches untouched. Fake, not meta: a
    library's data-dependent branch guarded by "is this tracing?" (transformers' packed-sequence
    check, ``.all()`` on the position ids) takes its tracing path on a fake tensor, and calls
    ``.item()`` on a meta one, which fails. ``blocks``: the outermost blocks (the
    family's ``stacks``), whose forward FLOPs a recompute repeats.

    What is counted: FlopCounterMode's table (matrix products, convolutions, attention kernels;
    nothing elementwise), forward and backward as they ran (a frozen module's forward, no
    gradient for its weights): ``model`` is that total; ``hardware`` adds the blocks' forward once
    more under recompute (``-ac``: each checkpointed block runs its forward again in backward);
    ``forward`` is the forward alone; all divided by the first batch's samples. Collectives are no
    FLOPs. A forward that reads tensor values (a data-dependent shape, a host sync) cannot run on
    meta: a SpecError says so, and that family must define ``flops()``.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from scaleladder.models.init import materialize_empty

    cpu = {k: v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().to("cpu") for k, v in first.items()}
    samples = len(next(iter(cpu.values())))
    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    in_blocks: list[float] = []
    hooks = []
    for block in blocks:
        start: list[float] = []
        hooks.append(block.register_forward_pre_hook(lambda *_, s=start: s.append(counter.get_total_flops())))
        hooks.append(block.register_forward_hook(lambda *_, s=start: in_blocks.append(counter.get_total_flops() - s.pop())))
    try:
        with FakeTensorMode() as fake:
            materialize_empty(model, "cpu").train()
            batch = {k: fake.from_tensor(v) for k, v in cpu.items()}
            with counter:
                loss = model(batch)
                forward = float(counter.get_total_flops())
                for h in hooks:
                    h.remove()
                loss.backward()
    except Exception as e:  # the model's own code on meta tensors: name the model and what failed, one line
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        raise SpecError(f"model {name}: its FLOPs could not be counted on fake tensors ({type(e).__name__}: "
                        f"{first_line}); its family must define flops() (models/family.py)") from None
    total = float(counter.get_total_flops())
    again = sum(in_blocks) if recompute else 0.0
    return FlopCount(model=total / samples, hardware=(total + again) / samples,
                     forward=forward / samples)


def flop_formulas() -> dict[object, Callable[..., int]]:
    """FlopCounterMode's table, corrected and completed: a grouped convolution's weight gradient
    counted with its groups (:func:`_conv_backward_flops`), and the CPU's fused attention kernel,
    which torch's table leaves out (a fake or real CPU run would count no attention): its forward
    as the GPU's SDPA kernels are, its backward as twice that (:func:`_attention_backward_flops`)."""
    import torch
    from torch.utils import flop_counter as fc

    def as_registered(formula: Callable[..., int]) -> Callable[..., int]:
        # torch's own formulas are registered already wrapped (tensors -> shapes): marked raw, so that
        # FlopCounterMode passes them the tensors instead of wrapping them again
        def count(*args: object, **kwargs: object) -> int:
            return int(formula(*args, **kwargs))

        count._get_raw = True  # type: ignore[attr-defined]
        return count

    aten = torch.ops.aten
    return {aten.convolution_backward: _conv_backward_flops,
            aten._scaled_dot_product_flash_attention_for_cpu: as_registered(fc.sdpa_flop),
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward_flops}


def _attention_backward_flops(grad_out_shape: list[int], query_shape: list[int], key_shape: list[int],
                              value_shape: list[int], *args: object, **kwargs: object) -> int:
    """The CPU fused attention's backward: twice its forward, the two gradients of each of its two
    products, as this module counts every matrix product's backward (and as the analytic counts
    do). torch counts a flash kernel's backward with the recomputed scores (2.5x): what a GPU's
    flash kernel runs, not the model's work; a recompute is HFU's, and then of the whole block."""
    from torch.utils.flop_counter import sdpa_flop_count

    return 2 * int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _conv_backward_flops(grad_out_shape: list[int], x_shape: list[int], w_shape: list[int], bias: object, stride: object,
                         padding: object, dilation: object, transposed: bool, output_padding: object, groups: int,
                         output_mask: list[bool], out_shape: tuple[list[int], ...], **kwargs: object) -> int:
    """A convolution's backward as torch counts it, its weight gradient counted with the groups.

    TRAP: torch.utils.flop_counter counts a weight gradient as a convolution of the input with
    the output's gradient over every input and output channel, ignoring ``groups``: a depthwise
    convolution's (ConvNeXt's 7x7, groups = channels) is counted ``groups`` times over, 64x for 64
    channels. A weight gradient multiplies what the forward multiplies, so it is counted as the
    forward is (the grouped weight's shape says its channels). The input gradient is torch's
    count (a transposed convolution over the same grouped weight: right)."""
    from torch.utils.flop_counter import conv_flop_count

    flops = 0
    if output_mask[0]:
        flops += conv_flop_count(grad_out_shape, w_shape, list(out_shape[0]), not transposed)
    if output_mask[1]:
        flops += conv_flop_count(x_shape, w_shape, grad_out_shape, transposed)  # the forward's count
    return flops
