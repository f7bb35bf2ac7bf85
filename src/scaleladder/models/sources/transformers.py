"""``source: transformers``: a model transformers builds from a configuration class, offline.

``config: LlamaConfig`` with ``kwargs`` makes the configuration; the task's Auto class builds the
model from it (``from_config``: random weights, no hub access: ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1`` are set before transformers is imported):

============================  =====================================  ===================================
task                          built by                               loss
============================  =====================================  ===================================
``causal-lm``                 ``AutoModelForCausalLM``               next-token cross-entropy, pads ignored
``image-classification``      ``AutoModelForImageClassification``    cross-entropy on the labels
``image-text-contrastive``    ``AutoModel`` (two towers: CLIP...)    CLIP's, gathered over the ranks
============================  =====================================  ===================================

A text model takes the project tokenizer's ids (sources/common.py): its text config's pad, bos
and eos ids are set to them, its vocabulary to the flavor's (the kwargs' ``vocab_size``, else
the tokenizer's default size). An image model's ``image_size`` is the flavor's.

Its blocks: the repeated layer class, i.e. the classes of ``_no_split_modules`` whose
instances sit in an ``nn.ModuleList`` (``_no_split_modules`` alone also names embeddings:
``CLIPTextEmbeddings``, ``ViTEmbeddings``), else a class repeated in a ModuleList.
"""

from __future__ import annotations

import difflib
import os
from collections import Counter
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

import scaleladder.models.sources.meta_init as meta_init
from scaleladder.errors import SpecError
from scaleladder.flavors import Flavor
from scaleladder.models.family import Inputs
from scaleladder.models.models_file import TASKS
from scaleladder.models.sources.common import (
    DEFAULT_LOGIT_SCALE,
    TEXT_IDS,
    LibraryFamily,
    LibraryModule,
    causal_lm_loss,
    classification_loss,
    first_line,
    gathered_contrastive_loss,
    no_blocks,
)

#: task -> the transformers Auto class that builds it
AUTO_CLASS: Mapping[str, str] = {
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
    "image-text-contrastive": "AutoModel",
}


