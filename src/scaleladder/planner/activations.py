"""What one forward keeps alive: the model's calls in order, with bytes per sample.

A *call* is one execution of a transformer layer or of a non-layer block. Per call and
sample: ``saved`` (autograd keeps it for backward), ``held`` (the forward's Python objects
keep it until ``forward`` returns), ``fwd_transient`` / ``bwd_transient`` (extra memory at
the peak inside its forward / backward). Every coefficient comes from reading the forward
code op by op (torchmultimodal nightly 2024.4.1, torch 2.14); tests/test_plan_activations.py
checks the saved bytes against autograd's saved-tensor hooks. FLAVA comes in the implementation
the rung builds (models/flava_impl.py): ``sdpa`` (the default: :func:`flava_sdpa_calls`) or
TorchMultimodal's own (:func:`flava_calls`).
Why and the dtype traps behind the numbers: docs/planner-internals.md, "2. Activations, call by call".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scaleladder.errors import SpecError
from scaleladder.flavors import Flavor
from scaleladder.models.batch_layout import masked_counts
from scaleladder.models.families import family_of
from scaleladder.models.flava_impl import SDPA

STATS = 8  # LayerNorm saves mean and rstd, fp32, per token

@dataclass(frozen=True)
class Dtypes:
    """Bytes per element, and which autocast behaviours apply, for one precision × wrapper."""

    mode: str  # "mixed" (autocast, fp32 params), "fsdp-mixed" (autocast + FSDP bf16 params), "fp32", "true" (bf16-true)
    c: int  # matmul outputs
    r: int  # residual stream / layer inputs
    store: int  # model inputs as the runner stores them on the device

    @property
    def autocast(self) -> bool:
        return self.mode in ("mixed", "fsdp-mixed")

    @property
    def casts(self) -> bool:
        """Autocast copies fp32 activations for each Linear (only in the fp32-residual mode)."""
        return self.mode == "mixed"

    def lin_in(self, consumers: int) -> int:
        """Bytes per element the Linears that read one tensor save.

        Autocast casts an fp32 input once PER Linear (only parameters are cached);
        a tensor already in the compute dtype is shared by all its consumers.
        """
        return 2 * consumers if self.casts else self.c

    @property
    def probs(self) -> int:
        """FLAVA attention: bytes saved per score (autocast: fp32 softmax out + its bf16 copy)."""
        return 6 if self.autocast else self.c

    @property
    def hidden_held(self) -> int:
        """Per layer input element: what ``hidden_states`` keeps beyond LN's saved fp32 copy.

        With a bf16 residual stream, Fp32LayerNorm saves an fp32 COPY of its input, and
        the bf16 input itself lives on in the encoder's ``hidden_states`` list."""
        return self.r if self.r < 4 else 0


def dtypes(precision: str, fsdp: bool = False) -> Dtypes:
    """The dtypes of a run. Trap: FSDP's MixedPrecision(param_dtype=bf16) makes EVERY
    parameter bf16 during compute — position embeddings and CLS tokens included — and
    casts the root's float inputs to bf16, so under FSDP the residual stream is bf16,
    while under DDP/single (fp32 parameters, autocast) it stays fp32."""
    if precision in ("bf16-mixed", "fp16-mixed"):
        return Dtypes("fsdp-mixed", 2, 2, 4) if fsdp else Dtypes("mixed", 2, 4, 4)
    if precision == "bf16-true":
        return Dtypes("true", 2, 2, 2)
    return Dtypes("fp32", 4, 4, 4)


@dataclass(frozen=True)
class Call:
    name: str
    unit: int | None  # index of the transformer-layer unit, None = root parameters
    saved: float
    held: float = 0.0
    fwd_transient: float = 0.0
    bwd_transient: float = 0.0
    is_layer: bool = False
    releases: float = 0.0  # what earlier calls' ``held`` stops holding here (an encoder's output object dropped)


# -- transformer layers ------------------------------------------------------------------


