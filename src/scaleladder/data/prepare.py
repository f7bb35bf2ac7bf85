"""Validate each source image (and re-encode only what needs it), on a thread pool that reads ahead.

The shard writer's per-sample work: read the file, check it, maybe re-encode it.
Source JPEGs are copied byte for byte after the cheap checks of :mod:`jpeg` (frame
header, end-of-image marker): no decode. A decode (Pillow, draft mode where it can)
runs only for what must be re-encoded (PNG, WebP, BMP, CMYK or 12-bit JPEGs, and
images larger than ``--image-size``) and for JPEGs whose header the fast parse
cannot read, so that the decoder names the damage.

The threads: file reads and Pillow's decoders release the GIL, so a pool of readers
keeps the disk (or the network filesystem, where latency dominates) busy while the
writer thread builds tar members. Results come back in input order, with at most
``ahead`` items in flight, so memory is bounded and the output deterministic.
"""

from __future__ import annotations

import io
import os
import re
from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from PIL import Image

from scaleladder.data.jpeg import SOI, check_jpeg_end, read_frame
from scaleladder.data.sources import BadSample, Item, Pending, RawSample

JPEG_QUALITY = 90


@dataclass(frozen=True)
class Prepared:
    sample: RawSample
    jpeg: bytes  # what goes into the shard
    width: int
    height: int


def _reencode(data: bytes, image_size: int | None) -> tuple[bytes, int, int]:
    if not data:
        raise ValueError("corrupt or truncated image (empty file, 0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (w, h) = img.format, img.size
            needs_resize = image_size is not None and min(w, h) > image_size
            if fmt == "JPEG" and img.mode in ("RGB", "L") and not needs_resize:
                # Only reached when the fast header parse failed but Pillow can read the
                # header: decode (draft, 1/8 scale: every entropy-coded byte still read)
                # so a damaged file fails here, then keep its bytes.
                img.draft(img.mode, (max(1, w // 8), max(1, h // 8)))
                img.load()
                return data, w, h
            if needs_resize:
                assert image_size is not None
                scale = image_size / min(w, h)  # shorter side -> image_size; never upscale
                size = (max(1, round(w * scale)), max(1, round(h * scale)))
                img.draft("RGB", size)
            else:
                size = (w, h)
            img.load()
            rgb = img.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        # TRAP: Pillow names the stream it read, "<_io.BytesIO object at 0x...>": the caller names the file
        why = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e))
        raise ValueError(f"corrupt or truncated image ({why})") from None
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    rgb.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue(), rgb.width, rgb.height


def prepare_image(data: bytes, image_size: int | None) -> tuple[bytes, int, int]:
    """Validate and, if needed, re-encode an image as JPEG. Returns (jpeg, width, height).

    A JPEG (8-bit, greyscale or colour, no larger than ``image_size`` asks) is kept
    byte for byte once its frame header parses and its end-of-image marker follows
    its last scan (see :mod:`jpeg` for what that catches and what it cannot).
    Everything else is decoded and re-encoded as JPEG quality 90; a decode error is
    a ``ValueError("corrupt or truncated image (...)")``.
    """
    if data[:2] == SOI:
        check_jpeg_end(data)
        frame = read_frame(data)
        if (frame is not None and frame.components in (1, 3) and frame.precision == 8
                and frame.width * frame.height <= (Image.MAX_IMAGE_PIXELS or 1 << 62)
                and (image_size is None or min(frame.width, frame.height) <= image_size)):
            return data, frame.width, frame.height  # pass through: no generation loss, no decode
    return _reencode(data, image_size)


def prepare(x: Item | Pending, image_size: int | None) -> BadSample | Prepared:
    """Resolve a pending item (reads its files) and prepare its image."""
    item = x() if callable(x) else x
    if isinstance(item, BadSample):
        return item
    try:
        jpeg, w, h = prepare_image(item.image, image_size)
    except ValueError as e:
        return BadSample(item.origin, "corrupt_image", f"{item.origin}: {e}")
    return Prepared(item, jpeg, w, h)


def default_threads() -> int:
    # Reads block on I/O, so more threads than cores help on network filesystems;
    # 8 is plenty for a local disk and cheap elsewhere.
    return min(8, (os.cpu_count() or 1) + 2)


def prepared_stream(items: Iterable[Item | Pending], image_size: int | None,
                    threads: int | None = None, ahead: int | None = None,
                    stop: Callable[[], bool] = lambda: False) -> Generator[BadSample | Prepared, None, None]:
    """``prepare`` over ``items``, in order, on ``threads`` threads with ``ahead`` items in flight.

    ``threads=0`` prepares in the calling thread. Closing the generator (the writer
    stopping at ``--samples``, or an error) cancels what has not started and waits for
    what has, so no thread outlives the staging directory it reads for.
    """
    threads = default_threads() if threads is None else threads
    if threads == 0:
        for x in items:
            if stop():
                return
            yield prepare(x, image_size)
        return
    ahead = ahead if ahead is not None else 4 * threads
    pool = ThreadPoolExecutor(threads, thread_name_prefix="shard-prepare")
    inflight: deque[Future[BadSample | Prepared]] = deque()
    try:
        it = iter(items)
        exhausted = False
        while True:
            while not exhausted and len(inflight) < ahead:
                try:
                    x = next(it)
                except StopIteration:
                    exhausted = True
                    break
                inflight.append(pool.submit(prepare, x, image_size))
            if not inflight:
                return
            if stop():
                return
            yield inflight.popleft().result()
    finally:
        for f in inflight:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
