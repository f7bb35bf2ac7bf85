"""uint8 images -> normalised float32 on the device: the rank's half of the uint8 transport.

Why the images cross from the workers as uint8: on an H100, vit-base b128 fed
float32 batches by 14 workers ran at 0.795x its synthetic rate while the step waited only
0.29 ms for a batch. A float32 batch is 77 MB at b128 and 224 px, pinned by the rank's
pin-memory thread and copied to the device; that traffic and the workers' CPU load slowed
the rank's kernel launches (its step went from 49 to 62 ms). uint8 is a quarter of it.
What FFCV, DALI and torchvision's training references do, and what this does:

* the workers resize (and flip) in uint8, and ship uint8 CHW;
* the DataLoader's pin-memory thread pins that batch; here every tensor is copied with
  ``non_blocking=True`` (asynchronous from pinned memory) on the feed's side stream;
* the images are converted and normalised ON THE DEVICE in float32, with the same
  arithmetic as the workers' :func:`transforms.to_tensor` (``x * mul + add`` per channel,
  ``mul`` and ``add`` computed in float32 the same way), so the numbers are the same
  bit for bit; the feed then casts to the rung's dtype (rung/feed.py).

Three kernels per image tensor (convert, multiply, add), whatever the batch size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

Batch = dict[str, Any]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # FLAVA's IMAGE_PRETRAINING_MEAN
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LOGIT_LAPLACE_EPS = 0.1  # DALL-E map_pixels


def affine(mean: tuple[float, ...], std: tuple[float, ...], scale: float = 1.0,
           offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Per channel ``(mul, add)`` in float32 with ``x * mul + add == ((x / 255) * scale + offset - mean) / std``.

    The one definition: transforms.to_tensor (in the worker), this module and
    devdecode (on the device) all take theirs from here, so the paths round alike."""
    m = np.asarray(mean, np.float32)
    s = np.asarray(std, np.float32)
    return ((scale / 255.0) / s).astype(np.float32), ((offset - m) / s).astype(np.float32)


def image_affines(inputs: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{batch key: (mul, add)}`` of the images a family's ``inputs`` hold (models/family.py):
    ``image`` (ViT's): ImageNet's mean/std; ``masked-image-text`` (FLAVA's): CLIP's mean/std, and
    the codebook image's DALL-E ``map_pixels``."""
    if inputs == "masked-image-text":
        eps = LOGIT_LAPLACE_EPS
        return {"image": affine(CLIP_MEAN, CLIP_STD),
                "image_for_codebook": affine((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), scale=1 - 2 * eps, offset=eps)}
    return {"image": affine(IMAGENET_MEAN, IMAGENET_STD)}


class Affines:
    """The per-channel ``(mul, add)`` of each image key, uploaded once per device and kept."""

    def __init__(self, inputs: str) -> None:
        self.host = image_affines(inputs)
        self._on: dict[tuple[str, torch.device], tuple[Tensor, Tensor]] = {}

    def on(self, key: str, device: torch.device) -> tuple[Tensor, Tensor]:
        got = self._on.get((key, device))
        if got is None:
            mul, add = (torch.from_numpy(a).view(1, -1, 1, 1).to(device) for a in self.host[key])
            got = self._on[(key, device)] = (mul, add)
        return got

    def apply(self, key: str, x: Tensor) -> Tensor:
        """uint8 (or 8-bit valued float) ``[B,C,H,W]`` -> normalised float32, in place after the conversion."""
        mul, add = self.on(key, x.device)
        # TRAP: not addcmul: a fused multiply-add rounds once, the workers' numpy rounds
        # twice; two kernels give the workers' float32 numbers bit for bit.
        return x.to(torch.float32).mul_(mul).add_(add)


class DeviceNormaliser:
    """Host batch with uint8 images -> the batch on ``device``, images normalised in float32.

    Called by the rung's feed where the copy would be (on its side stream on a GPU)."""

    def __init__(self, inputs: str, device: torch.device) -> None:
        self.device = device
        self.affines = Affines(inputs)

    def __call__(self, batch: Batch) -> Batch:
        out = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        for key in self.affines.host:
            out[key] = self.affines.apply(key, out[key])
        return out
