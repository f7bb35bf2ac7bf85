"""JPEG decode and the image transforms, batched on the device (the loader's ``decode="gpu"`` path).

With ``decode="gpu"`` the DataLoader workers do not decode: per sample they parse the
tar member, read the JPEG's frame header for its size, draw the crop box (and flip)
from the same per-reader generators in the same order as the CPU path, and pass the
encoded bytes on (``jpeg`` + ``jpeg_offsets``: one flat uint8 tensor per batch, so one
shared-memory transfer). Everything else of the sample (mask, text, labels) is made in
the worker as before. :class:`DeviceDecoder`, called by the rung's feed on the device,
then decodes the whole batch with ``torchvision.io.decode_jpeg(list, device="cuda")``
(nvJPEG; batched decode on ROCm where torchvision builds it) and resamples, flips and
normalises there.

Same batches as the CPU path, up to rounding: the resampling reproduces Pillow's
(``Image.resize`` with a box: the same separable filters, bicubic a = -0.5 and Lanczos
a = 3, the same support and weights, the pass that shrinks more first and rounded to 8
bits before the other), in float32 instead of Pillow's 22-bit fixed point. So a pixel
may differ by one 8-bit level per pass where a sum lands within ~1e-6 of a .5 tie; the
decoders themselves (libjpeg-turbo in Pillow and in torchvision on the CPU) agree bit
for bit, and nvJPEG's IDCT may differ by one level (tests/test_data_devdecode.py).

One difference by design: for a source much larger than the model's input, the CPU path
decodes in JPEG draft mode (1/2, 1/4 or 1/8 scale, from the DCT), the device path at full
size. The crop box is drawn on the draft size (the same draws) and scaled up, so both
crop the same region; the device path's pixels are then a full-resolution resample of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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


@lru_cache(maxsize=4096)
def pil_weights(in_size: int, lo: float, hi: float, out_size: int, kind: str) -> np.ndarray:
    """Pillow's resampling weights (``precompute_coeffs`` in Resample.c) as an ``out x in`` matrix."""
    fn, support = FILTERS[kind]
    scale = (hi - lo) / out_size
    filterscale = max(scale, 1.0)
    support *= filterscale
    w = np.zeros((out_size, in_size), np.float64)
    for xx in range(out_size):
        center = lo + (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)  # C's (int) truncates toward zero, as int() does
        xmax = min(int(center + support + 0.5), in_size)
        k = np.array([fn((x - center + 0.5) / filterscale) for x in range(xmin, xmax)])
        total = k.sum()
        w[xx, xmin:xmax] = k / total if total != 0 else k
    return w


@lru_cache(maxsize=8192)
def _weights_on(device: torch.device, in_size: int, lo: float, hi: float, out_size: int, kind: str) -> Tensor:
    # Kept on the device: crops repeat (the same draft sizes, the same boxes without
    # augmentation), and a fresh host-to-device copy per image would sync the side stream.
    return torch.from_numpy(pil_weights(in_size, lo, hi, out_size, kind)).to(device, torch.float32)


def _round8(x: Tensor) -> Tensor:
    # Pillow: fixed-point sum + half, shifted (round half up), clipped to 0..255.
    return torch.floor(x + 0.5).clamp_(0, 255)


def resample(img: Tensor, box: tuple[int, int, int, int], size: int, kind: str) -> Tensor:
    """``Image.resize((size, size), filter, box=box)`` on a CHW float tensor of 8-bit values."""
    _c, h, w = img.shape
    x0, y0, x1, y1 = box
    # Pillow skips a pass that changes nothing (the same size and no offset).
    need_h = size != w or x0 != 0 or x1 != size
    need_v = size != h or y0 != 0 or y1 != size
    if not need_h and not need_v:
        return img[:, y0:y1, x0:x1]

    def horizontal(x: Tensor) -> Tensor:
        return _round8(x @ _weights_on(img.device, w, float(x0), float(x1), size, kind).T)  # (C, H, W) @ (W, size)

    def vertical(x: Tensor) -> Tensor:
        return _round8(_weights_on(img.device, h, float(y0), float(y1), size, kind) @ x)  # (size, H) @ (C, H, W')

    if not need_v:
        return horizontal(img)
    if not need_h:
        return vertical(img)
    # Pillow's order (ImagingResampleInner): horizontal, rounded to 8 bits, then vertical.
    # Trap, measured on Pillow 13: for some crop geometries Pillow's one-call resize
    # differs from its own two calls (horizontal, then vertical) at scattered pixels, by
    # up to ~30 levels where the 8-bit intermediate clips; we match the two calls. So
    # the paths agree at almost every pixel, not all (tests/test_data_devdecode.py).
    return vertical(horizontal(img))


