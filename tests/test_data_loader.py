"""The WebDataset loader: exact step counts, shard splitting, checksums, model fit, 2-rank gloo."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import webdataset as wds
from tokenizers import Tokenizer

from scaleladder.data.cli import main as shard
from scaleladder.data.errors import DataError
from scaleladder.data.loader import assign_shards, make_loader
from scaleladder.data.manifest import read_manifest
from scaleladder.data.readers import Reader
from scaleladder.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
from scaleladder.models.flavors import get_flavor
from scaleladder.spec import SpecError

FLAVA = get_flavor("flava-debug")
VIT = get_flavor("vit-debug")


def _make(d: Path, samples: int, per_shard: int, *extra: str) -> Path:
    assert shard(["--out", str(d), "--samples", str(samples), "--per-shard", str(per_shard), "--image-size", "32", "--quiet", *extra]) == 0
    return d


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5 shards of unequal size: 16, 16, 16, 16, 4 samples."""
    return _make(tmp_path_factory.mktemp("data") / "small", 68, 16)


def _load(manifest: Path, flavor=FLAVA, **kw):
    args = dict(local_batch=4, rank=0, world=1, steps=3, workers=0, seed=0, pin_memory=False)
    args.update(kw)
    return make_loader(manifest, flavor, **args)


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_step_count_beyond_one_pass(small: Path, workers: int) -> None:
    # 12 steps x 8 = 96 samples > 68 in the set: streams wrap around; still exactly 12.
    loader = _load(small, local_batch=8, steps=12, workers=workers)
    batches = list(loader)
    assert len(loader) == 12 and len(batches) == 12
    assert all(b["text"].shape == (8, FLAVA.text_len) for b in batches)
    assert list(_load(small, local_batch=8, steps=12, workers=workers)) != []  # iterable again


def test_vit_batches_and_round_trip_labels(small: Path) -> None:
    (batch,) = list(_load(small, flavor=VIT, local_batch=16, steps=1))
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (16, 3, VIT.image_size, VIT.image_size)
    counts = read_manifest(small).info["stats"]["label_counts"]
    assert set(map(str, batch["label"].tolist())) <= set(counts)


def test_flava_text_round_trip(small: Path) -> None:
    # What the loader feeds decodes back to (a prefix, after truncation to text_len, of)
    # a caption that was written. Compared without spaces/punctuation: WordPiece decoding
    # re-spaces commas.
    def squash(s: str) -> str:
        return re.sub(r"\W+", "", s.lower())

    tok = load_tokenizer(small)
    written = {squash(x["txt"].decode()) for s in read_manifest(small).shards for x in wds.WebDataset(str(s.path), shardshuffle=False)}
    decoded = 0
    for batch in _load(small, local_batch=8, steps=2):
        for row in batch["text"]:
            text = squash(tok.decode([int(i) for i in row if i != 0]))
            assert len(text) > 10 and any(w.startswith(text) for w in written), text
            decoded += 1
    assert decoded == 16


def test_same_seed_same_batches_other_rank_other_batches(small: Path) -> None:
    a = list(_load(small, world=2, rank=0))
    b = list(_load(small, world=2, rank=0))
    c = list(_load(small, world=2, rank=1))
    assert all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
    assert not all(torch.equal(x["image"], y["image"]) for x, y in zip(a, c))


def test_explicit_node_and_worker_split() -> None:
    shards = list(range(11))
    seen: list[int] = []
    for rank in range(2):
        for worker in range(3):
            own = assign_shards(shards, Reader(rank, 2, worker, 3), resample=True)  # type: ignore[arg-type]
            assert own, "every reader must get at least one shard"
            seen += own
    assert sorted(seen) == shards  # disjoint, and together everything


def test_fewer_shards_than_readers(tmp_path: Path) -> None:
    one = _make(tmp_path / "one", 6, 6)
    # resampling: every reader draws from the single shard, both ranks get their steps
    for rank in (0, 1):
        assert len(list(_load(one, rank=rank, world=2, workers=2, steps=2))) == 2
    with pytest.raises(DataError, match=r"1 shard\(s\) cannot give each of world 2 x 2 worker\(s\) = 4 readers"):
        _load(one, rank=1, world=2, workers=2, resample=False)


def test_checksum_mismatch_names_the_shard(tmp_path: Path) -> None:
    d = _make(tmp_path / "s", 8, 4)
    target = read_manifest(d).shards[1].path
    data = bytearray(target.read_bytes())
    data[700] ^= 0xFF  # same size, different bytes
    target.write_bytes(bytes(data))
    for workers in (0, 1):
        with pytest.raises(DataError) as e:
            list(_load(d, steps=4, local_batch=4, workers=workers))
        msg = str(e.value)
        assert target.name in msg and "sha256" in msg and "\n" not in msg, msg
    target.write_bytes(bytes(data[:-512]))
    with pytest.raises(DataError, match=f"{target.name}: shard is .* bytes"):
        _load(d)  # size is checked up front, before any worker starts


