"""FLAVA's pretraining losses without a host–device sync: the same losses, fixed shapes.

TorchMultimodal's losses (``modules/losses/flava.py``, nightly 2024.4.1) make the host wait for
the device about 20 times a step, each time the kernels queued so far drain:

* boolean-mask indexing (``hidden[masked_tokens]``, ``sequence[pos_mask]``, ``logits[mask]``,
  and ``image_labels[~mask] = -1`` in ``FLAVAForPreTraining``): the result's size is on the
  device, so ``nonzero`` copies it to the host;
* ``if torch.isnan(loss) and self.ignore_nan``: Python's ``and`` asks for the tensor's truth
  first (``is_nonzero``), even though ``ignore_nan`` is False in FLAVA;
* ``pos_pairs.new([True])``: a tensor from a host list, copied to the device each step.

Here every selection is a label instead of a shape: a token that is not masked, or belongs to
an ITM negative, gets the ignore label (``torch.where``), and the cross entropy's mean over
non-ignored entries is the original's mean over the selected ones. The heads therefore run
over every token of every pair, not only over the masked tokens of positive pairs: more FLOPs
(models/flops.py counts them in HFU, not in MFU; docs/metrics.md) for no wait.

How: instances switch class to subclasses that override ``forward`` only (no parameter or
state_dict key changes; see models/flava_attention.py).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torchmultimodal.models.flava.model import FLAVAForPreTraining, FLAVAOutput
from torchmultimodal.modules.losses.contrastive_loss_with_temperature import _gather_embeddings_and_labels
from torchmultimodal.modules.losses.flava import (
    FLAVAGlobalContrastiveLoss,
    FLAVAGlobalContrastiveLossOutput,
    FLAVAPretrainingLoss,
    FLAVAPretrainingLossOutput,
    MaskedPredictionLoss,
    MaskedPredictionLossOutput,
)
from torchmultimodal.utils.distributed import BackpropType

CE_IGNORE = -100  # F.cross_entropy's default ignore_index, for the contrastive labels


def weighted(loss: Tensor, weight: float) -> Tensor:
    """``loss * weight``; FLAVA's weights are all 1.0, and a multiply by 1 is one more op each way."""
    return loss if weight == 1 else loss * weight


def keep_labels(labels: Tensor, keep: Tensor, ignore: int) -> Tensor:
    """``labels`` where ``keep`` (broadcast from the left), else ``ignore``: a fixed-shape selection."""
    return torch.where(keep.view(keep.shape + (1,) * (labels.dim() - keep.dim())), labels, ignore)


class SyncFreeMaskedPrediction(MaskedPredictionLoss):
    """MLM/MIM: the head on every token, the cross entropy on the labelled ones."""

    def forward(self, hidden_states: Tensor, masked_labels: Tensor | None = None) -> MaskedPredictionLossOutput:
        # On [N, d]: a Linear on a 3-D input adds two views to the backward (flava_attention.py).
        prediction = self.cls(hidden_states.reshape(-1, hidden_states.shape[-1]))
        if masked_labels is None:
            loss = prediction.sum() * 0
        else:  # mean over tokens whose label is not ignore_index, as over the selected tokens before
            loss = self.ce_loss(prediction.view(-1, self.vocab_size), masked_labels.reshape(-1))
        # No `isnan(loss) and ignore_nan` test: FLAVA builds ignore_nan=False, and the test alone syncs.
        if self.ignore_nan:
            loss = torch.nan_to_num(loss, nan=0.0)
        return MaskedPredictionLossOutput(logits=prediction, loss=loss)


