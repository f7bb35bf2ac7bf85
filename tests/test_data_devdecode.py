"""The loader's GPU decode path, tested where a CPU can test it.

The same code path as on a GPU, except that ``decode_jpeg`` and the resampling run on
the CPU: the workers pass encoded JPEGs and crop boxes, :class:`DeviceDecoder` makes the
images. Compared with the CPU-worker path (the reference) batch by batch.

The tolerance, justified: the decoders agree bit for bit (libjpeg-turbo in Pillow and in
torchvision on the CPU; checked below), the random draws are the same (everything but
the images must be equal, exactly), and the resampling uses Pillow's filters and
weights in float32 where Pillow uses 22-bit fixed point, rounding to 8 bits after each
pass as Pillow does. A float sum that lands within ~1e-6 of a .5 tie can round the
other way: one 8-bit level, at a small fraction of the pixels. So: every image element
within one 8-bit level (1/255 divided by the normalisation's std), and fewer than 1% of
them off at all. (Measured: 0 or 1 level, at about 0.004% of the pixels.) nvJPEG's IDCT
may differ from libjpeg-turbo's by a level too; that is for the GPU check to measure.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from scaleladder.data import synthetic
from scaleladder.data.devdecode import resample
from scaleladder.data.loader import make_loader
from scaleladder.data.shard_command import main as shard
from scaleladder.data.transforms import CLIP_STD, IMAGENET_STD, random_crop_box
from scaleladder.flavors import get_flavor
from scaleladder.spec import SpecError


def test_torchvision_cpu_decode_is_pillows() -> None:
    from torchvision.io import ImageReadMode, decode_jpeg

    for i in range(8):
        jpeg = synthetic.make_sample(3, i, 40 + 8 * i).jpeg
        ours = decode_jpeg(torch.frombuffer(bytearray(jpeg), dtype=torch.uint8), mode=ImageReadMode.RGB)
        assert np.array_equal(ours.permute(1, 2, 0).numpy(), np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))


def test_resample_is_pillows_resize_on_loader_crops() -> None:
    rng = np.random.default_rng(0)
    diffs = []
    for i in range(24):
        img = Image.open(io.BytesIO(synthetic.make_sample(0, i, 64).jpeg)).convert("RGB")
        chw = torch.from_numpy(np.array(img)).permute(2, 0, 1).float()
        box = random_crop_box(rng, 64, 64)
        for size, kind, pil in ((64, "bicubic", Image.Resampling.BICUBIC), (32, "lanczos", Image.Resampling.LANCZOS),
                                (48, "bicubic", Image.Resampling.BICUBIC)):
            ref = np.asarray(img.resize((size, size), pil, box=box)).astype(int)
            got = resample(chw, box, size, kind).permute(1, 2, 0).numpy().astype(int)
            diffs.append(np.abs(ref - got).ravel())
    d = np.concatenate(diffs)
    assert d.max() <= 1 and (d > 0).mean() < 0.01


def test_the_vectorised_weights_are_pillows_per_pixel_loop() -> None:
    from scaleladder.data.devdecode import FILTERS, pil_weights

    def reference(in_size: int, lo: float, hi: float, out_size: int, kind: str) -> np.ndarray:
        fn, support = FILTERS[kind]  # precompute_coeffs in Resample.c, one output pixel at a time
        scale = (hi - lo) / out_size
        filterscale = max(scale, 1.0)
        support *= filterscale
        w = np.zeros((out_size, in_size))
        for xx in range(out_size):
            center = lo + (xx + 0.5) * scale
            xmin, xmax = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), in_size)
            k = np.array([fn((x - center + 0.5) / filterscale) for x in range(xmin, xmax)])
            w[xx, xmin:xmax] = k / k.sum() if k.sum() != 0 else k
        return w

    for args in [(900, 12.0, 871.0, 224, "bicubic"), (640, 0.0, 640.0, 112, "lanczos"), (64, 3.0, 60.0, 64, "bicubic"),
                 (48, 0.0, 48.0, 48, "lanczos"), (30, 2.0, 29.0, 64, "bicubic"), (331, 7.0, 300.0, 112, "lanczos")]:
        assert np.allclose(pil_weights(*args), reference(*args).astype(np.float32), rtol=0, atol=1e-7), args


def test_a_batch_is_decoded_and_resampled_in_a_handful_of_ops() -> None:
    """A per-image loop would issue ~20 ops per image (650-730 for a batch of 32). Now
    the device ops do not grow with the batch (decode_jpeg is one call on a GPU; on the CPU
    torchvision loops over the images itself, so it is left out of the count), and the batched
    resample with flips is Pillow's resize + flip of each image."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from scaleladder.data.devdecode import DeviceDecoder

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    jpegs = [synthetic.make_sample(2, i, 40 + 3 * i) for i in range(32)]  # every size different
    rng = np.random.default_rng(1)

    def batch(n: int, flips: bool) -> tuple[dict, list]:
        sizes = [Image.open(io.BytesIO(s.jpeg)).size for s in jpegs[:n]]
        boxes = [tuple(int(v) for v in random_crop_box(rng, w, h)) for w, h in sizes]
        lengths = [len(s.jpeg) for s in jpegs[:n]]
        return {"jpeg": torch.frombuffer(bytearray(b"".join(s.jpeg for s in jpegs[:n])), dtype=torch.uint8),
                "jpeg_offsets": torch.tensor([0, *np.cumsum(lengths)]), "box": torch.tensor(boxes),
                "flip": torch.tensor([flips and i % 2 == 0 for i in range(n)]), "label": torch.zeros(n, dtype=torch.int64)}, boxes

    counts = {}
    for family in ("vit", "flava"):
        for n in (8, 32):
            dec = DeviceDecoder({"vit": "image", "flava": "masked-image-text"}[family], 24, 12, torch.device("cpu"))
            b, boxes = batch(n, flips=family == "vit")  # FLAVA's crops are never flipped (transforms.py)
            with Count() as c:
                out = dec(b)
            counts[family, n] = len([op for op in c.ops if not op.startswith(("image.decode_jpeg", "torchvision."))])
        level = 1 / 255 / min(IMAGENET_STD if family == "vit" else CLIP_STD) + 1e-5
        for i, (s, box) in enumerate(zip(jpegs[:n], boxes)):
            ref = Image.open(io.BytesIO(s.jpeg)).convert("RGB").resize((24, 24), Image.Resampling.BICUBIC, box=box)
            if family == "vit" and i % 2 == 0:
                ref = ref.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            from scaleladder.data.transforms import CLIP_MEAN, IMAGENET_MEAN, to_tensor

            mean, std = (IMAGENET_MEAN, IMAGENET_STD) if family == "vit" else (CLIP_MEAN, CLIP_STD)
            diff = (to_tensor(ref, mean, std) - out["image"][i]).abs()
            assert diff.max() <= level and (diff > 1e-5).float().mean() < 0.01
    assert counts["vit", 8] == counts["vit", 32] <= 40 and counts["flava", 8] == counts["flava", 32] <= 70, counts


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Synthetic shards at 64 px (flava-debug's side) and 48 px (vit-debug's 32 px, resized
    without JPEG draft scaling, which only the CPU path does: see devdecode's docstring)."""
    out = {}
    for px in (64, 48):
        d = tmp_path_factory.mktemp(f"s{px}")
        assert shard(["--out", str(d), "--samples", "48", "--per-shard", "16", "--image-size", str(px), "--quiet"]) == 0
        out[px] = d
    return out


@pytest.mark.parametrize("flavor_name,px", [("flava-debug", 64), ("vit-debug", 48)])
def test_gpu_path_decoding_on_the_cpu_gives_the_cpu_paths_batches(shards: dict[int, Path], flavor_name: str, px: int,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    flavor = get_flavor(flavor_name)
    common = dict(local_batch=8, rank=0, world=1, steps=3, workers=0, seed=5, pin_memory=False)
    cpu = make_loader(shards[px], flavor, **common)  # type: ignore[arg-type]
    dev = make_loader(shards[px], flavor, **common, decode="gpu", decode_device=torch.device("cpu"))  # type: ignore[arg-type]
    assert cpu.decoder is None and dev.decoder is not None and dev.decode_path == "gpu (cpu decode)"
    std = min(CLIP_STD if flavor.family == "flava" else IMAGENET_STD)
    level = 1 / 255 / std + 1e-5  # one 8-bit level after normalisation (the codebook image's is smaller)
    n = 0
    for a, raw in zip(cpu, dev):
        assert "jpeg" in raw and "image" not in raw  # the workers did not decode
        b = dev.decoder(dict(raw))  # type: ignore[misc]
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            if k.startswith("image") and a[k].is_floating_point():
                diff = (a[k] - b[k]).abs()
                assert diff.max() <= level and (diff > 1e-5).float().mean() < 0.01, (k, diff.max())
            else:
                assert torch.equal(a[k], b[k]), k  # masks, text, labels: the same draws, exactly
        n += 1
    assert n == 3
    capsys.readouterr()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_gpu_decode_is_refused_without_a_gpu(shards: dict[int, Path]) -> None:
    with pytest.raises(SpecError) as e:
        make_loader(shards[64], get_flavor("flava-debug"), 8, 0, 1, 2, 0, 0, False, decode="gpu")
    assert "--decode gpu needs a GPU" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SpecError, match="expected one of cpu, gpu"):
        make_loader(shards[64], get_flavor("flava-debug"), 8, 0, 1, 2, 0, 0, False, decode="nvjpeg")


def test_the_report_names_input_bound_rungs() -> None:
    from scaleladder.figures.report import render_html, render_markdown

    base = {"model": "vit-debug", "strategy": "ddp", "precision": "fp32", "knobs": "pre-lag", "nodes": 1, "batch": 4,
            "status": "ok", "items_per_s": 100.0, "world_size": 1, "decode_path": "cpu", "loader_workers": 2}
    fed = {**base, "spec": "vit-debug/ddp/fp32/pre-lag/n1/b4", "input_bound": False, "loader_wait_fraction": 0.001}
    starved = {**base, "spec": "vit-debug/ddp/fp32/pre-lag/n1/b8", "batch": 8, "input_bound": np.bool_(True),
               "loader_wait_fraction": 0.25, "loader_samples_per_s": 410.0}
    md = render_markdown([fed, starved], {}, "plots", figures=[])
    assert "## Input-bound rungs" in md
    assert ("- vit-debug/ddp/fp32/pre-lag/n1/b8: waited 25.0% of its step time for batches"
            " (decode cpu, 2 worker(s) per rank, loader 410 samples/s per rank)") in md
    assert "n1/b4: waited" not in md and "Input-bound rungs" in render_html([fed, starved], {}, "plots", figures=[])
    assert "Input-bound" not in render_markdown([fed], {}, "plots", figures=[])


@pytest.mark.process
def test_a_rung_on_shards_records_its_input_pipeline(shards: dict[int, Path], tmp_path: Path) -> None:
    """The real `scaleladder run` (one CPU rank): the record says which decode path ran, what
    crossed from the workers (uint8), the loader's own rate, its host cost and whether the steps
    waited for it, and what --workers auto chose (said in one line: no Slurm CPU count here);
    --decode gpu is refused here."""
    import subprocess
    import sys

    import h5py

    out = tmp_path / "r.h5"
    run = [sys.executable, "-m", "scaleladder", "run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "4",
           "--warmup", "1", "--data", str(shards[48]), "--workers", "auto"]
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CPUS_PER_TASK"}
    p = subprocess.run([*run, "--out", str(out)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    cores = len(os.sched_getaffinity(0))
    note = [line for line in p.stderr.splitlines() if "--workers auto: SLURM_CPUS_PER_TASK is not set; assumed" in line]
    assert len(note) == 1 and f"{cores} core(s) per rank (sched_getaffinity)" in note[0]
    with h5py.File(out) as f:
        a = f.attrs
        assert a["decode_path"] == "cpu" and a["loader_samples_per_s"] > 0 and a["loader_transport"] == "uint8"
        from scaleladder.data.cores import auto_workers

        assert a["loader_workers"] == auto_workers(cores) and a["loader_cpu_s_per_batch"] > 0
        assert a["loader_worker_cores"] == (cores - 1 if cores > 1 else 0) and "--workers auto:" in a["loader_workers_auto"]
        assert 0 <= a["loader_wait_fraction"] and bool(a["input_bound"]) == (a["loader_wait_fraction"] > 0.03)
    if not torch.cuda.is_available():
        p = subprocess.run([*run, "--decode", "gpu", "--out", str(tmp_path / "g.h5")], capture_output=True, text=True)
        assert p.returncode == 2 and "--decode gpu needs a GPU" in p.stderr and not (tmp_path / "g.h5").exists()


# -- what actually decoded, a missing device decoder, and the stream order ------------------


def _jpegs(n: int) -> list[torch.Tensor]:
    return [torch.frombuffer(bytearray(synthetic.make_sample(1, i, 16).jpeg), dtype=torch.uint8) for i in range(n)]


class _FakeDecodeStream:
    """Stands in for devdecode._DecodeStream on a machine without CUDA: logs what it is asked."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def run(self, decode):  # type: ignore[no-untyped-def]
        self.log.append("on the decode stream")
        images = decode()
        self.log.append(f"handed over {len(images)}")
        return images


def test_the_device_decode_runs_on_its_own_stream_without_a_host_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # torchvision allocates decode_jpeg's output on the current stream but writes it on its own
    # (devdecode._DecodeStream): the decode runs with a stream of its own current, its images
    # handed to the consumer device-side; no host synchronisation per batch.
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as host_decode

    from scaleladder.data import devdecode
    from scaleladder.data.devdecode import DeviceDecoder

    log: list[str] = []
    monkeypatch.setattr(devdecode, "_DecodeStream", lambda device: _FakeDecodeStream(log))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("host wait"))

    def fake_decode(data, mode, device=None):  # type: ignore[no-untyped-def]
        log.append(f"decode on {device}")
        return [host_decode(d, mode=mode) for d in data]

    dec = DeviceDecoder("image", 16, 16, torch.device("cuda", 0))
    images = dec._decode_images(_jpegs(3), fake_decode, ImageReadMode.RGB)
    assert log == ["on the decode stream", "decode on cuda:0", "handed over 3"] and len(images) == 3
    assert dec.record_attrs() == {"decode_images": 3, "decode_cpu_fallbacks": 0, "decode_cpu_fallback_fraction": 0.0}
    import inspect

    assert ".synchronize()" not in inspect.getsource(devdecode)  # no host wait anywhere on the path


def test_host_fallbacks_are_counted_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A device decoder that refuses every image (a torchvision without nvJPEG): each is decoded on
    # the host, and the record says so instead of "gpu".
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as host_decode

    from scaleladder.data import devdecode
    from scaleladder.data.devdecode import DeviceDecoder
    from scaleladder.rung.feed import DeviceFeed

    monkeypatch.setattr(devdecode, "_DecodeStream", lambda device: _FakeDecodeStream([]))

    def refuses(data, mode, device=None):  # type: ignore[no-untyped-def]
        if device is not None:
            raise RuntimeError("torchvision.io.decode_jpeg: not compiled with nvJPEG")
        return host_decode(data, mode=mode)

    dec = DeviceDecoder("image", 16, 16, torch.device("cuda", 0))
    assert len(dec._decode_images(_jpegs(4), refuses, ImageReadMode.RGB)) == 4
    feed = DeviceFeed([], torch.device("cpu"), torch.float32, 2, decoder=dec)  # the feed puts it in the record
    a = feed.record_attrs(np.full(1, 0.1), 1)
    assert a["decode_images"] == 4 and a["decode_cpu_fallbacks"] == 4 and a["decode_cpu_fallback_fraction"] == 1.0
    assert a["decode_path"].startswith("host fallback")


def test_a_corrupt_jpeg_in_a_batch_is_named_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # The device refuses the damaged image (counted as a fallback); the host cannot decode it
    # either: one line naming its shard and key, and the rung stops, as the CPU path stops.
    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as host_decode

    from scaleladder.data import devdecode
    from scaleladder.data.data_errors import DataError
    from scaleladder.data.devdecode import DeviceDecoder

    monkeypatch.setattr(devdecode, "_DecodeStream", lambda device: _FakeDecodeStream([]))
    data = _jpegs(3)
    data[1] = data[1][: len(data[1]) // 3]  # cut short

    def device_decode(batch, mode, device=None):  # type: ignore[no-untyped-def]
        return host_decode(batch, mode=mode) if device is None else host_decode(batch, mode=mode, device="cpu")

    where = [f"/d/shard-000003.tar: key {k:06d}" for k in range(3)]
    dec = DeviceDecoder("image", 16, 16, torch.device("cuda", 0))
    with pytest.raises(DataError) as e:
        dec._decode_images(data, device_decode, ImageReadMode.RGB, where)
    assert str(e.value).startswith("/d/shard-000003.tar: key 000001: corrupt image (") and "\n" not in str(e.value)
    assert dec.cpu_fallbacks == 1 and dec.images == 3
    cpu = DeviceDecoder("image", 16, 16, torch.device("cpu"))  # the CPU-device decoder names it alike
    with pytest.raises(DataError, match="key 000001: corrupt image"):
        cpu._decode_images(data, device_decode, ImageReadMode.RGB, where)


def test_the_cpu_workers_name_a_corrupt_jpeg_on_both_transports() -> None:
    from scaleladder.data.data_errors import DataError
    from scaleladder.data.transforms import VitTransform

    jpeg = synthetic.make_sample(0, 0, 48).jpeg
    for transport in ("uint8", "float32"):
        t = VitTransform(get_flavor("vit-debug"), 0, 0, 1, transport=transport)
        with pytest.raises(DataError, match=r"^/d/s\.tar: key 000007: corrupt image"):
            t({"jpg": jpeg[:200], "cls": b"1", "__url__": "/d/s.tar", "__key__": "000007"})


def test_a_missing_device_decoder_fails_the_rung_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchvision.io

    from scaleladder.data.devdecode import check_decode

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def no_nvjpeg(data, mode=None, device=None):  # type: ignore[no-untyped-def]
        raise RuntimeError("Not compiled with GPU support\n(more lines of C++ context)")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", no_nvjpeg)
    with pytest.raises(SpecError) as e:
        check_decode("gpu", None)
    msg = str(e.value)
    assert "\n" not in msg and "cannot decode JPEG on cuda:0 (Not compiled with GPU support)" in msg and "--decode cpu" in msg
