"""What one forward keeps alive: the model's calls in order, with bytes per sample.

A *call* is one execution of a transformer layer (or of a non-layer block: patch
embedding, final norm, loss heads). For each call we count, per sample:

* ``saved``  — tensors autograd saves for backward (freed as backward passes the call);
* ``held``   — tensors the forward's Python objects keep until ``forward`` returns,
  freed before backward starts (FLAVA returns every layer's attention probabilities;
  under AC those are not saved but still held; last hidden states; logits);
* ``fwd_transient`` / ``bwd_transient`` — the extra memory alive at the peak inside
  the call's forward / backward (under AC the backward recomputes the whole layer).

Every coefficient below comes from reading the forward code op by op (torchmultimodal
nightly 2024.4.1, torch 2.14) and asking "which tensors does each op save, in which
dtype". ``docs/planner.md`` walks through them; ``tests/test_plan_activations.py``
checks the saved bytes against autograd's own saved-tensor hooks, on real CPU tensors
(fp32) and on fake CUDA tensors under real CUDA autocast rules (bf16-mixed).

Dtype traps that decide these numbers:

* CUDA autocast runs ``softmax``, ``layer_norm``, ``log_softmax`` in fp32 and
  matmuls/convs in bf16. Each ``nn.Linear`` casts its input separately — FLAVA's
  q/k/v projections save THREE bf16 copies of the same normalised input.
* FLAVA's attention (``modules.layers.attention``) materialises scores: it saves the
  fp32 softmax output AND its bf16 copy (``type_as``) — 6 bytes per score under
  bf16-mixed, and ``q``/``k``/``v`` are re-laid-out (copied) by ``matmul``.
* ``Fp32LayerNorm`` upcasts: under ``bf16-true`` it saves an fp32 copy of its input.
* The residual stream stays fp32 under autocast (bf16 branch + fp32 input = fp32).
* ViT uses ``F.scaled_dot_product_attention`` (flash / memory-efficient): it saves
  q, k, v (views of the one QKV projection output), the output and a logsumexp —
  no ``T×T`` term.
* ``F.dropout(p=0)`` returns its input: no mask is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaleladder.batches import masked_counts
from scaleladder.models.flavors import Flavor

STATS = 8  # LayerNorm saves mean and rstd, fp32, per token


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element for one precision."""

    mode: str  # "mixed" (autocast), "fp32" (fp32/tf32), "true" (bf16-true)
    c: int  # matmul outputs
    r: int  # residual stream / layer inputs
    store: int  # model inputs as the runner stores them on the device

    def lin_in(self, consumers: int) -> int:
        """Bytes per element the Linears that read one fp32-or-lowp tensor save.

        Autocast casts the input once PER Linear (only parameters are cached);
        without autocast all consumers share the one tensor.
        """
        if self.mode == "mixed":
            return 2 * consumers
        return self.c


def dtypes(precision: str) -> Dtypes:
    if precision in ("bf16-mixed", "fp16-mixed"):
        return Dtypes("mixed", 2, 4, 4)
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


# -- transformer layers ------------------------------------------------------------------


