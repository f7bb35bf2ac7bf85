"""JPEG decode and the image transforms, batched on the device (the loader's ``decode="gpu"`` path).

With ``decode="gpu"`` the DataLoader workers do not decode: per sample they parse the
tar member, read the JPEG's frame header for its size, draw the crop box (and flip)
from the same per-reader generators in the same order as the CPU path, and pass the
encoded bytes on (``jpeg`` + ``jpeg_offsets``: one flat uint8 tensor per batch, so one
shared-memory transfer). Everything else of the sample (mask, text, labels) is made in
the worker as before. :class:`DeviceDecoder`, called by the rung's feed on the device,
then decodes the whole batch with ``torchvision.io.decode_jpeg(list, device="cuda")``
(nvJPEG: NVIDIA only; ROCm's torchvision has no device decoder, so Frontier's profile
decodes on the CPU) and resamples, flips and normalises there, batched: no loop over
the images issues device work (a loop over them would issue ~20 ops per image on the rank's
own thread).

Same batches as the CPU path, up to rounding: the resampling reproduces Pillow's
(``Image.resize`` with a box: the same separable filters, bicubic a = -0.5 and Lanczos
a = 3, the same support and weights, horizontal then vertical, rounded to 8 bits after
each), in float32 instead of Pillow's 22-bit fixed point. So a pixel
may differ by one 8-bit level per pass where a sum lands within ~1e-6 of a .5 tie; the
decoders themselves (libjpeg-turbo in Pillow and in torchvision on the CPU) agree bit
for bit, and nvJPEG's IDCT may differ by one level (tests/test_data_devdecode.py).

One difference by design: for a source much larger than the model's input, the CPU path
decodes in JPEG draft mode (1/2, 1/4 or 1/8 scale, from the DCT), the device path at full
size. The crop box is drawn on the draft size (the same draws) and scaled up, so both
crop the same region; the device path's pixels are then a full-resolution resample of it.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import Tensor

from scaleladder.spec import SpecError

DECODE_PATHS = ("cpu", "gpu")  # "cpu": decode + transforms in the workers (the reference); "gpu": on the device


def _bicubic(x: float) -> float:
    a = -0.5  # Pillow's bicubic (torch's interpolate uses -0.75: not the same filter)
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x *= math.pi
    return math.sin(x) / x


def _lanczos(x: float) -> float:
    return _sinc(x) * _sinc(x / 3.0) if -3.0 <= x < 3.0 else 0.0


FILTERS: dict[str, tuple[Callable[[float], float], float]] = {"bicubic": (_bicubic, 2.0), "lanczos": (_lanczos, 3.0)}


def _bicubic_v(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1, np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def _lanczos_v(x: np.ndarray) -> np.ndarray:
    return np.where((x >= -3.0) & (x < 3.0), np.sinc(x) * np.sinc(x / 3.0), 0.0)


_VECTOR = {"bicubic": _bicubic_v, "lanczos": _lanczos_v}


@lru_cache(maxsize=8192)
def pil_weights(in_size: int, lo: float, hi: float, out_size: int, kind: str) -> np.ndarray:
    """Pillow's resampling weights (``precompute_coeffs`` in Resample.c) as an ``out x in`` float32
    matrix; cached (crops repeat: the same sizes, the same boxes without augmentation).

    Vectorised over the output pixels: the per-pixel loop took milliseconds a table, and a
    random crop misses the cache, on the rank's thread (the scalar form, :data:`FILTERS`, is
    the reference in tests/test_data_devdecode.py)."""
    _fn, support = FILTERS[kind]
    scale = (hi - lo) / out_size
    filterscale = max(scale, 1.0)
    support *= filterscale
    center = lo + (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5).astype(np.int64), 0)  # C's (int) truncates toward zero
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size)
    taps = xmin[:, None] + np.arange(max(int((xmax - xmin).max()), 0))[None, :]
    inside = taps < xmax[:, None]
    k = np.where(inside, _VECTOR[kind]((taps - center[:, None] + 0.5) / filterscale), 0.0)
    total = k.sum(axis=1, keepdims=True)
    k = np.where(total != 0, k / np.where(total != 0, total, 1.0), k)
    w = np.zeros((out_size, in_size), np.float64)
    rows = np.broadcast_to(np.arange(out_size)[:, None], taps.shape)
    w[rows[inside], taps[inside]] = k[inside]
    out = w.astype(np.float32)
    out.flags.writeable = False  # shared through the cache
    return out


def _round8(x: Tensor) -> Tensor:
    # Pillow: fixed-point sum + half, shifted (round half up), clipped to 0..255. In place: 3 kernels.
    return x.add_(0.5).floor_().clamp_(0, 255)


def weight_tables(sizes: list[tuple[int, int]], boxes: list[tuple[int, int, int, int]], flips: list[bool], size: int,
                  kind: str, pad: tuple[int, int], pin: bool) -> tuple[Tensor, Tensor]:
    """One batch's resample weights on the host: horizontal ``[B, size, W]`` and vertical
    ``[B, size, H]`` (``pad`` = (H, W), the padded batch's sides; zero beyond each image).

    A flip is folded into the horizontal table (its rows reversed): flipping after the resize,
    as the CPU path does, is the same as resampling into the reversed columns. ``pin``: in
    pinned memory, so the feed's copies are asynchronous (the CachingHostAllocator keeps a
    freed pinned block until the copies that read it are done)."""
    n = len(sizes)
    horizontal = torch.zeros((n, size, pad[1]), dtype=torch.float32, pin_memory=pin)
    vertical = torch.zeros((n, size, pad[0]), dtype=torch.float32, pin_memory=pin)
    hv, vv = horizontal.numpy(), vertical.numpy()
    for i, ((h, w), (x0, y0, x1, y1), flip) in enumerate(zip(sizes, boxes, flips)):
        t = pil_weights(w, float(x0), float(x1), size, kind)
        hv[i, :, :w] = t[::-1] if flip else t
        vv[i, :, :h] = pil_weights(h, float(y0), float(y1), size, kind)
    return horizontal, vertical


def resample_padded(x: Tensor, sizes: list[tuple[int, int]], boxes: list[tuple[int, int, int, int]], flips: list[bool],
                    size: int, kind: str) -> Tensor:
    """``Image.resize((size, size), filter, box=box)`` (then a flip) of every image of a padded
    float ``[B, C, H, W]`` batch of 8-bit values, in a handful of kernels for the whole batch.

    Pillow's order (ImagingResampleInner): horizontal, rounded to 8 bits, then vertical, as two
    batched matrix products. A pass Pillow skips (same size, no offset) is an identity table
    here, which changes no 8-bit value. Trap, measured on Pillow 13: for some crop geometries
    Pillow's one-call resize differs from its own two calls (horizontal, then vertical) at
    scattered pixels, by up to ~30 levels where the 8-bit intermediate clips; we match the two
    calls. So the paths agree at almost every pixel, not all (tests/test_data_devdecode.py)."""
    pin = x.device.type == "cuda"
    horizontal, vertical = weight_tables(sizes, boxes, flips, size, kind, (x.shape[-2], x.shape[-1]), pin)
    horizontal = horizontal.to(x.device, non_blocking=True)
    vertical = vertical.to(x.device, non_blocking=True)
    with _full_fp32():
        rows = _round8(torch.matmul(x, horizontal.transpose(1, 2).unsqueeze(1)))  # [B,C,H,W] @ [B,1,W,size]
        return _round8(torch.matmul(vertical.unsqueeze(1), rows))  # [B,1,size,H] @ [B,C,H,size]


@contextlib.contextmanager
def _full_fp32() -> Iterator[None]:
    """TRAP: a tf32 rung turns TF32 matmuls on for the whole process (rung/precision.py); a
    TF32 product keeps 10 mantissa bits of the weights, and the 8-bit rounding after each
    pass would then differ from Pillow's at many pixels. The resample's two products run in
    full float32 (the cost: dense tables, ~35 GFLOP per 32 images at 900 px; docs/data.md)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def pad_batch(images: list[Tensor]) -> Tensor:
    """uint8 images of different sizes -> one zero-padded float32 ``[B, C, Hmax, Wmax]`` tensor in
    three calls (a nested tensor: one copy into its flat buffer; its conversion; its padded
    form), not a copy per image from Python. TRAP: converted BEFORE padding: CUDA's
    ``to_padded_tensor`` has its one-kernel path for float, half and double only, and pads
    any other dtype image by image (NestedTensorTransformerFunctions.cpp). Not measured on a
    GPU: that path copies its offsets to the device from pageable memory, a copy ordered after
    the decode this stream waits for (torchvision's decode call has itself waited for it)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
        return torch.nested.as_nested_tensor(images).to(torch.float32).to_padded_tensor(0.0)


def resample(img: Tensor, box: tuple[int, int, int, int], size: int, kind: str) -> Tensor:
    """One CHW image of 8-bit values (uint8 or float): :func:`resample_padded` of a batch of one."""
    _c, h, w = img.shape
    return resample_padded(img.to(torch.float32).unsqueeze(0), [(h, w)], [box], [False], size, kind)[0]


# A small baseline JPEG (64x64 grey, 4:2:0): the probe of the device decoder. Not smaller:
# rocJPEG's hardware backend (torchvision's ROCm path, vision PR #9342) rejects images under
# 64x64 and torchvision then decodes them on the host itself, which would hide a missing decoder.
_PROBE_JPEG: bytes | None = None


def _probe_jpeg() -> bytes:
    global _PROBE_JPEG
    if _PROBE_JPEG is None:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (128, 128, 128)).save(buf, format="JPEG")
        _PROBE_JPEG = buf.getvalue()
    return _PROBE_JPEG


def probe_device_decoder(device: torch.device) -> None:
    """Refuse, in one line, a device with no JPEG decoder at all.

    TRAP: a torchvision built without nvJPEG (ROCm's wheels; some source builds) raises on
    EVERY device decode. DeviceDecoder would then fall back per image, on the host, inside
    the training process, and the rung would measure that under the name "gpu". One decode
    of a tiny JPEG before the run tells the two apart."""
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg

    data = torch.frombuffer(bytearray(_probe_jpeg()), dtype=torch.uint8)
    try:
        decode_jpeg([data], mode=ImageReadMode.RGB, device=device)
    except (RuntimeError, NotImplementedError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise SpecError(f"--decode gpu: torchvision {torchvision.__version__} cannot decode JPEG on {device} ({first}); "
                        "its build has no device JPEG decoder (nvJPEG; ROCm builds have none): use --decode cpu") from None


def check_decode(decode: str, device: torch.device | None) -> torch.device:
    """The device that decodes for ``decode``; refuses "gpu" with one line where there is none,
    or where its torchvision cannot decode JPEG on it (:func:`probe_device_decoder`)."""
    if decode not in DECODE_PATHS:
        raise SpecError(f"decode {decode!r}: expected one of {', '.join(DECODE_PATHS)}")
    if device is not None:
        return device  # given explicitly (tests compare the paths with the decode on the CPU)
    if decode == "gpu":
        if not torch.cuda.is_available():
            raise SpecError("--decode gpu needs a GPU (nvJPEG through torchvision.io.decode_jpeg); this machine has "
                            "none: use --decode cpu")
        on = torch.device("cuda", torch.cuda.current_device())
        probe_device_decoder(on)
        return on
    return torch.device("cpu")


class _DecodeStream:
    """Where the device decode runs, so that the rank's thread never waits for the device.

    TRAP (torchvision ``csrc/io/image/cuda/decode_jpegs_cuda.cpp``): decode_jpeg allocates
    its outputs on the CURRENT stream but writes them on torchvision's OWN stream, having
    synchronised only its own stream; at the end it makes the current stream wait for its
    own. The caching allocator hands a block freed on a stream to the next allocation on
    that stream as soon as the host frees it, trusting stream order; so on the feed's side
    stream a block freed by the previous batch's resize kernels, still queued there, could
    be handed to the decoder and overwritten before those kernels ran. A host
    synchronisation of the side stream per batch would prevent it, at a wait per batch.

    Now the decode runs with a stream of its own current, on which nothing else is ever
    allocated: its pool holds only decoded images. They are handed to the consumer (the
    side stream) by a device-side ``wait_stream``, and each is ``record_stream``-ed on the
    consumer, so the allocator reuses its block only after the consumer's kernels that read
    it are done: no host wait, and no block a queued kernel still reads. (A decode that
    raised may have freed what it allocated: the per-image retry below is on the same
    stream, which torchvision synchronises before every decode.)"""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def run(self, decode: Callable[[], list[Tensor]]) -> list[Tensor]:
        if self.stream is None:
            return decode()
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            images = decode()
        consumer.wait_stream(self.stream)
        for img in images:
            if img.device.type == "cuda":
                img.record_stream(consumer)
        return images


CHUNK = 32  # images resampled at once: bounds the padded float batch (32 x 3 x 900^2 x 4 B = 311 MB at 900 px)


class DeviceDecoder:
    """Host batch with ``jpeg`` bytes -> the batch with ``image`` (+ ``image_for_codebook``) made on ``device``.

    Per batch: one ``decode_jpeg`` call; per :data:`CHUNK` images, one padding call, the
    weight tables (cached per geometry, assembled in pinned memory, one asynchronous copy
    each), two batched matrix products with their 8-bit rounding; then the normalisation
    (:mod:`devnorm`). About 25 device ops for a batch of 32 where the loop per image took
    20 each (tests/test_data_devdecode.py counts them)."""

    def __init__(self, inputs: str, size: int, codebook_size: int, device: torch.device) -> None:
        """``inputs``: the family's (models/family.py), which say the images to make: ``image``,
        and ``image_for_codebook`` where the inputs hold one (FLAVA's ``masked-image-text``)."""
        from scaleladder.data.devnorm import Affines

        self.inputs, self.size, self.codebook_size, self.device = inputs, size, codebook_size, device
        self.affines = Affines(inputs)
        self.codebook = "image_for_codebook" in self.affines.host
        self.images = 0  # images decoded, warm-up included
        self.cpu_fallbacks = 0  # of them, those the device decoder refused, decoded on the host instead
        self._stream: _DecodeStream | None = None  # made at the first batch, on the rank's device

    def record_attrs(self) -> dict[str, Any]:
        """What actually decoded, for the rung's record: ``decode_images``,
        ``decode_cpu_fallbacks`` and ``decode_cpu_fallback_fraction`` (warm-up included), and
        ``decode_path`` corrected when images fell back to the host: every one
        (``host fallback …``: the rung measured host decode, one image at a time, in the
        training process) or some (the share is appended)."""
        n, k = self.images, self.cpu_fallbacks
        attrs: dict[str, Any] = {"decode_images": n, "decode_cpu_fallbacks": k,
                                 "decode_cpu_fallback_fraction": k / n if n else float("nan")}
        if n and k == n:
            attrs["decode_path"] = f"host fallback (the {self.device.type} decoder refused every image)"
        elif k:
            attrs["decode_path"] = f"gpu ({self.device.type} decode; {k} of {n} images fell back to the host)"
        return attrs

    def _decode_images(self, data: list[Tensor], decode_jpeg: Any, mode: Any, where: list[str] | None = None) -> list[Tensor]:
        """The batch's images, on the device where it decoded them, on the host where it refused."""
        self.images += len(data)
        if self._stream is None:
            self._stream = _DecodeStream(self.device)

        def batched() -> list[Tensor]:
            try:
                images: list[Tensor] = decode_jpeg(data, mode=mode, device=self.device)
                return images
            except RuntimeError:
                # One image the device decoder cannot take (nvJPEG and some progressive or
                # unusual JPEGs; a damaged one) must not stop the run when the host can
                # decode it: one by one, and on the CPU where the device refuses, counted in
                # ``cpu_fallbacks`` and recorded (record_attrs). A decoder that refuses
                # everything is caught before the run (probe_device_decoder).
                return [self._one(d, decode_jpeg, mode, where[i] if where else "?") for i, d in enumerate(data)]

        return self._stream.run(batched)

    def _one(self, data: Tensor, decode_jpeg: Any, mode: Any, where: str) -> Tensor:
        from scaleladder.data.data_errors import DataError

        if self.device.type != "cpu":
            try:
                out: Tensor = decode_jpeg(data, mode=mode, device=self.device)
                return out
            except RuntimeError:
                self.cpu_fallbacks += 1
        try:
            cpu: Tensor = decode_jpeg(data, mode=mode)
            return cpu  # moved to the device in __call__
        except RuntimeError as e:
            # the host cannot decode it either: damaged after the shard writer checked it.
            # Named as the CPU path names it (shard and key), and the rung stops as it would.
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise DataError(f"{where}: corrupt image ({first})") from None

    def __call__(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Long because: the whole batch's decode, resample and normalisation, one step each, in order."""
        from torchvision.io import ImageReadMode, decode_jpeg

        flat, offsets = batch.pop("jpeg"), batch.pop("jpeg_offsets").tolist()
        boxes, flips = batch.pop("box").tolist(), batch.pop("flip").tolist()
        where = batch.pop("__where__", None)
        lengths = [b - a for a, b in zip(offsets, offsets[1:])]
        images = self._decode_images(list(torch.split(flat, lengths)), decode_jpeg, ImageReadMode.RGB, where)
        # a host fallback's image (rare) joins the others on the device
        images = [img if img.device == self.device else img.to(self.device) for img in images]
        out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        main, codebook = [], []
        for lo in range(0, len(images), CHUNK):
            part = images[lo:lo + CHUNK]
            sizes = [(int(img.shape[-2]), int(img.shape[-1])) for img in part]  # host metadata: no sync
            x = pad_batch(part)
            main.append(resample_padded(x, sizes, boxes[lo:lo + CHUNK], flips[lo:lo + CHUNK], self.size, "bicubic"))
            if self.codebook:
                codebook.append(resample_padded(x, sizes, boxes[lo:lo + CHUNK], [False] * len(part), self.codebook_size, "lanczos"))
        out["image"] = self.affines.apply("image", main[0] if len(main) == 1 else torch.cat(main))
        if self.codebook:
            # DALL-E map_pixels, as the CPU path: x -> (1 - 2 eps) x / 255 + eps
            out["image_for_codebook"] = self.affines.apply("image_for_codebook", codebook[0] if len(codebook) == 1 else torch.cat(codebook))
        return out