def flava_layer(T: int, f: Flavor, d: Dtypes) -> tuple[float, float, float, float]:
    """(saved, held, fwd_transient, bwd_transient) per sample, FLAVA's own layer (no SDPA)."""
    h, m, a = f.hidden, f.mlp, f.heads
    Th, Tm, S = T * h, T * m, a * T * T
    saved = (
        4 * Th + STATS * T  # LN1 saves its fp32 input (an fp32 COPY when the stream is bf16)
        + d.lin_in(3) * Th  # q, k, v projections' inputs
        + 2 * d.c * Th  # q and k re-laid-out for the batched matmul
        + d.probs * S
        + d.c * Th  # v re-laid-out
        + d.c * Th  # merged heads: the output projection's input
        + 4 * Th + STATS * T  # LN2 input (fp32)
        + d.lin_in(1) * Th  # fc1 input
        + 2 * d.c * Tm  # fc1 output (GELU input) and GELU output (fc2 input)
    )
    held = d.hidden_held * Th
    # Forward: scores and scaled scores (and under autocast their fp32 cast) next to the softmax output.
    fwd = {"mixed": 6, "fsdp-mixed": 6, "fp32": 8, "true": 4}[d.mode] * S
    # Backward of the scores: fp32 gradients in and out of softmax (bf16-true: bf16); under
    # autocast the bf16 copy of the probabilities is released first (bmm's backward).
    grads = (4 if d.mode == "true" else 8) * S
    return saved, held, fwd, _bwd_transient(Th, Tm, d, attn_grads=grads, attn_freed=(2 * S if d.autocast else 0.0))


def _bwd_transient(Th: int, Tm: int, d: Dtypes, attn_grads: float, attn_freed: float) -> float:
    """Peak extra memory inside one layer's backward, over the tensors it saved.

    MLP first: the incoming gradient (residual dtype) plus fc2's input gradient; by
    GELU's backward fc2's saved input is gone, so the net extra stays ``dY + grad(T×m)``.
    Then attention, once the MLP's saved tensors (fc1 in/out, GELU out, LN2 input) are
    freed: the residual gradient plus the attention gradients (``attn_grads``), less what
    the attention already released (``attn_freed``: FLAVA's bf16 copy of the probabilities).
    """
    mlp_phase = d.r * Th + d.c * Tm
    mlp_saved = 2 * d.c * Tm + (4 + d.lin_in(1)) * Th
    attn_phase = d.r * Th + attn_grads - mlp_saved - attn_freed
    return max(mlp_phase, attn_phase)


def vit_layer(T: int, f: Flavor, d: Dtypes) -> tuple[float, float, float, float]:
    """(saved, held, fwd_transient, bwd_transient) per sample, torchmultimodal's SDPA layer."""
    h, m, a = f.hidden, f.mlp, f.heads
    Th, Tm = T * h, T * m
    qkv = 3 * d.c * Th  # SDPA saves q, k, v: views into the one input_proj output
    saved = (
        4 * Th + STATS * T  # LN1 input (fp32)
        + d.lin_in(1) * Th  # input_proj input
        + qkv
        + d.c * Th  # SDPA output, also output_proj's input (the transpose back is a view)
        + 4 * a * T  # logsumexp, fp32
        + 4 * Th + STATS * T  # LN2 input
        + d.lin_in(1) * Th  # fc1 input
        + 2 * d.c * Tm  # fc1 out, GELU out
    )
    held = d.hidden_held * Th
    fwd = d.r * Th + d.c * Th
    # SDPA's backward: dq, dk, dv, plus flash-attention-2's fp32 dq accumulator.
    return saved, held, fwd, _bwd_transient(Th, Tm, d, attn_grads=qkv + 4 * Th, attn_freed=0.0)