def flava_layer(T: int, f: Flavor, d: Dtypes) -> tuple[float, float, float, float]:
    """(saved, held, fwd_transient, bwd_transient) per sample, FLAVA's own layer (no SDPA)."""
    h, m, a = f.hidden, f.mlp, f.heads
    Th, Tm, S = T * h, T * m, a * T * T
    probs = {"mixed": 4 + 2, "fp32": 4, "true": 2}[d.mode]  # softmax out (+ its bf16 copy under autocast)
    saved = (
        4 * Th + STATS * T  # LN1 saves its fp32 input (an fp32 COPY under bf16-true)
        + d.lin_in(3) * Th  # q, k, v projections' inputs
        + 2 * d.c * Th  # q and k re-laid-out for the batched matmul
        + probs * S
        + d.c * Th  # v re-laid-out
        + d.c * Th  # merged heads: the output projection's input
        + 4 * Th + STATS * T  # LN2 input (fp32)
        + d.lin_in(1) * Th  # fc1 input
        + 2 * d.c * Tm  # fc1 output (GELU input) and GELU output (fc2 input)
    )
    held = d.r * Th if d.mode == "true" else 0.0  # hidden_states keeps the bf16 input; LN saved an fp32 copy
    # Forward: scores, scaled scores (+ their fp32 cast) alive next to the softmax output.
    fwd = {"mixed": 6, "fp32": 8, "true": 4}[d.mode] * S
    # Backward: incoming grad + MLP grads, or later the score grads (fp32 under autocast)
    # once the MLP's saved tensors are gone.
    mlp_phase = d.r * Th + d.c * Th + 2 * d.c * Tm
    attn_phase = d.r * Th + {"mixed": 8, "fp32": 8, "true": 4}[d.mode] * S - 2 * d.c * Tm
    return saved, held, fwd, max(mlp_phase, attn_phase)


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
    held = d.r * Th if d.mode == "true" else 0.0
    fwd = d.r * Th + d.c * Th
    mlp_phase = d.r * Th + d.c * Th + 2 * d.c * Tm
    attn_phase = d.r * Th + qkv + 4 * Th - 2 * d.c * Tm  # dq/dk/dv + the fp32 dq accumulator
    return saved, held, fwd, max(mlp_phase, attn_phase)


def layer_call(name: str, unit: int, T: int, f: Flavor, d: Dtypes, ac: bool) -> Call:
    fn = flava_layer if f.family == "flava" else vit_layer
    saved, held, fwd, bwd = fn(T, f, d)
    if not ac:
        return Call(name, unit, saved, held, fwd, bwd, is_layer=True)
    # Non-reentrant checkpoint: only the layer's input survives; the backward recomputes
    # the layer (all of its saved tensors come back) before running its own backward.
    # FLAVA's layer still RETURNS its attention probabilities, and the encoder keeps them
    # in `attentions` until forward returns, so they are held even under AC.
    probs_held = f.heads * T * T * d.c if f.family == "flava" else 0.0
    return Call(name, unit, d.r * T * f.hidden, probs_held, saved + fwd, saved + bwd, is_layer=True)


# -- whole models ------------------------------------------------------------------------


def input_bytes(f: Flavor, d: Dtypes) -> float:
    """Bytes of one sample of a synthetic batch on the device (floats in the storage dtype)."""
    s = f.image_size
    img = 3 * s * s * d.store
    if f.family == "vit":
        return img + 8
    cb = 3 * f.codebook_image_size**2 * d.store
    return img + cb + 8 * (f.patches + 3 * f.text_len + 1)


def codebook_transient(f: Flavor, d: Dtypes) -> float:
    """Peak per sample inside the frozen DALL-E encoder (no autograd graph: nothing saved).

    Its first group runs at the codebook image's full resolution with ``n_hid``
    channels; a residual block holds its input, the scaled residual and the sum
    (about 3 × n_hid channels) at once. Convs run in the compute dtype.
    """
    return 3 * f.codebook_hidden * f.codebook_image_size**2 * d.c


def _head(n_tokens: float, vocab: int, h: int, d: Dtypes) -> tuple[float, float, float]:
    """A masked-prediction head on n_tokens tokens: (saved, held, transient) per sample."""
    saved_h = {"mixed": 2 + 2 + 2 + 4 + 2, "fp32": 4 * 4, "true": 2 + 2 + 4 + 2}[d.mode] * h + STATS
    saved_v = {"mixed": 4, "fp32": 4, "true": 2}[d.mode] * vocab  # log_softmax output
    held_v = d.c * vocab  # the logits, kept in the loss output object
    transient_v = 4 * vocab if d.mode == "mixed" else 0  # autocast's fp32 copy of the logits
    return n_tokens * (saved_h + saved_v), n_tokens * held_v, n_tokens * transient_v


