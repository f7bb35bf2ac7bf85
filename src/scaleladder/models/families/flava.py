"""FLAVA pretraining: TorchMultimodal's FLAVAForPreTraining (image, text and multimodal encoders,
its losses) with the frozen DALL-E codebook that makes the MIM targets (the TorchMultimodal
FLAVA seed's model; the module itself is ``models/build.py``'s ``FLAVAPretrainer``).

What differs from ViT, all of it here: three stacks of blocks (image, text, multimodal), the
codebook as an FSDP unit of its own (frozen, so FSDP1 must), the heads and poolers no loss
reaches (frozen before wrapping: ``rung/unused_params.py``), two items per sample (an image
and a text), two implementations (``--flava-impl``: models/flava_impl.py), FLOPs counted on
the first batch's masks, and the planner's facts for its passes (its activation formulas are
``planner/activations.py``'s, the model ``activations`` names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, cast

from scaleladder.models.batch_layout import FIRST_WORD, ITM_NEGATIVE_EVERY, MASK, masked_counts
from scaleladder.models.family import Family, Inputs, Options
from scaleladder.models.flava_impl import DEFAULT, SDPA, TORCHMULTIMODAL

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from scaleladder.flavors import Flavor
    from scaleladder.models.flops import FlopCount
    from scaleladder.models.train_module import TrainModule

#: FLAVA's heads run on masked tokens of matched pairs only (models/flops.py); before any run the
#: planner takes the pretraining recipe's rates: MLM masks 15% of text tokens, MIM 40% of patches,
#: ITM swaps in a negative caption for half the pairs. (campaign/cost.py prices with the same.)
MLM_RATE, MIM_RATE, POSITIVE_FRACTION = 0.15, 0.40, 0.5


class FlavaFamily(Family):
    name: ClassVar[str] = "flava"
    inputs: ClassVar[Inputs] = "masked-image-text"
    items_per_sample: ClassVar[int] = 2  # the FLAVA seed counts items: an image and a text are two
    analytic: ClassVar[bool] = True
    throughput_unit: ClassVar[str] = "items/s: images + texts"
    rank_modules: ClassVar[tuple[str, ...]] = ("torchmultimodal.models.flava.model",)
    freezes_unused: ClassVar[bool] = True
    # Parameters FLAVA pretraining never uses when the fusion path runs (FLAVAPretrainingLoss skips
    # the unimodal MLM/MIM heads; nothing reads the encoders' pooler outputs). rung.unused_params.freeze_unused
    # finds the same set empirically with a CPU step on flava-debug — too slow to pay for every
    # plan; tests/test_plan.py checks that the two agree.
    unused_prefixes: ClassVar[tuple[str, ...]] = (
        "flava.loss.mlm_loss.", "flava.loss.mim_loss.", "flava.model.image_encoder.pooler.",
        "flava.model.text_encoder.pooler.", "flava.model.mm_encoder.pooler.")
    codebook_prefix: ClassVar[str] = "flava.image_codebook."
    uses_flava_impl: ClassVar[bool] = True
    ops_per_layer_pass: ClassVar[int] = 212  # stated: planner/steptime.py's docstring
    activations: ClassVar[str] = "flava-pretraining"  # planner/activations.py: flava_sdpa_calls, flava_calls

    def build(self, flavor: Flavor, device: str | torch.device, options: Options) -> TrainModule:
        """``options``: ``codebook_weights`` (a local DALL-E encoder file), ``flava_impl`` (default:
        the package's own, as ``models.build.build_model``'s)."""
        import torch

        from scaleladder.models.build import FLAVAPretrainer

        with torch.device(device):
            return FLAVAPretrainer(flavor, options.get("codebook_weights"), options.get("flava_impl", TORCHMULTIMODAL))

    def block_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        # NOT torchmultimodal.modules.layers.transformer.TransformerEncoderLayer (the class the
        # blog names): FLAVA uses its own (FLAVAPretrainer.layer_cls), and a policy on the other wraps nothing.
        return {cast("TrainModule", model).layer_cls}

    def extra_unit_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        from torchmultimodal.models.flava.model import DalleVAEEncoder

        # The frozen codebook is a unit of its own. FSDP1 must: it flattens a unit's
        # parameters into one tensor, which must not mix frozen and trained parameters.
        # FSDP2 need not (it shards per parameter and reduce-scatters only parameters that
        # got a gradient, so a unit may mix them) but we still do, for two reasons: in the
        # root unit the 54M-parameter DALL-E encoder would stay gathered all step long
        # (FSDP2 never reshards the root after forward), and the same unit structure keeps
        # FSDP1 and FSDP2 rungs comparable, memory included.
        return {DalleVAEEncoder}

    def synthetic_sample(self, flavor: Flavor, g: torch.Generator, global_index: int) -> dict[str, Tensor]:
        """``image``, ``image_for_codebook``, ``image_patches_mask``, ``text``, ``text_masked``,
        ``mlm_labels``, ``itm_labels``: every sample masks exactly the same number of text tokens
        and patches, and ITM negatives sit at every 10th global index (rung/batches.py says why)."""
        import torch

        s = flavor.image_size
        out = {"image": torch.randn(3, s, s, generator=g)}
        c = flavor.codebook_image_size
        out["image_for_codebook"] = torch.rand(3, c, c, generator=g)
        n_text, n_patch = masked_counts(flavor)
        mask = torch.zeros(flavor.patches, dtype=torch.long)
        mask[torch.randperm(flavor.patches, generator=g)[:n_patch]] = 1
        out["image_patches_mask"] = mask
        text = torch.randint(FIRST_WORD, flavor.vocab_size, (flavor.text_len,), generator=g)
        text[0], text[-1] = 2, 3  # [CLS] ... [SEP]
        pos = 1 + torch.randperm(flavor.text_len - 2, generator=g)[:n_text]
        labels = torch.full_like(text, -1)
        labels[pos] = text[pos]
        masked = text.clone()
        masked[pos] = MASK
        out.update(text=text, text_masked=masked, mlm_labels=labels)
        out["itm_labels"] = torch.tensor(0 if global_index % ITM_NEGATIVE_EVERY == ITM_NEGATIVE_EVERY - 1 else 1)
        return out

    def flops(self, flavor: Flavor, recompute: bool, first: Mapping[str, Tensor], global_batch: int,
              options: Options) -> FlopCount:
        """The heads' useful work is on the masked tokens of matched pairs: counted on the first
        batch (one host sync, before the timed loop). The sync-free (sdpa) heads run on every
        token: HFU counts that, MFU the useful work."""
        from scaleladder.models.flops import flava_flops

        pos = first["itm_labels"].ne(0)
        n = max(1, int(pos.sum()))
        text = float(first["mlm_labels"][pos].ne(-1).sum()) / n
        patches = float(first["image_patches_mask"][pos].sum()) / n
        return flava_flops(flavor, global_batch, text, patches, n / len(pos), recompute,
                           heads_on_all_tokens=options.get("flava_impl") == SDPA)

    # -- the analytic planner ---------------------------------------------------------------

    def layer_counts(self, flavor: Flavor) -> list[int]:
        return [flavor.layers, flavor.layers, flavor.mm_layers]  # image, text, multimodal

    def reduced(self, flavor: Flavor) -> Flavor:
        return dataclasses.replace(flavor, layers=1, mm_layers=1)

    def layer_passes(self, flavor: Flavor, options: Options) -> list[tuple[str, float]]:
        """TorchMultimodal's FLAVA runs its image and text encoders twice (plain, masked), the sdpa
        FLAVA once over both inputs (models/flava_passes.py); the fusion encoder runs once."""
        ti, tt = flavor.patches + 1, flavor.text_len
        twice = not self.twin_passes(options)  # one pass over twice the samples
        image = [(f"img{i}", float(ti) * (2 if twice else 1)) for i in range(flavor.layers)]
        text = [(f"txt{i}", float(tt) * (2 if twice else 1)) for i in range(flavor.layers)]
        mm = [(f"mm{i}", float(1 + ti + tt)) for i in range(flavor.mm_layers)]
        return image + text + mm if twice else image + text + image + text + mm

    def plan_flops(self, flavor: Flavor, ac: bool, global_batch: int, options: Options) -> FlopCount:
        from scaleladder.models.flops import flava_flops

        return flava_flops(flavor, global_batch, MLM_RATE * flavor.text_len, MIM_RATE * flavor.patches,
                           POSITIVE_FRACTION, ac, heads_on_all_tokens=_impl(options) == SDPA)

    def input_bytes(self, flavor: Flavor, store: int) -> float:
        s = flavor.image_size
        img = 3 * s * s * store
        cb = 3 * flavor.codebook_image_size**2 * store
        return img + cb + 8 * (flavor.patches + 3 * flavor.text_len + 1)  # + the int64 mask, texts, labels

    def twin_passes(self, options: Options) -> bool:
        return _impl(options) != SDPA


def _impl(options: Options) -> str:
    """The implementation the planner models: the rung's default where the options name none."""
    impl: str = options.get("flava_impl", DEFAULT)
    return impl


FAMILY = FlavaFamily()
