"""scikit-learn's handwritten digits as a folder that ``scaleladder shard --images`` reads.

The convergence rung (:mod:`scaleladder.campaign.converge`) must train on real,
labelled images that no one in this project made, offline, in CI time. scikit-learn
ships one: the UCI "Optical Recognition of Handwritten Digits" test set, 1,797 8x8
grey images of 0-9, 4 bits deep (values 0..16), inside the wheel (``load_digits``
downloads nothing).

This module only writes the images as files; sharding them is ``scaleladder shard``'s
job, exactly as for any folder of photos, so the convergence rung trains through the
real shard -> WebDataset loader path. Layout::

    OUT/train/00001.png  00001.txt ("a handwritten digit 0")  00001.cls ("0")
    OUT/test/00000.png   ...
    OUT/digits.json      where the data came from, the split rule, the counts

The split is a rule, not a draw: sample ``i`` (in scikit-learn's fixed order) is held
out when ``i % 5 == 0``: 360 test images, 1,437 train, every digit in both (the file
is not sorted by class, so every fifth image takes 15-26% of each class: 26-48 test
images per digit). Nothing random, so the split cannot drift with a seed or a library version.

Pixels are scaled 0..16 -> 0..255 (``round(v * 255 / 16)``), ink bright on black, as
scikit-learn stores them; PNG, so the file is exact (the shard writer re-encodes to
JPEG: at 8x8 grey that costs at most a few grey levels). The ViT transform upsamples
8 -> ``flavor.image_size`` (32 for vit-debug: each 8-px patch sees 2x2 source pixels).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from scaleladder.errors import SpecError

HOLD_OUT_EVERY = 5  # sample i is a test image when i % 5 == 0
SPLITS = ("train", "test")
INFO_FILE = "digits.json"


def load() -> tuple[np.ndarray, np.ndarray, str]:
    """(images uint8 [N,8,8] in 0..255, labels int64 [N], scikit-learn version)."""
    try:
        import sklearn
        from sklearn.datasets import load_digits
    except ImportError:
        raise SpecError("the digits set needs scikit-learn: pip install 'scaleladder[converge]' (make setup installs it)") from None
    d = load_digits()
    images = np.rint(np.asarray(d.images, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8)
    return images, np.asarray(d.target, dtype=np.int64), str(sklearn.__version__)


def split_of(index: int) -> str:
    return "test" if index % HOLD_OUT_EVERY == 0 else "train"


def export(out: Path, overwrite: bool = False) -> dict[str, Any]:
    """Write ``out/{train,test}`` (images + sidecar caption and label) and ``out/digits.json``.

    Written into a staging folder beside ``out`` and renamed at the end: an interrupted
    export leaves no half folder that a later ``shard`` would read as the whole set.
    """
    from PIL import Image

    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise SpecError(f"{out}: exists and is not empty (give --overwrite to replace it)")
    images, labels, version = load()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        counts: dict[str, list[int]] = {s: [0] * 10 for s in SPLITS}
        for s in SPLITS:
            (staging / s).mkdir(parents=True)
        for i, (img, label) in enumerate(zip(images, labels)):
            split = split_of(i)
            stem = staging / split / f"{i:05d}"
            Image.fromarray(img).save(stem.with_suffix(".png"))
            stem.with_suffix(".txt").write_text(f"a handwritten digit {int(label)}\n")
            stem.with_suffix(".cls").write_text(f"{int(label)}\n")
            counts[split][int(label)] += 1
        info = {
            "source": "sklearn.datasets.load_digits (UCI Optical Recognition of Handwritten Digits, test part)",
            "scikit_learn": version,
            "samples": int(len(labels)),
            "image": "8x8 grey PNG, pixels round(v * 255 / 16) from 0..16",
            "split": f"index i (scikit-learn's order) is test when i % {HOLD_OUT_EVERY} == 0",
            "per_class": counts,
            "train": sum(counts["train"]),
            "test": sum(counts["test"]),
        }
        (staging / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info


def add_arguments(p: Any) -> None:
    p.add_argument("--out", type=Path, required=True, help="folder to write: OUT/train, OUT/test (then `scaleladder shard --images OUT/train`)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --out")


def main(args: Any) -> int:
    import sys

    info = export(args.out, args.overwrite)
    print(f"wrote {info['train']} train and {info['test']} test digits (scikit-learn {info['scikit_learn']}) to {args.out}", file=sys.stderr)
    return 0
