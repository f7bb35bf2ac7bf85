"""FLAVA / ViT transforms: shapes, dtypes, and the masking rates FLAVA pretraining uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from scaleladder.data import synthetic
from scaleladder.data import tokenizer as tokmod
from scaleladder.data.transforms import FlavaTransform, TextCodec, VitTransform, block_mask, collate, mask_counts
from scaleladder.flavors import get_flavor

WORDS = sorted({w for i in range(300) for w in synthetic.make_sample(0, i, 8).caption.replace(",", "").split()})


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    captions = [synthetic.make_sample(0, i, 8).caption for i in range(300)]
    return tokmod.save(tokmod.train_wordpiece(captions, 1024), d)


def _raw(i: int, size: int = 48) -> dict:
    s = synthetic.make_sample(5, i, size)
    return {"__key__": f"{i:09d}", "__url__": "mem", "jpg": s.jpeg, "txt": s.caption.encode(), "cls": str(s.label).encode()}


@pytest.mark.parametrize("name", ["flava-debug", "flava-350m"])
def test_flava_shapes_and_dtypes(name: str, tokenizer_file: Path) -> None:
    f = get_flavor(name)
    t = FlavaTransform(f, tokenizer_file, seed=0, rank=0, world=1)
    batch = collate([t(_raw(i)) for i in range(3)])
    S, L, P = f.image_size, f.text_len, f.patches
    expect = {
        "image": ((3, 3, S, S), torch.float32),
        "image_for_codebook": ((3, 3, S // 2, S // 2), torch.float32),
        "image_patches_mask": ((3, P), torch.int64),
        "text": ((3, L), torch.int64),
        "text_masked": ((3, L), torch.int64),
        "mlm_labels": ((3, L), torch.int64),
        "itm_labels": ((3,), torch.int64),
    }
    assert {k: (tuple(v.shape), v.dtype) for k, v in batch.items()} == expect
    cb = batch["image_for_codebook"]
    assert cb.min() >= 0.1 - 1e-6 and cb.max() <= 0.9 + 1e-6  # DALL-E map_pixels range, inside [0, 1]
    assert -3 < batch["image"].mean() < 3 and batch["image"].std() > 0.1  # normalised, not blank
    text = batch["text"]
    vocab = Tokenizer.from_file(str(tokenizer_file)).get_vocab()
    assert (text[:, 0] == vocab["[CLS]"]).all()
    for row in text:
        n = int((row != 0).sum())
        assert (row[n:] == 0).all() and row[n - 1] == vocab["[SEP]"]  # [PAD] = 0 after [SEP]


def test_vit_shapes_and_labels() -> None:
    f = get_flavor("vit-debug")
    t = VitTransform(f, seed=0, rank=0, world=1)
    batch = collate([t(_raw(i)) for i in range(4)])
    assert batch["image"].shape == (4, 3, f.image_size, f.image_size) and batch["image"].dtype == torch.float32
    assert batch["label"].dtype == torch.int64
    assert batch["label"].tolist() == [synthetic.make_sample(5, i, 48).label for i in range(4)]


def test_block_mask_counts_and_blocks() -> None:
    assert mask_counts(196) == (75, 16)
    assert mask_counts(16) == (6, 1)  # flava-debug: 4 x 4 patches
    rng = np.random.default_rng(0)
    masks = np.stack([block_mask(rng, 14, 75, 16) for _ in range(300)])
    counts = masks.sum(1)
    assert counts.max() <= 75 and 68 <= counts.mean() <= 75
    # Block-wise, not i.i.d.: nearly every masked patch has a masked 4-neighbour.
    grid = masks.reshape(-1, 14, 14)
    pad = np.pad(grid, ((0, 0), (1, 1), (1, 1)))
    neighbour = (pad[:, :-2, 1:-1] | pad[:, 2:, 1:-1] | pad[:, 1:-1, :-2] | pad[:, 1:-1, 2:]).astype(bool)
    assert (neighbour & grid.astype(bool)).sum() / grid.sum() > 0.95
    small = np.stack([block_mask(rng, 4, 6, 1) for _ in range(300)]).sum(1)
    assert small.max() <= 6 and small.mean() >= 5


def test_mlm_rates_80_10_10(tokenizer_file: Path) -> None:
    codec = TextCodec(tokenizer_file, 64)
    rng = np.random.default_rng(1)
    # Long captions, so the at-least-one-target rule barely moves the rate.
    text = " ".join(WORDS[:40])
    ids = codec.encode(text)
    chosen = masked_to_mask = masked_to_random = kept = eligible = 0
    for _ in range(1000):
        masked, labels = codec.mlm(ids, rng)
        sel = labels != -1
        is_special = np.isin(ids, codec.special)
        assert not (sel & is_special).any()  # never [CLS]/[SEP]/[PAD]
        assert (labels[sel] == ids[sel]).all() and (masked[~sel] == ids[~sel]).all()
        eligible += int((~is_special).sum())
        chosen += int(sel.sum())
        masked_to_mask += int((masked[sel] == codec.mask_id).sum())
        kept += int((masked[sel] == ids[sel]).sum())
        masked_to_random += int(((masked[sel] != ids[sel]) & (masked[sel] != codec.mask_id)).sum())
    assert 0.13 < chosen / eligible < 0.17
    assert 0.77 < masked_to_mask / chosen < 0.83
    assert 0.08 < masked_to_random / chosen < 0.12
    assert 0.08 < kept / chosen < 0.125  # 10% kept, plus the rare random pick of the same token


def test_mlm_always_has_a_target(tokenizer_file: Path) -> None:
    codec = TextCodec(tokenizer_file, 16)
    rng = np.random.default_rng(2)
    ids = codec.encode("a red circle")
    assert all((codec.mlm(ids, rng)[1] != -1).sum() >= 1 for _ in range(200))


def test_truncation_keeps_sep(tokenizer_file: Path) -> None:
    codec = TextCodec(tokenizer_file, 8)
    ids = codec.encode(" ".join(WORDS))
    vocab = Tokenizer.from_file(str(tokenizer_file)).get_vocab()
    assert len(ids) == 8 and ids[0] == vocab["[CLS]"] and ids[-1] == vocab["[SEP]"]


def test_itm_negative_rate(tokenizer_file: Path) -> None:
    t = FlavaTransform(get_flavor("flava-debug"), tokenizer_file, seed=3, rank=0, world=1)
    t._setup()
    captions = [synthetic.make_sample(9, i, 8).caption for i in range(3000)]
    results = [t._itm(c) for c in captions]
    negatives = [(c, out) for c, (out, label) in zip(captions, results) if label == 0]
    assert 0.08 < len(negatives) / len(captions) < 0.12
    assert all(own != swapped for own, swapped in negatives)  # a negative really is another caption
    assert all(out == c for c, (out, label) in zip(captions, results) if label == 1)


def test_transforms_are_seeded_per_reader(tokenizer_file: Path) -> None:
    f = get_flavor("flava-debug")
    a = [FlavaTransform(f, tokenizer_file, seed=0, rank=0, world=2)(_raw(i)) for i in range(3)]
    b = [FlavaTransform(f, tokenizer_file, seed=0, rank=0, world=2)(_raw(i)) for i in range(3)]
    c = [FlavaTransform(f, tokenizer_file, seed=0, rank=1, world=2)(_raw(i)) for i in range(3)]
    same = all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
    differs = any(not torch.equal(x[k], y[k]) for x, y in zip(a, c) for k in ("image", "image_patches_mask", "text_masked"))
    assert same and differs


def test_codec_reads_the_tokenizer_through_its_checks(tokenizer_file: Path, tmp_path: Path) -> None:
    """The loader's path loads with tokenizer.load_tokenizer: pad from the file, and a file without [PAD] = 0 is refused."""
    codec = TextCodec(tokenizer_file, 16)
    assert codec.tok.padding is not None and codec.tok.padding["pad_token"] == "[PAD]" and codec.tok.padding["pad_id"] == 0
    from tokenizers import models

    vocab = {"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "a": 5}
    bad = tmp_path / "tokenizer.json"
    Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]")).save(str(bad))
    with pytest.raises(tokmod.DataError, match=r"\[PAD\] has id 1, but scaleladder needs it to be 0"):
        TextCodec(bad, 16)
    with pytest.raises(tokmod.DataError, match="tokenizer file does not exist"):
        TextCodec(tmp_path / "missing.json", 16)
