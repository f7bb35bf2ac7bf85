"""FLAVA's transformer layers on fused attention, over the same parameters.

TorchMultimodal's FLAVA layer (``models/flava/transformer.py``, nightly 2024.4.1) computes
attention op by op (``modules/layers/attention.py``): ``matmul``, a divide by
``sqrt(tensor(d))``, ``masked_fill``, softmax, dropout, ``matmul``, with ``contiguous`` copies
to split and merge the heads, and always returns the probabilities, which the encoder keeps in
a list until the forward returns. Here the same ``query``/``key``/``value``/``output`` Linears
feed ``torch.nn.functional.scaled_dot_product_attention`` (one fused kernel, flash or
memory-efficient on a GPU), and no probabilities are made.

How: each instance's class is switched to a subclass that only overrides ``forward``, so the
modules, parameters and state_dict keys are the package's own (checkpoints, initialisation,
FSDP units, rung/parallelize.py's ``isinstance`` checks and the planner's layouts do not change), and
the installed package is never edited.

* ``SdpaLayer``: pre-norm attention and MLP (FLAVA builds every encoder ``norm_first=True``).
  Attention weights, or a head mask, are computed the package's way when asked for.
* ``WeightlessEncoder``: FLAVA's own callers ask every encoder for the weights and never read
  them; the encoder passes the request on only when ``keep_attn_weights`` is set on it.
* ``BoolMaskTextEncoder``: the text encoder's padding mask, built as a boolean once per pass
  (``input_ids != pad``), not a float mask written through a boolean index (a device sync:
  ``index_put_`` with a mask runs ``nonzero``) and compared with 0 again in every layer.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torchmultimodal.models.flava.transformer import TransformerEncoder, TransformerEncoderLayer
from torchmultimodal.modules.encoders.bert_text_encoder import BERTTextEncoder
from torchmultimodal.modules.layers.transformer import TransformerOutput

from scaleladder.models.flava_norm import fp32_layer_norm


def attention(layer: TransformerEncoderLayer, x: Tensor, shape: tuple[int, int], mask: Tensor | None) -> Tensor:
    """The layer's self-attention block on SDPA. ``x``: the normalised tokens as [B·T, d];
    ``shape``: (B, T); ``mask``: boolean (True: attend) broadcastable to [B, heads, T, T], or the
    package's 1/0 float mask. Returns [B·T, d]."""
    mha = layer.attention
    b, t = shape
    q, k, v = (proj(x).view(b, t, mha.n_head, -1).transpose(1, 2) for proj in (mha.query, mha.key, mha.value))
    if mask is not None and mask.dtype.is_floating_point:
        mask = mask != 0  # the package's convention: 1 attends, 0 is masked
    p = mha.attn.attn_dropout if layer.training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    projected: Tensor = mha.output(out.transpose(1, 2).reshape(b * t, -1))
    return projected


class SdpaLayer(TransformerEncoderLayer):
    """TorchMultimodal's FLAVA layer, its attention fused (see the module docstring)."""

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, head_mask: Tensor | None = None,
                return_attn_weights: bool = False) -> Any:
        if return_attn_weights or head_mask is not None:
            return super().forward(hidden_states, attention_mask, head_mask, return_attn_weights)
        # TRAP: the layer works on [B·T, d]. A Linear on a 3-D input flattens and unflattens it
        # inside, and each of those views is one more autograd node (a reshape in the backward):
        # two per Linear, six Linears a layer, against one view in and one out here.
        b, t, d = hidden_states.shape
        x = hidden_states.reshape(b * t, d)
        a = attention(self, fp32_layer_norm(self.attention_layernorm, x), (b, t), attention_mask)
        if self.attention_dropout.p:  # FLAVA's dropout is 0: skip the no-op kernels
            a = self.attention_dropout(a)
        h = a + x
        f = self.feedforward(fp32_layer_norm(self.feedforward_layernorm, h))
        if self.feedforward_dropout.p:
            f = self.feedforward_dropout(f)
        return (h + f).view(b, t, d)


class WeightlessEncoder(TransformerEncoder):
    """An encoder that returns attention weights only when ``keep_attn_weights`` is set on it."""

    keep_attn_weights = False

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, head_mask: Tensor | None = None,
                return_attn_weights: bool = False, return_hidden_states: bool = False) -> TransformerOutput:
        return super().forward(hidden_states, attention_mask, head_mask,
                               return_attn_weights and self.keep_attn_weights, return_hidden_states)


class BoolMaskTextEncoder(BERTTextEncoder):
    """FLAVA's text encoder with its padding mask made without a device sync."""

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, inputs_embeds: Tensor | None = None, return_attn_weights: bool = False,
                return_hidden_states: bool = False) -> TransformerOutput:
        pad = getattr(self.embeddings, "pad_token_id", None)
        if attention_mask is not None or input_ids is None or pad is None:
            return super().forward(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                                   return_attn_weights, return_hidden_states)
        mask = (input_ids != pad)[:, None, None, :]  # [B, 1, 1, L]: every query sees the non-pad keys
        hidden = self.embeddings(input_ids=input_ids, position_ids=position_ids, token_type_ids=token_type_ids,
                                 inputs_embeds=inputs_embeds)
        out = self.encoder(hidden, attention_mask=mask, return_attn_weights=return_attn_weights,
                           return_hidden_states=return_hidden_states)
        last, pooled = out.last_hidden_state, out.pooler_output
        if self.layernorm:
            last = self.layernorm(last)
        if self.pooler:
            pooled = self.pooler(last)
        return TransformerOutput(last_hidden_state=last, pooler_output=pooled, hidden_states=out.hidden_states,
                                 attentions=out.attentions)


SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    TransformerEncoderLayer: SdpaLayer,
    TransformerEncoder: WeightlessEncoder,
    BERTTextEncoder: BoolMaskTextEncoder,
}


def install(root: nn.Module) -> int:
    """Switch FLAVA's layers, encoders and text encoder under ``root`` to the classes above;
    how many modules were switched. A post-norm layer (which FLAVA never builds) is refused."""
    n = 0
    for m in root.modules():
        new = SWAPS.get(type(m))
        if new is None:
            continue
        if isinstance(m, TransformerEncoderLayer) and not m.norm_first:
            raise ValueError("flava_attention: a post-norm FLAVA layer; only FLAVA's pre-norm layers are fused")
        m.__class__ = new
        n += 1
    return n