class SyncFreeContrastive(FLAVAGlobalContrastiveLoss):
    """The global contrastive loss; negatives get the ignore label instead of leaving the batch."""

    def forward(self, image_sequence: Tensor, text_sequence: Tensor, mask: Tensor | None) -> FLAVAGlobalContrastiveLossOutput:
        text = F.normalize(text_sequence, dim=-1)
        image = F.normalize(image_sequence, dim=-1)
        self.logit_scale.data.clamp_(0, 4.6052)
        temperature = torch.exp(self.logit_scale)
        image_all, text_all, labels = _gather_embeddings_and_labels(image, text, BackpropType.GLOBAL)
        logits_image = torch.matmul(image, text_all.transpose(0, 1)) * temperature
        logits_text = torch.matmul(text, image_all.transpose(0, 1)) * temperature
        if mask is not None:
            labels = keep_labels(labels, mask, CE_IGNORE)
        loss_image = F.cross_entropy(logits_image, labels, ignore_index=CE_IGNORE)
        loss_text = F.cross_entropy(logits_text, labels, ignore_index=CE_IGNORE)
        return FLAVAGlobalContrastiveLossOutput(
            loss=(loss_image + loss_text) / 2, image_logits=logits_image, text_logits=logits_text, image_loss=loss_image,
            text_loss=loss_text, text_embedding=text, image_embedding=image, logit_scale=self.logit_scale.data)


class SyncFreePretrainingLoss(FLAVAPretrainingLoss):
    """``FLAVAPretrainingLoss.forward``, branch for branch, with labels in place of masks."""

    def forward(
        self,
        image_sequence: Tensor | None = None,
        text_sequence: Tensor | None = None,
        image_masked_sequence: Tensor | None = None,
        text_masked_sequence: Tensor | None = None,
        multimodal_sequence: Tensor | None = None,
        multimodal_masked_sequence: Tensor | None = None,
        itm_labels: Tensor | None = None,
        mim_labels: Tensor | None = None,
        mlm_labels: Tensor | None = None,
        projected_image_embeddings: Tensor | None = None,
        projected_text_embeddings: Tensor | None = None,
    ) -> FLAVAPretrainingLossOutput:
        out = FLAVAPretrainingLossOutput()
        mm = multimodal_masked_sequence
        if mm is None:
            self._unimodal(out, image_masked_sequence, text_masked_sequence, mim_labels, mlm_labels)
        pos_mask = None
        if mm is not None and self.itm_loss_weight > 0:
            if itm_labels is not None:
                pos_pairs = itm_labels.ne(0)
                pos_mask = pos_pairs | ~pos_pairs.any()  # no positive at all: every pair, as the package does
            out.itm_output = self.itm_loss(mm, itm_labels)
            out.itm_output.loss = weighted(out.itm_output.loss, self.itm_loss_weight)
            out.losses.itm_loss = out.itm_output.loss
            if pos_mask is not None:
                ignore = self.mmm_loss.mlm.ignore_index
                mlm_labels = None if mlm_labels is None else keep_labels(mlm_labels, pos_mask, ignore)
                mim_labels = None if mim_labels is None else keep_labels(mim_labels, pos_mask, ignore)
        if mm is not None:
            self._multimodal(out, mm, image_masked_sequence, text_masked_sequence, mim_labels, mlm_labels)
        if projected_image_embeddings is not None and projected_text_embeddings is not None and self.contrastive_loss_weight > 0:
            out.global_contrastive_output = self.contrastive_loss(projected_image_embeddings, projected_text_embeddings, pos_mask)
            out.global_contrastive_output.loss = weighted(out.global_contrastive_output.loss, self.contrastive_loss_weight)
            out.losses.global_contrastive_loss = out.global_contrastive_output.loss
        return out

    def _unimodal(self, out: FLAVAPretrainingLossOutput, image_masked: Tensor | None, text_masked: Tensor | None,
                  mim_labels: Tensor | None, mlm_labels: Tensor | None) -> None:
        """MIM and MLM on the unimodal encoders (only when there is no multimodal pass)."""
        if image_masked is not None and self.mim_weight > 0:
            start = -mim_labels.size(1) if mim_labels is not None else 1
            out.mim_output = self.mim_loss(image_masked[:, start:, :], mim_labels)
            out.mim_output.loss = weighted(out.mim_output.loss, self.mim_weight)
            out.losses.mim_loss = out.mim_output.loss
        if text_masked is not None and self.mlm_weight > 0:
            start = -mlm_labels.size(1) if mlm_labels is not None else 1
            out.mlm_output = self.mlm_loss(text_masked[:, start:, :], mlm_labels)
            out.mlm_output.loss = weighted(out.mlm_output.loss, self.mlm_weight)
            out.losses.mlm_loss = out.mlm_output.loss

    def _multimodal(self, out: FLAVAPretrainingLossOutput, mm: Tensor, image_masked: Tensor | None, text_masked: Tensor | None,
                    mim_labels: Tensor | None, mlm_labels: Tensor | None) -> None:
        """MMM text and image on the fusion encoder's output (its slices as the package takes them)."""
        # union-attr below: the package's slices, as it writes them (the image's too tests
        # mlm_labels): where the labels are None the masked sequence is taken to be there
        if self.mmm_text_loss_weight > 0:
            start = -mlm_labels.size(1) if mlm_labels is not None else -(text_masked.size(1) - 1)  # type: ignore[union-attr]
            out.mmm_text_output = self.mmm_loss.mlm(mm[:, start:, :], mlm_labels)
            out.mmm_text_output.loss = weighted(out.mmm_text_output.loss, self.mmm_text_loss_weight)
            out.losses.mmm_text_loss = out.mmm_text_output.loss
        if self.mmm_image_loss_weight > 0:
            # From 2: the fusion encoder's CLS and the image encoder's CLS come first.
            total = mim_labels.size(1) if mlm_labels is not None else image_masked.size(1) - 1  # type: ignore[union-attr]
            out.mmm_image_output = self.mmm_loss.mim(mm[:, 2:2 + total, :], mim_labels)
            out.mmm_image_output.loss = weighted(out.mmm_image_output.loss, self.mmm_image_loss_weight)
            out.losses.mmm_image_loss = out.mmm_image_output.loss


