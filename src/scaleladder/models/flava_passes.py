"""FLAVA's twin encoder passes as one: the plain and the masked input in one batch.

TorchMultimodal's ``FLAVAModel.forward`` runs the image encoder twice (the image, then the same
image with its masked patches replaced by the mask token) and the text encoder twice (the text,
then the masked text): 4·L of a step's 4·L + L_mm layer passes (48 of FLAVA-350M's 54), each pass
its own kernels, hooks and FSDP all-gathers. The samples of
the two passes never meet inside an encoder, so here each encoder runs once on the two inputs
concatenated along the batch, and the outputs are split back:

* image: the plain half goes through the masking step with an all-zero mask, which leaves every
  embedding as it was (``e·(1−0) + m·0 = e`` exactly, for a finite mask token);
* text: the padding mask is per sample, so a batch of both is each as it was.

Per sample the arithmetic is the same; only the matrix products are larger. What changes is the
host work (half the unimodal layer passes and their hooks: 30 passes at FLAVA-350M, not 54) and, under FSDP, that each unimodal
layer unit gathers its parameters once per forward instead of twice. The ``torchmultimodal``
implementation keeps the package's two passes (models/flava_impl.py).

The outputs keep ``FLAVAOutput``'s shape for ``FLAVAForPreTraining``: each ``TransformerOutput``
holds ``last_hidden_state`` and, as ``hidden_states``, only the last layer's output before the
final norm (all the fusion encoder reads; the package keeps every layer's). The unimodal
encoders' ``pooler_output``, which no FLAVA loss reads (their poolers are frozen as unused,
rung/unused_params.py), is left out.

Dropout with ``p = 0`` (all of FLAVA's) still dispatches an op per call in training; the
embeddings' dropouts skip it here (``NoOpDropout``), as the fused layers do theirs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchmultimodal.models.flava.model import FLAVAModel, FLAVAOutput
from torchmultimodal.modules.layers.transformer import TransformerOutput


def _halves(out: TransformerOutput, n: int) -> tuple[TransformerOutput, TransformerOutput]:
    """A batched encoder output split into its first ``n`` samples and the rest."""
    last = out.last_hidden_state.split(n)
    hidden = out.hidden_states[-1].split(n) if out.hidden_states else (None, None)
    return tuple(
        TransformerOutput(last_hidden_state=last[i], hidden_states=None if hidden[i] is None else [hidden[i]]) for i in (0, 1))


class OnePassModel(FLAVAModel):
    """``FLAVAModel`` whose image and text encoders each run once per step (module docstring)."""

    def forward(
        self,
        image: Tensor | None = None,
        text: Tensor | None = None,
        image_patches_mask: Tensor | None = None,
        text_masked: Tensor | None = None,
        required_embedding: str | None = None,
        skip_unmasked_mm_encoder: bool = True,
    ) -> FLAVAOutput:
        # anything but a pretraining step (all four inputs, every embedding): FLAVA's own pass
        if (image is None or text is None or image_patches_mask is None or text_masked is None
                or required_embedding not in (None, "mm")):
            return super().forward(image, text, image_patches_mask, text_masked, required_embedding, skip_unmasked_mm_encoder)
        n = image.shape[0]
        mask = image_patches_mask
        image_out, image_masked_out = _halves(
            self.image_encoder(torch.cat([image, image]), torch.cat([torch.zeros_like(mask), mask])), n)
        text_out, text_masked_out = _halves(
            self.text_encoder(input_ids=torch.cat([text, text_masked]), return_attn_weights=True, return_hidden_states=True), n)
        multimodal_out = TransformerOutput()
        if not skip_unmasked_mm_encoder:
            multimodal_out = self.encode_mm(image_out.hidden_states[-1], text_out.hidden_states[-1])
        return FLAVAOutput(
            image=image_out, image_masked=image_masked_out, text=text_out, text_masked=text_masked_out,
            multimodal=multimodal_out,
            multimodal_masked=self.encode_mm(image_masked_out.hidden_states[-1], text_masked_out.hidden_states[-1]),
            projected_image_embeddings=self.image_projection(image_out.last_hidden_state[:, 0, :]),
            projected_text_embeddings=self.text_projection(text_out.last_hidden_state[:, 0, :]),
        )


class NoOpDropout(nn.Dropout):
    """``nn.Dropout`` that returns its input without an op when ``p`` is 0."""

    def forward(self, x: Tensor) -> Tensor:
        return x if self.p == 0 else super().forward(x)


def install(root: nn.Module) -> int:
    """Switch every ``FLAVAModel`` under ``root`` to :class:`OnePassModel` and every
    ``nn.Dropout`` to :class:`NoOpDropout`; how many modules were switched."""
    n = 0
    for m in root.modules():
        new = {FLAVAModel: OnePassModel, nn.Dropout: NoOpDropout}.get(type(m))
        if new is not None:
            m.__class__ = new
            n += 1
    return n
