"""Cheap JPEG checks: the header's frame (size, components) and the end-of-image marker.

These are what lets the shard writer copy a source JPEG's bytes without decoding it
(a decode per image would hold the writer at ~5% of ``tar cf``).

What they catch, and what they do not:

* a file cut short (the common damage: an interrupted download or copy) has no
  end-of-image marker ``FF D9`` after its last scan; so does one cut short and then
  padded with zeros (a preallocated, partly downloaded file), which a decoder reads
  without complaint, the zeros taken for image data;
* a file that is not a JPEG at all, or whose header is damaged, fails the frame parse
  and goes to the decoder, which names the damage;
* NOT caught: bytes flipped inside the entropy-coded data with both ends intact.
  libjpeg only *warns* about those ("Corrupt JPEG data: ...") and Pillow decodes them
  to a picture with grey blocks, so the full draft decode the writer used before did
  not catch them either.
"""

from __future__ import annotations

from typing import NamedTuple

SOI, SOS, EOI = b"\xff\xd8", b"\xff\xda", b"\xff\xd9"
# Bytes allowed after a JPEG's last end-of-image marker: some encoders and cameras
# leave a little padding there. A partly downloaded file cut short and padded with
# zeros (PIL decodes those zeros as image data without complaint) has no marker
# after its last scan at all.
MAX_BYTES_AFTER_EOI = 1024
# Start-of-frame markers C0..CF, except C4 (DHT), C8 (JPG, reserved) and CC (DAC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM, RST0-7 (SOI/EOI are handled by the caller).
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


class Frame(NamedTuple):
    width: int
    height: int
    components: int  # 1: greyscale (PIL "L"), 3: YCbCr/RGB ("RGB"), 4: CMYK/YCCK
    precision: int  # bits per sample; Pillow reads 8 only


def _full_end_check(data: bytes) -> None:
    """The definition, scanning the whole file: slow (a Python-held GIL over every byte)
    but only run to word the error once the fast check in :func:`check_jpeg_end` failed."""
    eoi, sos = data.rfind(EOI), data.rfind(SOS)
    if eoi < 0 or eoi < sos:
        raise ValueError("corrupt or truncated image (no JPEG end-of-image marker FF D9 after the last scan: "
                         "cut short, or padded with zeros after a cut)")
    trailing = len(data) - eoi - len(EOI)
    if trailing > MAX_BYTES_AFTER_EOI:
        raise ValueError(f"corrupt or truncated image ({trailing} bytes after the JPEG end-of-image marker, "
                         f"at most {MAX_BYTES_AFTER_EOI} allowed)")


def check_jpeg_end(data: bytes) -> None:
    """Raise ValueError unless the JPEG ends with an end-of-image marker after its last scan.

    The marker must follow the last start-of-scan (an EXIF thumbnail carries its own
    FF D9 before the main image's scans), and at most ``MAX_BYTES_AFTER_EOI`` bytes may
    follow the last one. Entropy-coded data cannot hold FF D9 (a coded FF is always
    followed by 00 or a restart marker), so a marker there is a real end.

    Only the tail is read: "the last FF D9 lies in the last 1026 bytes and no FF DA
    follows it" is the same condition as "the last FF DA comes before the last FF D9,
    which has at most 1024 bytes after it", without scanning the entropy-coded data.
    """
    tail = max(0, len(data) - MAX_BYTES_AFTER_EOI - len(EOI))
    eoi = data.rfind(EOI, tail)
    if eoi < 0 or data.find(SOS, eoi) >= 0:
        _full_end_check(data)  # raises, with the precise reason
        raise AssertionError("unreachable: the tail check and the full check disagree")  # pragma: no cover


def read_frame(data: bytes) -> Frame | None:
    """The frame header (SOFn) of a JPEG, walking the marker segments before it; None if
    the header is not a well-formed run of segments ending in a frame (the caller then
    lets the decoder judge the file).

    The walk reads only segment headers (a few dozen bytes for a typical file), so it
    costs microseconds where Pillow's ``Image.open`` parses every segment in Python.
    """
    if data[:2] != SOI:
        return None
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill bytes before a marker are allowed
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0xD8, 0xD9, 0xDA):  # a second SOI, EOI or a scan before any frame
            return None
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if pos + 10 > n or length < 8:
                return None
            precision = data[pos + 4]
            height = int.from_bytes(data[pos + 5:pos + 7], "big")
            width = int.from_bytes(data[pos + 7:pos + 9], "big")
            components = data[pos + 9]
            if not (width and height and components):
                return None
            return Frame(width, height, components, precision)
        pos += 2 + length
    return None