class SyncFreePreTraining(FLAVAForPreTraining):
    """``FLAVAForPreTraining.forward`` with the unmasked patches' labels set by ``torch.where``."""

    def forward(
        self,
        image: Tensor | None = None,
        text: Tensor | None = None,
        image_for_codebook: Tensor | None = None,
        image_patches_mask: Tensor | None = None,
        text_masked: Tensor | None = None,
        required_embedding: str | None = None,
        skip_unmasked_mm_encoder: bool = True,
        itm_labels: Tensor | None = None,
        mlm_labels: Tensor | None = None,
    ) -> FLAVAPretrainingLossOutput:
        image_labels = None
        if image_for_codebook is not None:  # union-attr: the package's contract gives the mask with it
            image_patches_mask = image_patches_mask.flatten(1).to(torch.bool)  # type: ignore[union-attr]
            image_labels = torch.where(image_patches_mask, self.image_codebook(image_for_codebook).flatten(1), -1)
        o: FLAVAOutput = self.model(image=image, text=text, image_patches_mask=image_patches_mask, text_masked=text_masked,
                                    required_embedding=required_embedding, skip_unmasked_mm_encoder=skip_unmasked_mm_encoder)
        return self.loss(
            image_sequence=o.image.last_hidden_state, text_sequence=o.text.last_hidden_state,
            image_masked_sequence=o.image_masked.last_hidden_state, text_masked_sequence=o.text_masked.last_hidden_state,
            multimodal_sequence=o.multimodal.last_hidden_state if not skip_unmasked_mm_encoder else None,
            multimodal_masked_sequence=o.multimodal_masked.last_hidden_state, itm_labels=itm_labels, mim_labels=image_labels,
            mlm_labels=mlm_labels, projected_image_embeddings=o.projected_image_embeddings,
            projected_text_embeddings=o.projected_text_embeddings)


SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    MaskedPredictionLoss: SyncFreeMaskedPrediction,
    FLAVAGlobalContrastiveLoss: SyncFreeContrastive,
    FLAVAPretrainingLoss: SyncFreePretrainingLoss,
    FLAVAForPreTraining: SyncFreePreTraining,
}


def install(root: nn.Module) -> int:
    """Switch FLAVA's pretraining wrapper and losses under ``root`` to the classes above; how many."""
    n = 0
    for m in root.modules():
        new = SWAPS.get(type(m))
        if new is not None:
            m.__class__ = new
            n += 1
    return n