def test_missing_manifest_and_shard(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="manifest does not exist"):
        _load(tmp_path / "nope")
    d = _make(tmp_path / "s", 4, 2)
    read_manifest(d).shards[0].path.unlink()
    with pytest.raises(DataError, match="000000.tar: shard listed in .* does not exist"):
        _load(d)


def test_vocabulary_must_fit_the_model(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    words = list(SPECIAL_TOKENS) + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [f"##{chr(c)}" for c in range(ord("a"), ord("z") + 1)]
    words += [f"word{i}" for i in range(2000 - len(words))]
    vocab.write_text("\n".join(words) + "\n")
    d = _make(tmp_path / "s", 4, 4, "--vocab", str(vocab))
    assert read_manifest(d).info["tokenizer"]["vocab_size"] == 2000
    with pytest.raises(SpecError, match="2000 tokens but model flava-debug has a vocabulary of 1024"):
        _load(d)
    (batch,) = list(_load(d, flavor=get_flavor("flava-350m"), steps=1, local_batch=1))  # 30522 >= 2000
    assert batch["text"].shape == (1, 77)


def test_vocab_txt_needs_pad_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n")
    assert shard(["--out", str(tmp_path / "s"), "--samples", "2", "--image-size", "16", "--vocab", str(vocab), "--quiet"]) == 2
    assert "[PAD] has id 1" in capsys.readouterr().err


def test_trained_tokenizer_specials(small: Path) -> None:
    tok = load_tokenizer(small)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tok.get_vocab_size() <= FLAVA.vocab_size
    assert Tokenizer.from_file(str(small / "tokenizer.json")).get_vocab_size() == read_manifest(small).info["tokenizer"]["vocab_size"]


def test_vit_needs_labels_that_fit(tmp_path: Path, small: Path) -> None:
    with pytest.raises(SpecError, match="labels up to 9 but .* has 5 classes"):
        _load(small, flavor=dataclasses.replace(VIT, num_classes=5))
    # The same images and captions without labels: fine for FLAVA, an error for ViT.
    photos = tmp_path / "p"
    photos.mkdir()
    for j, x in enumerate(wds.WebDataset(str(read_manifest(small).shards[0].path), shardshuffle=False)):
        (photos / f"{j}.jpg").write_bytes(x["jpg"])
        (photos / f"{j}.txt").write_bytes(x["txt"])
    assert shard(["--images", str(photos), "--out", str(tmp_path / "u"), "--quiet"]) == 0
    assert len(list(_load(tmp_path / "u", steps=1))) == 1
    with pytest.raises(DataError, match="not every sample has a label"):
        _load(tmp_path / "u", flavor=VIT)


def test_bad_arguments(small: Path) -> None:
    with pytest.raises(SpecError, match="steps must be >= 1"):
        _load(small, steps=0)  # with_epoch(0) would mean "forever"
    with pytest.raises(SpecError, match="rank 2 is outside world 2"):
        _load(small, rank=2, world=2)


RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys, datetime
    import torch, torch.distributed as dist
    from scaleladder.data.loader import make_loader
    from scaleladder.models.flavors import get_flavor
    rank, world, port, manifest, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    steps = 0
    labels = []
    for batch in make_loader(manifest, get_flavor("vit-debug"), local_batch=4, rank=rank, world=world,
                             steps=7, workers=2, seed=0, pin_memory=True):
        t = torch.ones(1)
        dist.all_reduce(t)  # a DDP step: would hang (then time out) if the other rank had stopped
        assert t.item() == world
        steps += 1
        labels += batch["label"].tolist()
    counts = torch.tensor([steps])
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, counts)
    json.dump({"steps": steps, "all": [int(g) for g in gathered], "labels": labels}, open(out, "w"))
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_ranks_take_the_same_number_of_steps(small: Path, tmp_path: Path) -> None:
    # 5 unequal shards over 2 ranks x 2 workers: rank 0 owns 3 shards (36 samples),
    # rank 1 owns 2 (32); 7 steps x 4 = 28 samples each, with every worker's stream
    # wrapping around. Both ranks must do exactly 7 collective steps.
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = _free_port()
    procs = [
        subprocess.Popen([sys.executable, str(script), str(r), "2", str(port), str(small), str(tmp_path / f"r{r}.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=90)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert [r["steps"] for r in results] == [7, 7]
    assert results[0]["all"] == results[1]["all"] == [7, 7]
    assert all(len(r["labels"]) == 28 for r in results)