def offline() -> None:
    """No hub access for transformers: models are built from their configs, never downloaded."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _transformers() -> Any:
    offline()
    import transformers

    return transformers


class CausalLM(LibraryModule):
    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        ids = batch["input_ids"]
        return causal_lm_loss(self.model(input_ids=ids, use_cache=False).logits, ids)


class ImageClassifier(LibraryModule):
    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        return classification_loss(self.model(pixel_values=batch["image"]).logits, batch["label"])


class Contrastive(LibraryModule):
    """Two towers (CLIP): their pooled, projected embeddings, and the gathered contrastive loss."""

    def __init__(self, flavor: Flavor, model: nn.Module, scale: float) -> None:
        super().__init__(flavor, model)
        old = model.__dict__["_parameters"].get("logit_scale")
        # FSDP1 flattens parameters and rejects 0-dim ones (CLIP's logit_scale is one): a [1]
        # parameter with the same value, put where the model keeps it.
        device = old.device if old is not None else next(model.parameters()).device
        value = float(old.detach().reshape(-1)[0]) if old is not None and not old.is_meta else scale
        holder: nn.Module = model if old is not None else self
        holder.logit_scale = nn.Parameter(torch.full((1,), value, device=device))
        meta_init.set_recipe(holder, "logit_scale", torch.full((1,), value, device="cpu"))
        self.scale_on_model = old is not None

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        model: Any = self.model
        text = _pooled(model.get_text_features(input_ids=batch["input_ids"]))
        image = _pooled(model.get_image_features(pixel_values=batch["image"]))
        scale: Tensor = model.logit_scale if self.scale_on_model else self.__dict__["_parameters"]["logit_scale"]
        return gathered_contrastive_loss(image, text, scale)


def _pooled(out: Any) -> Tensor:
    """get_*_features returns the embeddings (transformers 4) or an output whose pooler_output they are (5)."""
    if isinstance(out, Tensor):
        return out
    pooled: Tensor = out.pooler_output
    return pooled


class TransformersFamily(LibraryFamily):
    name: ClassVar[str] = "transformers"
    task: ClassVar[str] = ""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        super().__init__(entry)
        transformers = _transformers()
        config_name = str(entry["config"])
        cls = getattr(transformers, config_name, None)
        base = getattr(transformers, "PreTrainedConfig", None) or transformers.PretrainedConfig
        if not (isinstance(cls, type) and issubclass(cls, base)):
            names = [n for n in dir(transformers) if n.endswith("Config")]
            close = difflib.get_close_matches(config_name, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SpecError(f"{self.where}: transformers has no configuration class {config_name!r}{hint}")
        self.config_cls = cls
        self.auto = getattr(transformers, AUTO_CLASS[self.task])
        mapping = getattr(self.auto, "_model_mapping", None)
        if mapping is not None and cls not in mapping:
            raise SpecError(f"{self.where}: {config_name} cannot serve task {self.task} "
                            f"(transformers' {AUTO_CLASS[self.task]} has no model for it)")
        if self.task == "image-text-contrastive" and mapping is not None:
            model_cls = mapping[cls]
            if not (hasattr(model_cls, "get_text_features") and hasattr(model_cls, "get_image_features")):
                raise SpecError(f"{self.where}: {config_name} cannot serve task {self.task}: its model "
                                f"{model_cls.__name__} has no text and image towers (get_text_features, get_image_features)")

    def config(self, flavor: Flavor) -> Any:
        kwargs = dict(self.entry.get("kwargs", {}))
        try:
            config = self.config_cls(**kwargs)
        except (TypeError, ValueError, KeyError) as e:
            raise SpecError(f"{self.where}: {self.config_cls.__name__}(**{kwargs}) failed: {type(e).__name__}: {first_line(e)}") from None
        if self.inputs in ("text", "image-text"):
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            text.vocab_size = flavor.vocab_size
            for key, value in TEXT_IDS.items():
                setattr(text, key, value)
            limit = getattr(text, "max_position_embeddings", None)
            if isinstance(limit, int) and limit < flavor.text_len:
                raise SpecError(f"{self.where}: text_len {flavor.text_len} exceeds its max_position_embeddings {limit}")
        if self.inputs in ("image", "image-text"):
            vision = getattr(config, "vision_config", None) or config
            given = kwargs.get("vision_config", kwargs) if vision is not config else kwargs
            if hasattr(vision, "image_size"):
                if isinstance(given, dict) and "image_size" in given and given["image_size"] != flavor.image_size:
                    raise SpecError(f"{self.where}: image_size {flavor.image_size} but its kwargs say {given['image_size']}")
                vision.image_size = flavor.image_size
        if self.task == "image-classification" and "num_labels" not in kwargs and "id2label" not in kwargs:
            config.num_labels = flavor.num_classes
        return config

    def make(self, flavor: Flavor) -> nn.Module:
        config = self.config(flavor)
        try:
            model: nn.Module = self.auto.from_config(config)
        except ValueError as e:
            raise SpecError(f"{self.where}: {self.config_cls.__name__} cannot serve task {self.task}: {first_line(e)}") from None
        return model

    def find_blocks(self, model: nn.Module) -> set[type[nn.Module]]:
        return repeated_layers(model, self.where)


class CausalLMFamily(TransformersFamily):
    task: ClassVar[str] = "causal-lm"
    inputs: ClassVar[Inputs] = "text"

    def wrap(self, flavor: Flavor, model: nn.Module) -> LibraryModule:
        return CausalLM(flavor, model)


class ImageClassificationFamily(TransformersFamily):
    task: ClassVar[str] = "image-classification"
    inputs: ClassVar[Inputs] = "image"

    def wrap(self, flavor: Flavor, model: nn.Module) -> LibraryModule:
        return ImageClassifier(flavor, model)


class ContrastiveFamily(TransformersFamily):
    task: ClassVar[str] = "image-text-contrastive"
    inputs: ClassVar[Inputs] = "image-text"
    items_per_sample: ClassVar[int] = 2  # an image and a caption, as FLAVA

    def wrap(self, flavor: Flavor, model: nn.Module) -> LibraryModule:
        scale = float(getattr(getattr(model, "config", None), "logit_scale_init_value", DEFAULT_LOGIT_SCALE))
        return Contrastive(flavor, model, scale)


FAMILIES: Mapping[str, type[TransformersFamily]] = {
    f.task: f for f in (CausalLMFamily, ImageClassificationFamily, ContrastiveFamily)
}
assert set(FAMILIES) == set(TASKS), "every task of models_file.TASKS has a family"


def family(entry: Mapping[str, Any]) -> TransformersFamily:
    return FAMILIES[str(entry["task"])](entry)


def repeated_layers(model: nn.Module, where: str) -> set[type[nn.Module]]:
    """The classes of ``_no_split_modules`` whose instances sit in a ModuleList; else the classes
    repeated in one (at least twice, with parameters)."""
    listed = [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]
    no_split = set(getattr(model, "_no_split_modules", None) or ())
    found = {type(c) for c in listed if type(c).__name__ in no_split}
    if not found:
        counts = Counter(type(c) for c in listed if any(True for _ in c.parameters()))
        found = {t for t, n in counts.items() if n >= 2}
    if not found:
        raise no_blocks(where, model, f"no class of _no_split_modules ({', '.join(sorted(no_split)) or 'none'}) "
                                      "sits in a ModuleList, and no class repeats in one")
    return found