def sdpa_lse_bytes(T: int, f: Flavor, d: Dtypes, masked: bool = False, target: str = "cuda") -> float:
    """Per sample: what fused attention saves beside q, k, v and its output, one layer.

    ``cuda`` (the planner's target): FlashAttention-2 (bf16/fp16, no mask) saves an fp32
    logsumexp [a, T] and a philox seed/offset (a few bytes, not counted); the memory-efficient
    kernel (fp32, or a mask: FLAVA's text encoder) pads the logsumexp to a multiple of 32 tokens
    and also saves the mask as an additive bias in the compute dtype, [1, 1, T] a sample padded to
    8 (a stride-0 expand of it reaches the kernel). ``cpu``: ``_scaled_dot_product_flash_attention_for_cpu``,
    an fp32 [T, a] logsumexp unpadded, and the mask (converted to the compute dtype) as it came.
    torch 2.14's meta registrations give these shapes (docs/planner-internals.md, "FLAVA on SDPA").
    """
    a = f.heads
    if target == "cpu":
        return 4 * a * T + (d.c * T if masked else 0.0)
    if d.c == 4 or masked:  # memory-efficient attention
        return 4 * a * (-(-T // 32) * 32) + (d.c * (T + 8 - T % 8 if T % 8 else T) if masked else 0.0)
    return 4 * a * T


def flava_sdpa_layer(T: int, f: Flavor, d: Dtypes, masked: bool = False,
                     target: str = "cuda") -> tuple[float, float, float, float]:
    """(saved, held, fwd_transient, bwd_transient) per sample, FLAVA's layer on SDPA
    (models/flava_attention.py's ``SdpaLayer``): ViT's fused layer, except that three Linears
    (query, key, value) read LN1's output, so under autocast with an fp32 stream each casts
    it again, and the logsumexp is the kernel's (:func:`sdpa_lse_bytes`)."""
    saved, held, fwd, bwd = vit_layer(T, f, d)
    Th = T * f.hidden
    saved += (d.lin_in(3) - d.lin_in(1)) * Th - 4 * f.heads * T + sdpa_lse_bytes(T, f, d, masked, target)
    return saved, held, fwd, bwd


def sac_kept(T: int, f: Flavor, d: Dtypes, sdpa: bool) -> float:
    """Per sample, what ``-sac`` keeps of one layer's forward: the outputs of its matmuls
    and fused attention (rung/sac.py's SAVE_OPS), every one of them in the compute dtype.

    q/k/v projections (three Linears, or ViT's one input_proj: 3·T·h either way); the
    attention: SDPA's output and its fp32 logsumexp, or, unfused (FLAVA's own), the two
    batched matmuls' outputs, the a·T·T scores and the T·h context; the output projection,
    fc1 (T·m) and fc2. Everything else (LayerNorm, GELU, softmax, dropout, adds, autocast's
    casts, head re-layouts) is recomputed in backward from these.
    """
    h, m, a = f.hidden, f.mlp, f.heads
    Th = T * h
    attn = d.c * Th + (4 * a * T if sdpa else d.c * a * T * T)
    return 3 * d.c * Th + attn + d.c * Th + d.c * T * m + d.c * Th


#: The layer formulas by kind: TorchMultimodal's SDPA layer (ViT's), FLAVA's own (unfused
#: attention) and FLAVA's on SDPA (models/flava_attention.py).
LAYERS = ("sdpa", "flava-own", "flava-sdpa")


def layer_call(name: str, unit: int, T: int, f: Flavor, d: Dtypes, ac: bool, sac: bool = False,
               layer: str = "sdpa", masked: bool = False, samples: int = 1) -> Call:
    """One layer call. ``layer``: which formulas (:data:`LAYERS`: ``sdpa`` :func:`vit_layer`,
    ``flava-own`` :func:`flava_layer`, ``flava-sdpa`` :func:`flava_sdpa_layer`; ``masked``: with a
    padding mask, the text encoder's); ``samples``: samples per sample of the batch (2: FLAVA's
    batched twin passes run the layer on the plain and the masked input at once)."""
    if layer == "flava-own":
        saved, held, fwd, bwd = flava_layer(T, f, d)
    elif layer == "flava-sdpa":
        saved, held, fwd, bwd = flava_sdpa_layer(T, f, d, masked)
    else:
        saved, held, fwd, bwd = vit_layer(T, f, d)
    sdpa = layer != "flava-own"
    if not ac:
        return _times(Call(name, unit, saved, held, fwd, bwd, is_layer=True), samples)
    # Non-reentrant checkpoint: only the layer's input survives; the backward recomputes
    # the layer (all of its saved tensors come back) before running its own backward.
    # TorchMultimodal's FLAVA layer still RETURNS its attention probabilities, and the encoder
    # keeps them in `attentions` until forward returns, so they are held even under AC
    # (the SDPA layer makes none).
    probs_held = 0.0 if sdpa else f.heads * T * T * d.c
    # Inside a checkpointed forward nothing is saved: intermediates die as soon as they are
    # consumed, so the in-layer peak is the attention transient next to the q/k/v inputs
    # and copies, or the MLP's two T×m tensors.
    Th = T * f.hidden
    fwd_ac = max(fwd + (d.lin_in(3) + 3 * d.c) * Th, 2 * d.c * T * f.mlp + (4 + d.lin_in(1)) * Th)
    if sac:
        # -sac: the input and the kept outputs survive the forward. In backward the recompute
        # brings back the rest of the saved set (the kept outputs are reused, not copied).
        # The in-layer forward peak is taken as -ac's plus everything kept (an upper bound:
        # the last matmuls' outputs are not all alive at the attention's peak).
        kept = sac_kept(T, f, d, sdpa=sdpa)
        call = Call(name, unit, d.r * Th + kept, probs_held, fwd_ac + kept, max(saved - kept, 0.0) + bwd, is_layer=True)
    else:
        call = Call(name, unit, d.r * Th, probs_held, fwd_ac, saved + bwd, is_layer=True)
    return _times(call, samples)


def _times(call: Call, k: float) -> Call:
    """``call`` run on ``k`` samples per sample of the batch: every per-sample figure × k."""
    if k == 1:
        return call
    return Call(call.name, call.unit, k * call.saved, k * call.held, k * call.fwd_transient, k * call.bwd_transient,
                call.is_layer, k * call.releases)


# -- whole models ------------------------------------------------------------------------


def input_bytes(f: Flavor, d: Dtypes) -> float:
    """Bytes of one sample of a synthetic batch on the device (floats in the storage dtype): the family's."""
    return family_of(f).input_bytes(f, d.store)


def codebook_transient(f: Flavor, d: Dtypes) -> float:
    """Peak per sample inside the frozen DALL-E encoder (no autograd graph: nothing saved).

    Its first group runs at the codebook image's full resolution with ``n_hid``
    channels; a residual block holds its input, the scaled residual and the sum
    (about 3 × n_hid channels) at once. Convs run in the compute dtype.
    """
    return 3 * f.codebook_hidden * f.codebook_image_size**2 * d.c


def _head(n_tokens: float, vocab: int, h: int, d: Dtypes) -> tuple[float, float, float]:
    """A masked-prediction head on n_tokens tokens: (saved, held, transient) per sample.

    dense → GELU → Fp32LayerNorm → decoder → cross-entropy. Per token it saves the
    dense input, GELU input, LN's fp32 input and the decoder input (h-sized), and the
    log-softmax output (vocab-sized, fp32 under autocast); the logits themselves are
    held by the loss output until forward returns; autocast's fp32 copy of the logits
    exists only while log_softmax runs.
    """
    saved_h = ({"mixed": 2, "fsdp-mixed": 2, "fp32": 4, "true": 2}[d.mode] + d.c + 4 + d.c) * h + STATS
    saved_v = (4 if d.autocast or d.mode == "fp32" else 2) * vocab
    held_v = d.c * vocab
    transient_v = 4 * vocab if d.autocast else 0
    return n_tokens * (saved_h + saved_v), n_tokens * held_v, n_tokens * transient_v


def _final_norm(name: str, T: int, h: int, d: Dtypes, read_by_head: bool) -> Call:
    """An encoder's final LayerNorm: saves its fp32 input; its output lives until forward returns.

    Trap: when a Linear head reads ``out[:, 0]`` (ViT's classifier, FLAVA's contrastive
    projections and ITM pooler) and no autocast cast sits between them, autograd saves
    that VIEW — which keeps the whole ``[B, T, h]`` output alive until the head's
    backward. With an fp32 stream under autocast the head saves a bf16 copy of the CLS
    rows instead, and the output dies when forward returns.
    """
    out = d.r * T * h
    keep = read_by_head and not d.casts
    return Call(name, None, saved=4 * T * h + STATS * T + (out if keep else 0.0),
                held=(0.0 if keep else out) + d.hidden_held * T * h)


def vit_calls(f: Flavor, d: Dtypes, ac: bool, sac: bool = False) -> list[list[Call]]:
    """Forward passes (here one) as lists of calls, in forward order."""
    T, h, s = f.patches + 1, f.hidden, f.image_size
    # Under autocast the patch conv saves a bf16 copy of the image (FSDP: the root's input cast).
    embed = Call("vit.embed", None, saved=(2 * 3 * s * s if d.autocast else 0), fwd_transient=d.c * f.patches * h + d.r * T * h)
    layers = [layer_call("vit.layer", i, T, f, d, ac, sac) for i in range(f.layers)]
    final = _final_norm("vit.final_norm", T, h, d, read_by_head=True)
    head = Call("vit.head", None, saved=2 * h + 4 * f.num_classes)
    return [[embed, *layers, final, head]]


def flava_calls(f: Flavor, d: Dtypes, ac: bool, sac: bool = False) -> list[list[Call]]:
    """FLAVA's five encoder passes and its loss, in forward order (see FLAVAModel.forward)."""
    h, L, s = f.hidden, f.layers, f.image_size
    Ti, Tt = f.patches + 1, f.text_len
    Tm = Ti + Tt + 1  # image tokens + text tokens + the fusion encoder's own CLS

    def image_pass(tag: str) -> list[Call]:
        embed = Call(f"image{tag}.embed", None, saved=(2 * 3 * s * s if d.autocast else 0),
                     fwd_transient=(d.c + 2 * 4) * f.patches * h)
        layers = [layer_call(f"image{tag}.layer", i, Ti, f, d, ac, sac, layer="flava-own") for i in range(L)]
        final = _final_norm(f"image{tag}.final_norm", Ti, h, d, read_by_head=tag == "")
        return [embed, *layers, final]

    def text_pass(tag: str) -> list[Call]:
        embed = Call(f"text{tag}.embed", None, saved=4 * Tt * h + STATS * Tt, fwd_transient=3 * d.r * Tt * h)
        layers = [layer_call(f"text{tag}.layer", L + i, Tt, f, d, ac, sac, layer="flava-own") for i in range(L)]
        final = _final_norm(f"text{tag}.final_norm", Tt, h, d, read_by_head=tag == "")
        return [embed, *layers, final]

    proj_saved = 2 * (Ti + Tt) * h if d.casts else 0
    mm = [Call("mm.projections", None, saved=proj_saved, fwd_transient=2 * d.c * (Ti + Tt) * h)]
    mm += [layer_call("mm.layer", 2 * L + i, Tm, f, d, ac, sac, layer="flava-own") for i in range(f.mm_layers)]
    mm.append(_final_norm("mm.final_norm", Tm, h, d, read_by_head=True))

    # Loss: only the multimodal heads run (the unimodal MLM/MIM ones are skipped when a
    # fusion output exists), on the masked tokens of matched pairs (9 in 10 samples).
    n_text, n_patch = masked_counts(f)
    pos = 0.9
    ts, th, tt = _head(pos * n_text, f.vocab_size, h, d)
    is_, ih, it = _head(pos * n_patch, f.image_vocab, h, d)
    loss = Call("loss.heads", None, saved=ts + is_, held=th + ih + pos * d.r * Tm * h, fwd_transient=max(tt, it))
    return [image_pass(""), text_pass(""), image_pass("_masked"), text_pass("_masked"), mm, [loss]]


def flava_sdpa_calls(f: Flavor, d: Dtypes, ac: bool, sac: bool = False) -> list[list[Call]]:
    """The ``sdpa`` implementation's passes (models/flava_impl.py), in forward order.

    Each unimodal encoder runs once on its plain and masked inputs concatenated along the
    batch (models/flava_passes.py), so its calls are TorchMultimodal's passes' calls at two
    samples a sample: the same bytes in total, but all alive at once from the encoder on.
    The layers are SDPA layers (no probabilities). The encoder's list of layer inputs dies
    when the batched output is split (``releases``), not when forward returns. The sync-free
    losses run the heads over every text token and every patch of every pair (flava_losses.py).
    """
    h, L, s = f.hidden, f.layers, f.image_size
    Ti, Tt = f.patches + 1, f.text_len
    Tm = Ti + Tt + 1
    img = 3 * s * s

    def encoder(tag: str, T: int, first_unit: int, embed: Call, masked: bool) -> list[Call]:
        layers = [layer_call(f"{tag}.layer", first_unit + i, T, f, d, ac, sac, layer="flava-sdpa", masked=masked, samples=2)
                  for i in range(L)]
        final = _times(_final_norm(f"{tag}.final_norm", T, h, d, read_by_head=True), 2)
        # the split keeps the last hidden state (the fusion encoder reads its masked half); the
        # list of every layer's input goes (with a bf16 stream it held them; fp32: LN saved them)
        hidden = Call(f"{tag}.hidden_states", None, 0.0, releases=sum(c.held for c in layers) + embed.held)
        return [embed, *layers, final, hidden]

    # image: torch.cat([image, image]) is a new tensor: the patch conv saves it (autocast: its bf16
    # copy, while the fp32 cat lives to the end of the encoder call); under FSDP's MixedPrecision
    # the root's bf16 cast of the input lives until forward returns.
    img_saved = 2 * img * (2 if d.autocast else d.store)
    img_embed = Call("image.embed", None, saved=img_saved, held=2 * img * d.store if d.mode == "mixed" else 0.0,
                     fwd_transient=2 * (d.c + 2 * 4) * f.patches * h)
    fsdp_input = Call("image.input_cast", None, 0.0, held=2 * img if d.mode == "fsdp-mixed" else 0.0)
    text_embed = _times(Call("text.embed", None, saved=4 * Tt * h + STATS * Tt, fwd_transient=3 * d.r * Tt * h), 2)
    image = [fsdp_input, *encoder("image", Ti, 0, img_embed, masked=False)]
    text = encoder("text", Tt, L, text_embed, masked=True)

    # The fusion encoder's projections read the masked halves of the last hidden states: under
    # autocast with an fp32 stream a bf16 copy of each half; else a view, which keeps the whole
    # [2B, T, h] storage (fp32: the one the final LayerNorm saved; bf16: moved from held to saved).
    kept = 0.0 if d.r == 4 else 2 * d.r * (Ti + Tt) * h
    proj_saved = 2 * (Ti + Tt) * h if d.casts else kept
    mm = [Call("mm.projections", None, saved=proj_saved, fwd_transient=2 * d.c * (Ti + Tt) * h, releases=kept)]
    mm += [layer_call("mm.layer", 2 * L + i, Tm, f, d, ac, sac, layer="flava-sdpa") for i in range(f.mm_layers)]
    mm.append(_final_norm("mm.final_norm", Tm, h, d, read_by_head=True))

    # Loss: the multimodal heads on every text token and patch of every pair; the labels
    # select the masked tokens of matched pairs.
    ts, th, tt = _head(Tt, f.vocab_size, h, d)
    is_, ih, it = _head(f.patches, f.image_vocab, h, d)
    loss = Call("loss.heads", None, saved=ts + is_, held=th + ih, fwd_transient=max(tt, it))
    return [image, text, mm, [loss]]


def _flava_passes(f: Flavor, d: Dtypes, ac: bool, sac: bool, flava_impl: str) -> list[list[Call]]:
    return flava_sdpa_calls(f, d, ac, sac) if flava_impl == SDPA else flava_calls(f, d, ac, sac)


#: An analytic family's forward, call by call: (flavor, dtypes, ac, sac, flava_impl) -> its passes,
#: each a list of calls in forward order.
Passes = Callable[[Flavor, Dtypes, bool, bool, str], list[list[Call]]]

#: The activation models by the name a family's ``activations`` gives (models/family.py).
MODELS: dict[str, Passes] = {
    "vision-transformer": lambda f, d, ac, sac, _impl: vit_calls(f, d, ac, sac),
    "flava-pretraining": _flava_passes,
}


def activation_model(f: Flavor) -> Passes:
    """``f``'s family's activation model; a SpecError for a family with none (the planner traces it)."""
    family = family_of(f)
    model = MODELS.get(family.activations)
    if model is None:
        raise SpecError(f"model {f.name}: family {family.name or type(family).__name__} has no analytic activation "
                        "model (the planner traces it: docs/planner.md)")
    return model


def forward_passes(f: Flavor, precision: str, ac: bool, fsdp: bool = False, sac: bool = False,
                   flava_impl: str = SDPA) -> list[list[Call]]:
    """The family's passes (:data:`MODELS`: ViT's :func:`vit_calls`, FLAVA's :func:`flava_sdpa_calls`
    or :func:`flava_calls`). ``sac``: the checkpointing is selective (-sac, with ``ac``).
    ``flava_impl``: which FLAVA the rung builds (models/flava_impl.py; ignored for ViT)."""
    return activation_model(f)(f, dtypes(precision, fsdp), ac, sac, flava_impl)


def backward_order(f: Flavor, passes: list[list[Call]]) -> list[Call]:
    """The order autograd runs the calls' backward: the forward's, reversed.

    The engine runs the ready node with the highest sequence number (the most recently
    created), so FLAVA's masked chain — loss heads, fusion, masked text, masked image — runs
    first, and the unmasked passes (reached only through the contrastive projections) run
    last: text, then image; the sdpa FLAVA (one batched pass per unimodal encoder) runs each
    encoder's backward once, after the fusion encoder's, when both halves' gradients are in.
    Verified on CPU in tests/test_plan_exact.py, where it matters most: FSDP cannot reshard an
    encoder layer until BOTH its passes have been through backward.
    """
    return [c for p in reversed(passes) for c in reversed(p)]
