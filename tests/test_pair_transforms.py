"""The shards' transforms for a models-file model (data/pair_transforms.py): what each input kind
makes of a raw sample, labels from the shards or synthetic, the tokenizer's ids checked against
the model's, and the batch they make trains the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scaleladder.data import synthetic
from scaleladder.data import tokenizer as tokmod
from scaleladder.data.data_errors import DataError
from scaleladder.data.pair_transforms import (
    SHARD_LABELS,
    SYNTHETIC_LABELS,
    ImageTextTransform,
    ImageTransform,
    TextTransform,
    check_tokenizer,
    synthetic_label,
)
from scaleladder.data.transforms import collate
from scaleladder.models.batch_layout import PAD
from scaleladder.models.families import family_of
from scaleladder.models.models_file import BOS_ID, EOS_ID, PAD_ID, load_models_file
from scaleladder.spec import SpecError

REPO = Path(__file__).resolve().parents[1]
MODELS = load_models_file(REPO / "examples" / "models.yaml")


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    captions = [synthetic.make_sample(0, i, 8).caption for i in range(300)]
    return tokmod.save(tokmod.train_wordpiece(captions, 1024), tmp_path_factory.mktemp("tok"))


def raw(i: int, labelled: bool = True, caption: str | None = None) -> dict[str, object]:
    s = synthetic.make_sample(5, i, 48)
    out: dict[str, object] = {"__key__": f"{i:09d}", "__url__": "mem", "jpg": s.jpeg, "txt": (caption or s.caption).encode()}
    if labelled:
        out["cls"] = str(s.label).encode()
    return out


def test_the_ids_are_the_trained_tokenizers(tokenizer_file: Path) -> None:
    vocab = tokmod.load_tokenizer(tokenizer_file).get_vocab()
    assert (vocab[tokmod.PAD], vocab[tokmod.CLS], vocab[tokmod.SEP]) == (PAD_ID, BOS_ID, EOS_ID) and PAD == PAD_ID


def test_image_labels_from_the_shards_or_synthetic() -> None:
    flavor = MODELS["convnext-atto"]
    shards = ImageTransform(flavor, seed=0, rank=0, world=1, labelled=True)
    out = shards(raw(3))
    assert out["image"].shape == (3, 32, 32) and out["image"].dtype == torch.float32
    assert int(out["label"]) == synthetic.make_sample(5, 3, 48).label and shards.record_attrs() == {"label_source": SHARD_LABELS}
    unlabelled = ImageTransform(flavor, seed=0, rank=0, world=1, labelled=False)
    labels = [int(unlabelled(raw(i, labelled=False))["label"]) for i in range(20)]
    assert labels == [synthetic_label(f"{i:09d}", flavor.num_classes) for i in range(20)] and len(set(labels)) > 3
    assert all(0 <= v < flavor.num_classes for v in labels) and unlabelled.label_source == SYNTHETIC_LABELS
    with pytest.raises(DataError, match="no label"):
        shards(raw(0, labelled=False))


def test_text_ids(tokenizer_file: Path) -> None:
    flavor = MODELS["llama-tiny"]
    t = TextTransform(flavor, tokenizer_file, seed=0, rank=0, world=1)
    batch = collate([t(raw(i)) for i in range(4)] + [t(raw(9, caption="a red circle " * 40))])
    ids = batch["input_ids"]
    assert set(batch) == {"input_ids"} and ids.shape == (5, flavor.text_len) and ids.dtype == torch.int64
    assert (ids[:, 0] == BOS_ID).all()
    for row in ids:
        n = int((row != PAD_ID).sum())
        assert row[n - 1] == EOS_ID and (row[n:] == PAD_ID).all() and int((row == EOS_ID).sum()) == 1
    assert int((ids[-1] != PAD_ID).sum()) == flavor.text_len  # truncated, the end of text kept last
    model = family_of(flavor).build(flavor, "cpu", {})
    assert torch.isfinite(model(batch))


@pytest.mark.parametrize("transport", ["float32", "uint8"])
def test_image_text(tokenizer_file: Path, transport: str) -> None:
    flavor = MODELS["clip-tiny"]
    t = ImageTextTransform(flavor, tokenizer_file, seed=0, rank=0, world=1, transport=transport)
    batch = collate([t(raw(i)) for i in range(4)])
    assert set(batch) == {"image", "input_ids"} and batch["input_ids"].shape == (4, flavor.text_len)
    assert batch["image"].shape == (4, 3, 32, 32)
    assert batch["image"].dtype == (torch.uint8 if transport == "uint8" else torch.float32)
    if transport == "float32":
        model = family_of(flavor).build(flavor, "cpu", {})
        assert torch.isfinite(model(batch))


def test_image_text_left_encoded_for_the_device_decoder(tokenizer_file: Path) -> None:
    t = ImageTextTransform(MODELS["clip-tiny"], tokenizer_file, seed=0, rank=0, world=1, decode="gpu")
    out = t(raw(1))
    assert {"jpeg", "box", "flip", "input_ids"} <= set(out) and not bool(out["flip"])


def test_a_tokenizer_with_other_ids_or_more_tokens_is_refused() -> None:
    flavor = MODELS["llama-tiny"]
    bert = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, "word": 2000}
    with pytest.raises(DataError, match=r"^t: \[CLS\] has id 101, but model llama-tiny takes the project tokenizer's ids \(\[CLS\] = 2\)"):
        check_tokenizer(bert, flavor, "t")
    big = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "w": 2047}
    with pytest.raises(SpecError, match="t has 2048 tokens but model llama-tiny has a vocabulary of 1024"):
        check_tokenizer(big, flavor, "t")
    small = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    assert "5 tokens" in (check_tokenizer(small, flavor, "t") or "")