def vit_calls(f: Flavor, d: Dtypes, ac: bool) -> list[list[Call]]:
    """Forward passes (here one) as lists of calls, in forward order."""
    T, h, s = f.patches + 1, f.hidden, f.image_size
    embed = Call("vit.embed", None, saved=(2 * 3 * s * s if d.mode == "mixed" else 0), fwd_transient=d.c * f.patches * h + d.r * T * h)
    layers = [layer_call("vit.layer", i, T, f, d, ac) for i in range(f.layers)]
    final = Call("vit.final_norm", None, saved=4 * T * h + STATS * T, held=d.r * T * h + (d.r * T * h if d.mode == "true" else 0))
    head = Call("vit.head", None, saved=2 * h + 4 * f.num_classes)
    return [[embed, *layers, final, head]]


def flava_calls(f: Flavor, d: Dtypes, ac: bool) -> list[list[Call]]:
    """FLAVA's five encoder passes and its loss, in forward order (see FLAVAModel.forward)."""
    h, L, s = f.hidden, f.layers, f.image_size
    Ti, Tt = f.patches + 1, f.text_len
    Tm = Ti + Tt + 1  # image tokens + text tokens + the fusion encoder's own CLS
    true_extra = d.r if d.mode == "true" else 0

    def image_pass(tag: str) -> list[Call]:
        embed = Call(f"image{tag}.embed", None, saved=(2 * 3 * s * s if d.mode == "mixed" else 0),
                     fwd_transient=(d.c + 2 * 4) * f.patches * h)
        layers = [layer_call(f"image{tag}.layer", i, Ti, f, d, ac) for i in range(L)]
        final = Call(f"image{tag}.final_norm", None, saved=4 * Ti * h + STATS * Ti, held=(d.r + true_extra) * Ti * h)
        return [embed, *layers, final]

    def text_pass(tag: str) -> list[Call]:
        embed = Call(f"text{tag}.embed", None, saved=4 * Tt * h + STATS * Tt, fwd_transient=3 * d.r * Tt * h)
        layers = [layer_call(f"text{tag}.layer", L + i, Tt, f, d, ac) for i in range(L)]
        final = Call(f"text{tag}.final_norm", None, saved=4 * Tt * h + STATS * Tt, held=(d.r + true_extra) * Tt * h)
        return [embed, *layers, final]

    proj_saved = 2 * (Ti + Tt) * h if d.mode == "mixed" else 0
    mm = [Call("mm.projections", None, saved=proj_saved, fwd_transient=2 * d.c * (Ti + Tt) * h)]
    mm += [layer_call("mm.layer", 2 * L + i, Tm, f, d, ac) for i in range(f.mm_layers)]
    mm.append(Call("mm.final_norm", None, saved=4 * Tm * h + STATS * Tm, held=(d.r + true_extra) * Tm * h))

    # Loss: only the multimodal heads run (the unimodal MLM/MIM ones are skipped when a
    # fusion output exists), on the masked tokens of matched pairs (9 in 10 samples).
    n_text, n_patch = masked_counts(f)
    pos = 0.9
    ts, th, tt = _head(pos * n_text, f.vocab_size, h, d)
    is_, ih, it = _head(pos * n_patch, f.image_vocab, h, d)
    loss = Call("loss.heads", None, saved=ts + is_, held=th + ih + pos * d.r * Tm * h, fwd_transient=max(tt, it))
    return [image_pass(""), text_pass(""), image_pass("_masked"), text_pass("_masked"), mm, [loss]]


def forward_passes(f: Flavor, precision: str, ac: bool) -> list[list[Call]]:
    d = dtypes(precision)
    return flava_calls(f, d, ac) if f.family == "flava" else vit_calls(f, d, ac)


def backward_order(f: Flavor, passes: list[list[Call]]) -> list[Call]:
    """The order autograd runs the calls' backward.

    The engine runs the ready node with the highest sequence number (the most
    recently created), so FLAVA's masked chain — loss heads, fusion, masked text,
    masked image — runs first, and the unmasked passes (reached only through the
    contrastive projections) run last: text, then image. Verified on CPU in
    tests/test_plan_exact.py, where it matters most: FSDP cannot reshard an encoder
    layer until BOTH its passes have been through backward.
    """
    if f.family == "vit":
        return list(reversed(passes[0]))
    img_u, txt_u, img_m, txt_m, mm, loss = passes
    out: list[Call] = []
    for p in (loss, mm, txt_m, img_m, txt_u, img_u):
        out += list(reversed(p))
    return out
