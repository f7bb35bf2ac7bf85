"""The embedded default data set: shapes on textured backgrounds, with captions.

Each sample is a coloured shape (the class) drawn at some size and position on a
coloured, textured background, encoded as a real JPEG, plus a caption from a
small grammar that describes exactly what was drawn. So every loss has signal:

* ViT classification: the label is the shape.
* FLAVA contrastive / ITM: the caption names the colours, shape, size, position
  and texture visible in the image; a swapped-in caption usually disagrees.
* FLAVA MLM: the grammar is regular and the words are predictable from the image.
* FLAVA MIM: the images have structure (edges, stripes, dots), not white noise.

Sample ``i`` depends only on ``(seed, i)`` (its own ``numpy`` generator), so the
set is the same whatever the shard size or the order samples are written in.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES: tuple[str, ...] = (
    "circle", "square", "triangle", "diamond", "cross", "star", "ring", "hexagon", "crescent", "arrow",
)
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 50, 170),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
TEXTURES: tuple[str, ...] = ("plain", "striped", "checkered", "dotted")
SIZES: tuple[str, ...] = ("small", "large")
# 3x3 grid of positions; the phrase is what the caption says.
POSITIONS: tuple[str, ...] = (
    "in the top left", "at the top", "in the top right",
    "on the left", "in the center", "on the right",
    "in the bottom left", "at the bottom", "in the bottom right",
)
TEMPLATES: tuple[str, ...] = (
    "a {size} {color} {shape} {position} on a {texture} {bg} background",
    "a {texture} {bg} background with a {size} {color} {shape} {position}",
    "there is a {size} {color} {shape} {position}, the background is {bg} and {texture}",
    "{size} {color} {shape} {position} over {texture} {bg}",
)
JPEG_QUALITY = 90


@dataclass(frozen=True)
class SyntheticSample:
    jpeg: bytes
    caption: str
    label: int


def _shape_polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
    def ring(n: int, radius: float, phase: float = -math.pi / 2) -> list[tuple[float, float]]:
        return [(cx + radius * math.cos(phase + 2 * math.pi * k / n), cy + radius * math.sin(phase + 2 * math.pi * k / n)) for k in range(n)]

    if shape == "triangle":
        return ring(3, r)
    if shape == "diamond":
        return ring(4, r)
    if shape == "hexagon":
        return ring(6, r, 0.0)
    if shape == "star":
        outer, inner = ring(5, r), ring(5, r * 0.45, -math.pi / 2 + math.pi / 5)
        return [p for pair in zip(outer, inner) for p in pair]
    if shape == "arrow":  # pointing right
        return [(cx - r, cy - r * 0.3), (cx, cy - r * 0.3), (cx, cy - r), (cx + r, cy),
                (cx, cy + r), (cx, cy + r * 0.3), (cx - r, cy + r * 0.3)]
    raise ValueError(shape)


def _background(rng: np.random.Generator, size: int, color: tuple[int, int, int], texture: str) -> Image.Image:
    base = np.empty((size, size, 3), np.float32)
    base[:] = color
    # A contrasting tone for the texture: halfway to white or black.
    tone = np.array(color, np.float32)
    tone = tone + (255 - tone) * 0.5 if tone.mean() < 128 else tone * 0.5
    period = int(rng.integers(max(4, size // 10), max(6, size // 4) + 1))
    yy, xx = np.mgrid[0:size, 0:size]
    if texture == "striped":
        coord = xx if rng.random() < 0.5 else yy
        base[(coord // max(1, period // 2)) % 2 == 1] = tone
    elif texture == "checkered":
        base[((xx // period) + (yy // period)) % 2 == 1] = tone
    elif texture == "dotted":
        ox, oy = rng.integers(0, period, 2)
        d = ((xx + ox) % period - period / 2) ** 2 + ((yy + oy) % period - period / 2) ** 2
        base[d <= (period / 4) ** 2] = tone
    # Mild sensor-like noise so JPEGs and MIM targets are not piecewise flat.
    base += rng.normal(0.0, 6.0, base.shape).astype(np.float32)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")


def make_sample(seed: int, index: int, image_size: int = 64) -> SyntheticSample:
    """Sample ``index`` of the synthetic set with ``seed``: a JPEG, its caption and its label."""
    rng = np.random.default_rng([seed, index])
    label = int(rng.integers(len(SHAPES)))
    shape = SHAPES[label]
    names = list(COLORS)
    color = names[int(rng.integers(len(names)))]
    bg = names[int(rng.integers(len(names) - 1))]
    if bg == color:  # the shape must be visible: never the background's colour
        bg = names[-1]
    texture = TEXTURES[int(rng.integers(len(TEXTURES)))]
    size_word = SIZES[int(rng.integers(len(SIZES)))]
    pos = int(rng.integers(len(POSITIONS)))

    s = image_size
    r = s * (0.12 if size_word == "small" else 0.22) * float(rng.uniform(0.9, 1.1))
    col, row = pos % 3, pos // 3
    cx = s * (col + 1) / 4 + float(rng.uniform(-0.03, 0.03)) * s
    cy = s * (row + 1) / 4 + float(rng.uniform(-0.03, 0.03)) * s

    img = _background(rng, s, COLORS[bg], texture)
    draw = ImageDraw.Draw(img)
    fill = COLORS[color]
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle((cx - r * 0.85, cy - r * 0.85, cx + r * 0.85, cy + r * 0.85), fill=fill)
    elif shape == "ring":
        draw.ellipse(box, outline=fill, width=max(2, int(r * 0.35)))
    elif shape == "cross":
        w = r * 0.3
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fill)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fill)
    elif shape == "crescent":
        draw.ellipse(box, fill=fill)
        draw.ellipse((cx - r * 0.45, cy - r * 1.05, cx + r * 1.45, cy + r * 0.95), fill=COLORS[bg])
    else:
        draw.polygon(_shape_polygon(shape, cx, cy, r), fill=fill)

    caption = TEMPLATES[int(rng.integers(len(TEMPLATES)))].format(
        size=size_word, color=color, shape=shape, position=POSITIONS[pos], texture=texture, bg=bg
    )
    buf = io.BytesIO()
    # Fixed quality, no "optimize"/progressive passes: the same pixels give the same bytes.
    img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return SyntheticSample(buf.getvalue(), caption, label)


def write_image_folder(folder: Path, n: int, sides: tuple[int, int], distinct: int | None = None, seed: int = 0) -> int:
    """``n`` JPEGs with sidecar captions and labels (``NAME.jpg``, ``.txt``, ``.cls``), the input of
    ``scaleladder shard --images``; returns their total bytes.

    Sides are spread evenly over ``sides``: 300..900 px gives JPEGs of about 20 to 200 KB,
    as web images are (the loader's benchmarks and gpu-check: source images not already at
    the model's size, so decode and resize cost what they do in a real rung). With
    ``distinct``, only that many images are drawn (~50 ms each at 900 px) and the rest are
    copies under other names: the loader decodes and crops each all the same."""
    folder.mkdir(parents=True)
    total = 0
    lo, hi = sides
    k = distinct or n
    made = [make_sample(seed, i, lo + (hi - lo) * i // max(k - 1, 1)) for i in range(k)]
    for i in range(n):
        s = made[i % k]
        for suffix, data in ((".jpg", s.jpeg), (".txt", s.caption.encode()), (".cls", str(s.label).encode())):
            (folder / f"{i:06d}{suffix}").write_bytes(data)
            total += len(data)
    return total