def _normalise(x: Tensor, mean: tuple[float, ...], std: tuple[float, ...], scale: float = 1.0, offset: float = 0.0) -> Tensor:
    """As transforms.to_tensor: ``x * mul + add`` per channel, in float32 (the same arithmetic)."""
    m = np.asarray(mean, np.float32)
    s = np.asarray(std, np.float32)
    mul = torch.from_numpy(((scale / 255.0) / s).astype(np.float32)).to(x.device).view(1, -1, 1, 1)
    add = torch.from_numpy(((offset - m) / s).astype(np.float32)).to(x.device).view(1, -1, 1, 1)
    return x * mul + add


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
    import torchvision  # type: ignore[import-untyped]
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


class DeviceDecoder:
    """Host batch with ``jpeg`` bytes -> the batch with ``image`` (+ ``image_for_codebook``) made on ``device``."""

    def __init__(self, family: str, size: int, codebook_size: int, device: torch.device) -> None:
        from scaleladder.data.transforms import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, LOGIT_LAPLACE_EPS

        self.family, self.size, self.codebook_size, self.device = family, size, codebook_size, device
        self.mean, self.std = (CLIP_MEAN, CLIP_STD) if family == "flava" else (IMAGENET_MEAN, IMAGENET_STD)
        self.eps = LOGIT_LAPLACE_EPS
        self.images = 0  # images decoded, warm-up included
        self.cpu_fallbacks = 0  # of them, those the device decoder refused, decoded on the host instead

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

    def _settle(self) -> None:
        """Wait for the work already queued on the current (side) stream, before a device decode.

        TRAP (torchvision ``csrc/io/image/cuda/decode_jpegs_cuda.cpp``): decode_jpeg allocates
        its output on the CURRENT stream but writes it on torchvision's OWN stream, and before
        decoding it synchronises only its own stream. The caching allocator hands out a block
        freed on the current stream as soon as the host frees it, trusting stream order; so a
        block freed by the previous batch's resize kernels, still queued on the side stream,
        could be handed to the decoder and overwritten before those kernels ran. Synchronising
        the current stream first makes every freed block truly free: the decode can no longer
        overtake them, whatever torchvision's stream does. (It costs a host wait for the side
        stream only, which runs one step ahead of the compute stream.)"""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _decode_images(self, data: list[Tensor], decode_jpeg: Any, mode: Any) -> list[Tensor]:
        """The batch's images, on the device where it decoded them, on the host where it refused."""
        self.images += len(data)
        self._settle()
        try:
            images: list[Tensor] = decode_jpeg(data, mode=mode, device=self.device)
            return images
        except RuntimeError:
            # One image the device decoder cannot take (nvJPEG and some progressive or
            # unusual JPEGs: not verified here, no GPU) must not stop the run: decode one
            # by one, and on the CPU where the device refuses, counted in ``cpu_fallbacks``
            # and recorded (record_attrs). A decoder that refuses everything is caught
            # before the run (probe_device_decoder).
            self._settle()  # the failed call may have freed what it allocated
            return [self._one(d, decode_jpeg, mode) for d in data]

    def _one(self, data: Tensor, decode_jpeg: Any, mode: Any) -> Tensor:
        try:
            out: Tensor = decode_jpeg(data, mode=mode, device=self.device)
            return out
        except RuntimeError:
            if self.device.type == "cpu":
                raise  # the shard writer checked every JPEG: this one is damaged after writing
            self.cpu_fallbacks += 1
            cpu: Tensor = decode_jpeg(data, mode=mode)
            return cpu  # moved to the device with its dtype conversion, in __call__

    def __call__(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg  # type: ignore[import-untyped]

        flat, offsets = batch.pop("jpeg"), batch.pop("jpeg_offsets").tolist()
        boxes, flips = batch.pop("box").tolist(), batch.pop("flip").tolist()
        data = [flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        images = self._decode_images(data, decode_jpeg, ImageReadMode.RGB)
        main, codebook = [], []
        for img, box, flip in zip(images, boxes, flips):
            x = img.to(self.device, torch.float32)  # a host fallback's copy; a no-op for a device image
            main.append(resample(x, box, self.size, "bicubic"))
            if self.family == "flava":
                codebook.append(resample(x, box, self.codebook_size, "lanczos"))
            if flip:
                main[-1] = main[-1].flip(-1)
        out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        out["image"] = _normalise(torch.stack(main), self.mean, self.std)
        if self.family == "flava":
            # DALL-E map_pixels, as the CPU path: x -> (1 - 2 eps) x / 255 + eps
            out["image_for_codebook"] = _normalise(torch.stack(codebook), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                                                   scale=1 - 2 * self.eps, offset=self.eps)
        return out
