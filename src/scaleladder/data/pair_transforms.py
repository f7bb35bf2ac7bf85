"""Per-sample transforms for a models-file model's shards, by what its family trains on
(``Family.inputs``), with :class:`~scaleladder.data.transforms.VitTransform`'s interface
(``(flavor, ..., seed, rank, world, augment=, decode=, transport=)``, called on a raw
WebDataset sample in a DataLoader worker, per-reader generators):

* ``"image"``: :class:`ImageTransform`, the ViT transform (crop, flip, ImageNet mean/std); the
  label is the shard's (``cls``) when the shards are labelled, else a synthetic one drawn from
  the sample's key; ``label_source`` says which (``"shards"`` | ``"synthetic"``), for the record;
* ``"text"``: :class:`TextTransform`, ``input_ids``: the caption as the project tokenizer's ids,
  ``[CLS] ... [SEP]`` (the end of text last, truncated to keep it) padded with ``[PAD]`` to
  the flavor's ``text_len``;
* ``"image-text"``: :class:`ImageTextTransform`, ``image`` (the ViT crop, no flip: captions
  name left and right) and ``input_ids``.

A text model's config holds the project tokenizer's special ids (models_file.PAD_ID, BOS_ID,
EOS_ID): :func:`check_tokenizer` refuses a shard set whose tokenizer has others (CLIP pools its
text at the end-of-text id; other ids would pool the wrong token, silently), or more tokens
than the model's vocabulary.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from scaleladder.data.data_errors import DataError
from scaleladder.data.devnorm import IMAGENET_MEAN, IMAGENET_STD
from scaleladder.data.transforms import Encoded, TextCodec, VitTransform, _caption, _image, _PerReader, to_tensor, to_uint8
from scaleladder.flavors import Flavor
from scaleladder.spec import SpecError

#: ImageTransform.label_source: where the labels come from
SHARD_LABELS, SYNTHETIC_LABELS = "shards", "synthetic"


def synthetic_label(key: str, num_classes: int) -> int:
    """A label for an unlabelled sample: drawn from its key, so the same sample has the same
    label on every rank, worker and run."""
    return zlib.crc32(key.encode("utf-8")) % num_classes


def check_tokenizer(vocab: dict[str, int], flavor: Flavor, where: str = "the tokenizer") -> str | None:
    """Raise unless a tokenizer with ``vocab`` can feed ``flavor``'s text; return a notice, if any.

    Its ``[PAD] [CLS] [SEP]`` must have the model's pad, bos and eos ids (a tokenizer trained by
    ``scaleladder shard`` has; one from a BERT ``vocab.txt`` has not), and its ids must fit the
    model's vocabulary."""
    from scaleladder.data.tokenizer import CLS, PAD, SEP
    from scaleladder.models.models_file import BOS_ID, EOS_ID, PAD_ID

    for token, want in ((PAD, PAD_ID), (CLS, BOS_ID), (SEP, EOS_ID)):
        if vocab.get(token) != want:
            raise DataError(f"{where}: {token} has id {vocab.get(token)}, but model {flavor.name} takes the project "
                            f"tokenizer's ids ({token} = {want}); re-shard with a trained tokenizer (no --vocab)")
    size = max(vocab.values()) + 1
    if size > flavor.vocab_size:
        raise SpecError(f"{where} has {size} tokens but model {flavor.name} has a vocabulary of {flavor.vocab_size}; "
                        f"re-shard with --vocab-size <= {flavor.vocab_size} or give the entry's kwargs a larger vocab_size")
    if size < flavor.vocab_size:
        return f"{where} has {size} tokens, model {flavor.name} a vocabulary of {flavor.vocab_size}: the rest go unused"
    return None


class ImageTransform(VitTransform):
    """``inputs == "image"``: the ViT transform; labels from the shards, or synthetic where they have none."""

    def __init__(self, flavor: Flavor, seed: int, rank: int, world: int, labelled: bool, augment: bool = True,
                 decode: str = "cpu", transport: str = "float32") -> None:
        super().__init__(flavor, seed, rank, world, augment=augment, decode=decode, transport=transport)
        self.labelled = labelled
        self.label_source = SHARD_LABELS if labelled else SYNTHETIC_LABELS

    def record_attrs(self) -> dict[str, Any]:
        return {"label_source": self.label_source}

    def __call__(self, sample: dict[str, Any]) -> dict[str, torch.Tensor]:
        if not self.labelled:
            label = synthetic_label(str(sample.get("__key__", "")), self.num_classes)
            sample = {**sample, "cls": str(label).encode()}
        return super().__call__(sample)


class TextTransform(_PerReader):
    """``inputs == "text"``: a caption -> ``input_ids`` [text_len]."""

    def __init__(self, flavor: Flavor, tokenizer_path: Path, seed: int, rank: int, world: int, augment: bool = True,
                 decode: str = "cpu", transport: str = "float32") -> None:
        super().__init__(seed, rank, world, augment, decode, transport)
        self.flavor, self.tokenizer_path, self.text_len = flavor, tokenizer_path, flavor.text_len

    def _setup(self) -> None:
        super()._setup()
        self.codec = TextCodec(self.tokenizer_path, self.text_len)  # built here: each worker its own
        check_tokenizer(self.codec.tok.get_vocab(), self.flavor, f"tokenizer {self.tokenizer_path}")

    def _ids(self, sample: dict[str, Any]) -> torch.Tensor:
        return torch.from_numpy(self.codec.encode(_caption(sample)))

    def __call__(self, sample: dict[str, Any]) -> dict[str, torch.Tensor]:
        if not self._ready:
            self._setup()
        return {"input_ids": self._ids(sample)}


class ImageTextTransform(TextTransform):
    """``inputs == "image-text"``: ``image`` (the ViT crop, normalised as ViT's; never flipped) and ``input_ids``."""

    def __init__(self, flavor: Flavor, tokenizer_path: Path, seed: int, rank: int, world: int, augment: bool = True,
                 decode: str = "cpu", transport: str = "float32") -> None:
        super().__init__(flavor, tokenizer_path, seed, rank, world, augment, decode, transport)
        self.size = flavor.image_size

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if not self._ready:
            self._setup()
        images: dict[str, Any]
        if self.decode == "gpu":
            enc = Encoded(sample, self.size)
            images = enc.members(self._box(enc), False)
        else:
            img = _image(sample, self.size)
            img = img.resize((self.size, self.size), Image.Resampling.BICUBIC, box=self._box(img))
            images = {"image": to_uint8(img) if self.uint8 else to_tensor(img, IMAGENET_MEAN, IMAGENET_STD)}
        return {**images, "input_ids": self._ids(sample)}
