"""The WebDataset loader: exact step counts, shard splitting, checksums, model fit, 2-rank gloo."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image
from tokenizers import Tokenizer

from scaleladder.data import synthetic
from scaleladder.data.data_errors import DataError
from scaleladder.data.loader import assign_shards, make_loader
from scaleladder.data.manifest import read_manifest, sha256_file
from scaleladder.data.readers import Reader
from scaleladder.data.shard_command import main as shard
from scaleladder.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
from scaleladder.data.transforms import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD
from scaleladder.flavors import get_flavor
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


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_exact_step_count_beyond_one_pass(small: Path, workers: int) -> None:
    # 12 steps x 8 = 96 samples > 68 in the set: streams wrap around; still exactly 12.
    loader = _load(small, local_batch=8, steps=12, workers=workers)
    batches = list(loader)
    assert len(loader) == 12 and len(batches) == 12
    assert all(b["text"].shape == (8, FLAVA.text_len) for b in batches)
    assert list(_load(small, local_batch=8, steps=12, workers=workers)) != []  # iterable again


def _written(d: Path) -> dict[str, dict]:
    """What the shards hold, by key."""
    return {x["__key__"]: x for s in read_manifest(d).shards for x in wds.WebDataset(str(s.path), shardshuffle=False)}


def _pixels(image: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """A normalised CHW tensor back to HWC in [0, 1]."""
    return image.numpy().transpose(1, 2, 0) * np.asarray(std) + np.asarray(mean)


def _source_pixels(key: str, size: int) -> np.ndarray:
    """The image `_make` generated for ``key`` (seed 0, 32 px), at ``size``, HWC in [0, 1]."""
    img = Image.open(io.BytesIO(synthetic.make_sample(0, int(key), 32).jpeg)).convert("RGB")
    return np.asarray(img.resize((size, size), Image.Resampling.BICUBIC), np.float32) / 255


def test_vit_round_trip_by_key(small: Path) -> None:
    written = _written(small)
    S = VIT.image_size
    seen = set()
    for batch in _load(small, flavor=VIT, local_batch=8, steps=4, augment=False, keys=True):
        assert set(batch) == {"image", "label", "__key__"} and batch["image"].shape == (8, 3, S, S)
        for key, label, image in zip(batch["__key__"], batch["label"], batch["image"]):
            assert int(label) == int(written[key]["cls"]) == synthetic.make_sample(0, int(key), 32).label
            got = _pixels(image, IMAGENET_MEAN, IMAGENET_STD)
            assert np.abs(got - _source_pixels(key, S)).mean() < 0.01, key  # the same picture, unflipped, uncropped
            other = f"{(int(key) + 1) % len(written):09d}"
            assert np.abs(got - _source_pixels(other, S)).mean() > 0.05  # (which another sample's is not)
            seen.add(key)
    assert len(seen) >= 16


def test_flava_round_trip_by_key(small: Path) -> None:
    written = _written(small)
    tok = load_tokenizer(read_manifest(small).tokenizer_path)
    S = FLAVA.image_size
    for batch in _load(small, local_batch=8, steps=2, augment=False, keys=True):
        assert batch["itm_labels"].tolist() == [1] * 8  # no negatives swapped in
        assert batch["image_for_codebook"].shape == (8, 3, S // 2, S // 2)
        for key, text, image in zip(batch["__key__"], batch["text"], batch["image"]):
            caption = written[key]["txt"].decode()
            assert caption == synthetic.make_sample(0, int(key), 32).caption
            full = tok.encode(caption).ids  # [CLS] ... [SEP]; truncation keeps the [SEP]
            expected = full if len(full) <= FLAVA.text_len else full[:FLAVA.text_len - 1] + full[-1:]
            assert [int(i) for i in text if i != 0] == expected, key
            assert np.abs(_pixels(image, CLIP_MEAN, CLIP_STD) - _source_pixels(key, S)).mean() < 0.01, key


def test_flava_text_round_trip(small: Path) -> None:
    # What the loader feeds decodes back to (a prefix, after truncation to text_len, of)
    # a caption that was written. Compared without spaces/punctuation: WordPiece decoding
    # re-spaces commas.
    def squash(s: str) -> str:
        return re.sub(r"\W+", "", s.lower())

    tok = load_tokenizer(read_manifest(small).tokenizer_path)
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


@pytest.mark.process
def test_fewer_shards_than_readers(tmp_path: Path) -> None:
    one = _make(tmp_path / "one", 6, 6)
    # resampling: every reader draws from the single shard, both ranks get their steps
    for rank in (0, 1):
        assert len(list(_load(one, rank=rank, world=2, workers=2, steps=2))) == 2
    with pytest.raises(DataError, match=r"1 shard\(s\) cannot give each of world 2 x 2 worker\(s\) = 4 readers"):
        _load(one, rank=1, world=2, workers=2, resample=False)


def _corrupt(path: Path, at: int = 700) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF  # same size, different bytes: only the sha256 can tell
    path.write_bytes(bytes(data))


def test_corrupt_shard_fails_before_the_first_batch(tmp_path: Path) -> None:
    d = _make(tmp_path / "s", 8, 2)
    entry = read_manifest(d).shards[3]
    _corrupt(entry.path)
    actual = sha256_file(entry.path)
    # make_loader itself raises: no batch is drawn, no worker started. Without a process
    # group to share verdicts over, a rank hashes every shard, so rank 0 finds shard 3 too.
    for kw in ({}, {"workers": 2}, {"world": 2, "rank": 0}, {"world": 2, "rank": 1}):
        with pytest.raises(DataError) as e:
            _load(d, **kw)
        msg = str(e.value)
        assert msg.startswith(f"{entry.path}: sha256 is {actual}, but manifest.json expects {entry.sha256}"), msg
        assert "\n" not in msg
    assert len(list(_load(d, verify=False, steps=1))) == 1  # verify=False: sizes only
    entry.path.write_bytes(entry.path.read_bytes()[:-512])
    with pytest.raises(DataError, match=f"{entry.path.name}: shard is .* bytes"):
        _load(d, verify=False)  # the size is checked even then


def test_missing_manifest_and_shard(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="manifest does not exist"):
        _load(tmp_path / "nope")
    d = _make(tmp_path / "s", 4, 2)
    read_manifest(d).shards[0].path.unlink()
    with pytest.raises(DataError, match="000000.tar: shard listed in .* does not exist"):
        _load(d)


def test_vocabulary_must_fit_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
    vocab.write_text("\n".join(words[:FLAVA.vocab_size]) + "\n")
    _make(tmp_path / "exact", 4, 4, "--vocab", str(vocab))
    capsys.readouterr()
    assert _load(tmp_path / "exact").record_attrs() == {"tokenizer_vocab_size": FLAVA.vocab_size, "decode_path": "cpu", "loader_workers": 0,
                                                         "loader_transport": "float32"}
    assert capsys.readouterr().err == ""  # equal sizes: nothing to say


def test_smaller_tokenizer_is_allowed_and_said(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    size = read_manifest(small).tokenizer_vocab_size
    assert size is not None and size < FLAVA.vocab_size
    loader = _load(small, steps=1)
    err = capsys.readouterr().err
    assert err == (f"scaleladder: note: tokenizer {small / 'tokenizer.json'} has {size} tokens, model flava-debug keeps "
                   f"its published vocabulary of 1024 (so FLOPs and memory match the seeds): {1024 - size} embedding rows "
                   "go unused\n"), err
    assert loader.record_attrs()["tokenizer_vocab_size"] == size
    _load(small, steps=1, world=2, rank=1)
    assert capsys.readouterr().err == ""  # said once, by rank 0
    assert "tokenizer_vocab_size" not in _load(small, flavor=VIT, steps=1).record_attrs()  # ViT reads no text
    assert capsys.readouterr().err == ""


def test_vocab_txt_needs_pad_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n")
    assert shard(["--out", str(tmp_path / "s"), "--samples", "2", "--image-size", "16", "--vocab", str(vocab), "--quiet"]) == 2
    assert "[PAD] has id 1" in capsys.readouterr().err


def test_trained_tokenizer_specials(small: Path) -> None:
    tok = load_tokenizer(read_manifest(small).tokenizer_path)
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
    from scaleladder.flavors import get_flavor
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    manifest, out, steps = sys.argv[4], sys.argv[5].format(rank=rank), int(sys.argv[6])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    done = 0
    labels, keys = [], []
    for batch in make_loader(manifest, get_flavor("vit-debug"), local_batch=4, rank=rank, world=world,
                             steps=steps, workers=2, seed=0, pin_memory=True, keys=True):
        t = torch.ones(1)
        dist.all_reduce(t)  # a DDP step: would hang (then time out) if the other rank had stopped
        assert t.item() == world
        done += 1
        labels += batch["label"].tolist()
        keys.append(batch["__key__"])
    counts = torch.tensor([done])
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, counts)
    json.dump({"steps": done, "all": [int(g) for g in gathered], "labels": labels, "keys": keys}, open(out, "w"))
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(script: str, tmp_path: Path, *args: str, world: int = 2, timeout: float = 90) -> list[tuple[int, str]]:
    """Run ``script`` as ranks 0..world-1 (argv: rank world port *args); (return code, output) per rank."""
    path = tmp_path / "rank.py"
    path.write_text(script)
    port = str(_free_port())
    procs = [
        subprocess.Popen([sys.executable, str(path), str(r), str(world), port, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    try:
        return [(p.wait(timeout=timeout), p.communicate()[0]) for p in procs]
    finally:
        for p in procs:  # a hung rank fails the test instead of outliving it
            if p.poll() is None:
                p.kill()
                p.communicate()


GLOO_STEPS, GLOO_BATCH, GLOO_WORKERS = 12, 4, 2  # as RANK_SCRIPT loads


@pytest.mark.process
@pytest.mark.slow
def test_two_gloo_ranks_take_the_same_number_of_steps(small: Path, tmp_path: Path) -> None:
    # 5 unequal shards (16, 16, 16, 16, 4) over 2 ranks x 2 workers: rank 0 owns 36 samples,
    # rank 1 owns 32; the readers 20, 16 | 16, 16. The loader takes batches from its workers
    # in turn, so each worker makes 12 / 2 = 6 batches of 4 = 24 samples: more than one pass
    # over any reader's shards, so every stream must go on past its end. Check that
    # arithmetic, so that a change to the fixture cannot quietly make the test toothless.
    #
    # What a stream that ends would do: webdataset's with_epoch RESTARTS an exhausted
    # loader, so the step counts would still match (no hang), but the restart spawns new
    # workers mid-run and, every generator seeded afresh, replays the same batches: rank 1
    # would repeat its first 4 batches as steps 9-12. Hence the no-replay check below.
    shards = read_manifest(small).shards
    for rank in range(2):
        for worker in range(GLOO_WORKERS):
            own = assign_shards(shards, Reader(rank, 2, worker, GLOO_WORKERS), resample=True)
            assert GLOO_STEPS // GLOO_WORKERS > sum(s.nsamples for s in own) // GLOO_BATCH, (rank, worker)
    outs = _run_ranks(RANK_SCRIPT, tmp_path, str(small), str(tmp_path / "r{rank}.json"), str(GLOO_STEPS))
    for rc, out in outs:
        assert rc == 0, out
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert [r["steps"] for r in results] == [GLOO_STEPS, GLOO_STEPS]
    assert results[0]["all"] == results[1]["all"] == [GLOO_STEPS, GLOO_STEPS]
    assert all(len(r["labels"]) == GLOO_STEPS * GLOO_BATCH for r in results)
    for r in results:
        batches = [tuple(k) for k in r["keys"]]
        assert len(set(batches)) == len(batches), f"a batch was replayed: the loader restarted ({batches})"


PREFLIGHT_SCRIPT = textwrap.dedent(
    """
    import json, sys, datetime
    import torch.distributed as dist
    from scaleladder.data import manifest as mf
    from scaleladder.data.data_errors import speaker
    from scaleladder.data.loader import make_loader
    from scaleladder.flavors import get_flavor
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    manifest, out = sys.argv[4], sys.argv[5].format(rank=rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=20))
    hashed, real = [], mf.sha256_file
    def spy(path, *args):
        hashed.append(path.name)
        return real(path, *args)
    mf.sha256_file = spy  # what verify_shard calls
    try:
        make_loader(manifest, get_flavor("vit-debug"), local_batch=2, rank=rank, world=world, steps=1, workers=0,
                    seed=0, pin_memory=False)
        error, speaks = None, None
    except Exception as e:
        error, speaks = f"{type(e).__name__}: {e}", speaker(e)
    json.dump({"hashed": hashed, "error": error, "speaker": speaks}, open(out, "w"))
    dist.destroy_process_group()
    """
)


@pytest.mark.process
@pytest.mark.slow
def test_gloo_ranks_split_the_checksums_and_share_the_verdict(tmp_path: Path) -> None:
    d = _make(tmp_path / "s", 10, 2)
    names = [s.path.name for s in read_manifest(d).shards]

    def ranks() -> list[dict]:
        for rc, out in _run_ranks(PREFLIGHT_SCRIPT, tmp_path, str(d), str(tmp_path / "p{rank}.json"), timeout=60):
            assert rc == 0, out
        return [json.loads((tmp_path / f"p{r}.json").read_text()) for r in range(2)]

    ok = ranks()
    assert [r["hashed"] for r in ok] == [names[0::2], names[1::2]]  # every shard once, half each
    assert [r["error"] for r in ok] == [None, None]
    # A corrupt shard in rank 1's half: both ranks fail before the first batch, rank 0 with
    # rank 1's finding (without sharing it, rank 0 would train on and wait for rank 1 forever).
    target = read_manifest(d).shards[3].path
    _corrupt(target)
    bad = ranks()
    assert bad[1]["error"].startswith(f"DataError: {target}: sha256 is {sha256_file(target)}"), bad
    assert bad[0]["error"] == bad[1]["error"] + " (found by rank 1)", bad
    # ... but only rank 1 prints it (rung.run.main reads the mark); rank 0 exits 2 silently
    assert [r["speaker"] for r in bad] == [False, True], bad
    # Each rank finds its own corrupt shard: each prints its own.
    other = read_manifest(d).shards[2].path
    _corrupt(other)
    both = ranks()
    assert both[0]["error"].startswith(f"DataError: {other}: sha256 is") and "found by" not in both[0]["error"], both
    assert both[1]["error"] == bad[1]["error"] and [r["speaker"] for r in both] == [True, True], both
    # The same fault on every rank (a missing shard: every rank checks every size) is printed once, by rank 0.
    read_manifest(d).shards[0].path.unlink()
    gone = ranks()
    assert gone[0]["error"] == gone[1]["error"] and "found by" not in gone[0]["error"], gone
    assert [r["speaker"] for r in gone] == [True, False], gone


# -- uint8 across the boundary, the rank's cores -----------------------------------------


@pytest.mark.parametrize("flavor", [FLAVA, VIT], ids=["flava", "vit"])
def test_uint8_normalised_on_the_device_is_the_workers_float32_batch(small: Path, flavor) -> None:
    """The same numbers come out: the device-side transform of a uint8 batch equals the
    worker-side float32 batch (the same float32 arithmetic: bit for bit), and a quarter of
    the image bytes cross from the workers."""
    from scaleladder.data.devnorm import DeviceNormaliser

    f32 = _load(small, flavor, local_batch=8, steps=2, seed=3)
    u8 = _load(small, flavor, local_batch=8, steps=2, seed=3, transport="uint8")
    assert (f32.transport, u8.transport) == ("float32", "uint8") and f32.device_transform(torch.device("cpu")) is None
    norm = u8.device_transform(torch.device("cpu"))
    assert isinstance(norm, DeviceNormaliser) and u8.record_attrs()["loader_transport"] == "uint8"
    images = ("image", "image_for_codebook") if flavor.family == "flava" else ("image",)
    for a, raw in zip(f32, u8):
        assert all(raw[k].dtype == torch.uint8 for k in images)
        sent = {k: sum(v.nbytes for v in b.values()) for k, b in (("f32", a), ("u8", raw))}
        image_bytes = {k: sum(b[i].nbytes for i in images) for k, b in (("f32", a), ("u8", raw))}
        assert image_bytes["f32"] == 4 * image_bytes["u8"]
        if flavor.family == "vit":  # the batch is its image: the bytes crossing fall about 4x
            assert sent["f32"] / sent["u8"] > 3.9
        b = norm(raw)
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_the_rank_keeps_its_cores_and_auto_picks_the_rest() -> None:
    from scaleladder.data import cores

    # Slurm bound this task to 8 cores: one stays the rank's, the workers get 7
    p = cores.plan_cores(0, 8, affinity=set(range(16, 24)), env={"SLURM_CPUS_PER_TASK": "8"})
    assert p.cores == tuple(range(16, 24)) and p.rank_cores == (16,) and p.worker_cores == tuple(range(17, 24)) and p.bound
    # torchrun's 4 ranks inherit one set of 16 (no binding): a slice of 4 each, by local rank
    p = cores.plan_cores(2, 4, affinity=set(range(16)), env={})
    assert p.cores == (8, 9, 10, 11) and p.rank_cores == (8,) and p.shared == 4 and not p.bound
    assert "4 core(s) per rank (sched_getaffinity, 1/4 of the set" in p.describe()
    assert cores.plan_cores(0, 1, affinity={5}, env={}).worker_cores == (5,)  # one core: nothing to keep apart
    need = -(-cores.DEMAND_SAMPLES_PER_S // cores.PER_WORKER_SAMPLES_PER_S["cpu"])
    assert cores.auto_workers(8) == min(7, need) and cores.auto_workers(1) == 0 and cores.auto_workers(64) == need
    assert cores.auto_workers(64, "gpu") < cores.auto_workers(64, "cpu")  # gpu decode: the workers only parse tars


@pytest.mark.parametrize("profile", ["a100", "frontier"])
def test_slurm_profiles_cpus_per_task_match_what_auto_picks(profile: str) -> None:
    """The doctor's `threads` check asks ranks x (OMP threads + workers) <= the cores a rung job
    asks for; the profiles give each rank exactly what `--workers auto` would use."""
    import yaml

    from scaleladder.data.cores import auto_workers

    root = Path(__file__).resolve().parents[1] / "profiles" / profile
    site = yaml.safe_load((root / "site.yaml").read_text())
    slurm = yaml.safe_load((root / "config.v8+.yaml").read_text())
    per_rank = int(slurm["set-resources"]["rung"]["cpus_per_task"])
    omp = int(site["site"]["env"]["OMP_NUM_THREADS"])
    assert omp + int(site["loader"]["workers"]) == per_rank
    assert int(site["loader"]["workers"]) == auto_workers(per_rank - (omp - 1), site["loader"]["decode"])
