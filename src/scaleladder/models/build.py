"""Build a flavor as a module whose ``forward(batch)`` returns the training loss.

Every strategy in the ladder wraps the same :class:`TrainModule`, so DDP, FSDP and
the single-process reference all see one call signature and one loss. :func:`build_model`
builds any flavor through its family (``models/family.py``); the two built-in families' modules,
:class:`ViTClassifier` and :class:`FLAVAPretrainer`, are defined here (they need torch at import,
their families in ``models/families/`` may not).

Traps handled here (see ``shared/anchors.md``):

* ``flava_model_for_pretraining`` builds ``DalleVAEEncoder()`` with its default
  ``pretrained=True``, which DOWNLOADS the DALL-E weights. Compute nodes are
  offline, so we assemble ``FLAVAForPreTraining`` ourselves with
  ``pretrained=False`` and load a local file when one is given.
* FSDP1 rejects 0-dim parameters; FLAVA's ``logit_scale`` is one. We replace it
  with a 1-element parameter: the same value, broadcast identically.
* The codebook encoder is a fixed tokenizer for the MIM targets, so it is frozen
  (no gradients, no optimizer state) and kept in eval mode.
* ``flava_impl="sdpa"`` (what a rung builds by default, models/flava_impl.py) switches FLAVA's layers to fused
  attention and its losses to sync-free ones after the package has built them: same modules,
  same parameters, a different ``forward`` (models/flava_attention.py, flava_norm.py,
  flava_losses.py). ``"torchmultimodal"`` keeps the package's own.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import torch
from torch import Tensor, nn

from scaleladder.flavors import Flavor
from scaleladder.models.flava_impl import SDPA, TORCHMULTIMODAL, parse_flava_impl
from scaleladder.models.train_module import TrainModule as TrainModule  # where it was defined: still importable here
from scaleladder.spec import SpecError


class ViTClassifier(TrainModule):
    def __init__(self, flavor: Flavor) -> None:
        super().__init__()
        from torchmultimodal.modules.encoders.vision_transformer import vision_transformer
        from torchmultimodal.modules.layers.transformer import TransformerEncoderLayer

        self.flavor = flavor
        self.layer_cls = TransformerEncoderLayer
        self.encoder = vision_transformer(
            patch_size=flavor.patch,
            hidden_dim=flavor.hidden,
            dim_feedforward=flavor.mlp,
            n_layer=flavor.layers,
            n_head=flavor.heads,
            image_size=flavor.image_size,
        )
        self.head = nn.Linear(flavor.hidden, flavor.num_classes)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        hidden = self.encoder(batch["image"]).last_hidden_state
        logits = self.head(hidden[:, 0])  # the CLS token
        return nn.functional.cross_entropy(logits.float(), batch["label"])


class FLAVAPretrainer(TrainModule):
    def __init__(self, flavor: Flavor, codebook_weights: str | Path | None = None, flava_impl: str = TORCHMULTIMODAL) -> None:
        super().__init__()
        from torchmultimodal.models.flava.model import DalleEncoder, DalleVAEEncoder, FLAVAForPreTraining, flava_model
        from torchmultimodal.models.flava.transformer import TransformerEncoderLayer
        from torchmultimodal.modules.losses.flava import FLAVAPretrainingLoss

        self.flavor = flavor
        # NOT torchmultimodal.modules.layers.transformer.TransformerEncoderLayer (the
        # class the blog names): FLAVA uses its own, and a policy on the other wraps nothing.
        self.layer_cls = TransformerEncoderLayer
        h = flavor.hidden
        dims = dict(hidden_size=h, num_attention_heads=flavor.heads, num_hidden_layers=flavor.layers, intermediate_size=flavor.mlp)
        model = flava_model(
            **{f"image_{k}": v for k, v in dims.items()},
            **{f"text_{k}": v for k, v in dims.items()},
            multimodal_hidden_size=h,
            multimodal_num_attention_heads=flavor.heads,
            multimodal_num_hidden_layers=flavor.mm_layers,
            multimodal_intermediate_size=flavor.mlp,
            text_and_image_proj_size=h,
            image_size=flavor.image_size,
            patch_size=flavor.patch,
            vocab_size=flavor.vocab_size,
            max_position_embeddings=max(512, flavor.text_len),
        )
        codebook = DalleVAEEncoder(image_size=flavor.codebook_image_size, pretrained=False)
        if flavor.codebook_hidden != 256 or flavor.image_vocab != 8192:
            # debug flavors: a narrow encoder with a small codebook, same architecture
            codebook.encoder = DalleEncoder(n_hid=flavor.codebook_hidden, vocab_size=flavor.image_vocab)
        if codebook_weights is not None:
            load_codebook(codebook, Path(codebook_weights))
        codebook.requires_grad_(False)
        loss = FLAVAPretrainingLoss(hidden_size=h, text_vocab_size=flavor.vocab_size, image_vocab_size=flavor.image_vocab)
        # FSDP1 flattens parameters and rejects 0-dim ones; a [1] tensor broadcasts the same.
        loss.contrastive_loss.logit_scale = nn.Parameter(torch.full((1,), math.log(1 / 0.07)))
        self.flava = FLAVAForPreTraining(model=model, image_codebook=codebook, loss=loss)
        self.flava_impl = parse_flava_impl(flava_impl)
        if flava_impl == SDPA:
            from scaleladder.models import flava_attention, flava_losses, flava_norm, flava_passes

            for swap in (flava_attention.install, flava_norm.install, flava_passes.install, flava_losses.install):
                swap(self.flava)

    def train(self, mode: bool = True) -> FLAVAPretrainer:
        super().train(mode)
        self.flava.image_codebook.eval()  # frozen tokenizer: never in training mode
        return self

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        out = self.flava(
            image=batch["image"],
            text=batch["text"],
            image_for_codebook=batch["image_for_codebook"],
            image_patches_mask=batch["image_patches_mask"],
            text_masked=batch["text_masked"],
            itm_labels=batch["itm_labels"],
            mlm_labels=batch["mlm_labels"],
        )
        # The total pretraining loss is the sum of the losses FLAVA computed this step.
        total: Tensor = sum(v for v in out.losses.values() if v is not None)
        return total


def load_codebook(codebook: nn.Module, path: Path) -> None:
    """Load DALL-E encoder weights from a local file (a state dict, or the pickled encoder)."""
    codebook.get_submodule("encoder").load_state_dict(read_codebook_state(codebook, path))


def read_codebook_state(codebook: nn.Module, path: Path) -> dict[str, Tensor]:
    """The encoder's state dict from a local file, checked against the encoder's names and
    shapes (works on a meta-device codebook too: shapes are all it needs)."""
    if not path.is_file():
        raise SpecError(f"codebook weights file {str(path)!r} does not exist")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # corrupt file: name it
        raise SpecError(f"codebook weights file {str(path)!r} could not be read: {e}") from None
    state = obj.state_dict() if isinstance(obj, nn.Module) else obj
    want = codebook.get_submodule("encoder").state_dict()
    if not isinstance(state, dict) or set(state) != set(want):
        got = sorted(set(state) ^ set(want)) if isinstance(state, dict) else [type(state).__name__]
        raise SpecError(f"codebook weights file {str(path)!r} does not fit the DALL-E encoder: keys differ ({', '.join(got[:3])}...)")
    for k, v in want.items():
        if not isinstance(state[k], Tensor) or state[k].shape != v.shape:
            raise SpecError(f"codebook weights file {str(path)!r} does not fit the DALL-E encoder: {k} has shape "
                            f"{tuple(getattr(state[k], 'shape', ()))}, expected {tuple(v.shape)}")
    return state


def build_model(flavor: Flavor, device: str | torch.device = "cpu", codebook_weights: str | Path | None = None,
                flava_impl: str = TORCHMULTIMODAL) -> TrainModule:
    """Build ``flavor`` on ``device`` through its family (models/family.py). ``device="meta"``
    allocates nothing (for counting).

    ``flava_impl`` (models/flava_impl.py) is ignored by a family it does not apply to. Its default here
    is the package's own FLAVA, which the planner models and the wrapper tests (tests/test_parallelize.py)
    count gathers of; a rung builds what ``scaleladder run --flava-impl`` says (default ``sdpa``, flava_impl.DEFAULT)."""
    from scaleladder.models.families import family_of

    family = family_of(flavor)
    if codebook_weights is not None and not family.codebook_prefix:
        raise SpecError("--codebook-weights applies to FLAVA flavors only")
    return family.build(flavor, device, {"codebook_weights": codebook_weights, "flava_impl": flava_impl})


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@cache
def meta_parameter_count(flavor: Flavor) -> int:
    """Parameters of ``flavor``, counted on the meta device: no memory, about a second."""
    return count_parameters(build_model(flavor, "meta"))
