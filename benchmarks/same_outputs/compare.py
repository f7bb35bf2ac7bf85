"""compare.py BASE NEW: two render.sh folders hold the same outputs. PNGs pixel for pixel; a
dry run by the jobs it plans (Snakemake orders jobs and a reason's files as it likes); every
other file byte for byte once dates, timings, commits and the two folders' names are masked.
Prints each file that differs; exit 1 if any does."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
from PIL import Image

MASK = re.compile(rb"(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?|D:\d{14}\S*|\d{4}-\d\d-\d\dT\d{6}\.\d+"
                  rb"|git [0-9a-f]{12}|commit [0-9a-f]{10}|Workflow ID: [0-9a-f-]+"
                  rb"|\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\]|\d+(\.\d+)? s\b)")
PLANNED = (b"Shell command:", b"    output:", b"scaleladder:", b"  - ", b"rc=", b"total")


def masked(text: bytes, root: Path) -> bytes:
    return MASK.sub(b"<D>", text.replace(str(root).encode(), b"<OUT>"))


def planned(text: bytes, root: Path) -> list[bytes]:
    return sorted(ln for ln in masked(text, root).splitlines() if ln.startswith(PLANNED) or re.match(rb"^\w+\s+\d+$", ln))


def same(a: Path, base: Path, b: Path, new: Path) -> bool:
    if a.suffix == ".png":
        x, y = np.asarray(Image.open(a)), np.asarray(Image.open(b))
        return x.shape == y.shape and bool((x == y).all())
    if a.name.startswith("dry-"):
        return planned(a.read_bytes(), base) == planned(b.read_bytes(), new)
    return masked(a.read_bytes(), base) == masked(b.read_bytes(), new)


def outputs(root: Path) -> set[Path]:
    # work/ and wf/ are render.sh's scratch (inputs and the copied workflow)
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.relative_to(root).parts[0] not in ("work", "wf")}


def main() -> int:
    base, new = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    a, b = outputs(base), outputs(new)
    differ = sorted(r for r in a & b if not same(base / r, base, new / r, new))
    for r in sorted(a - b):
        print("MISSING", r)
    for r in sorted(b - a):
        print("EXTRA", r)
    for r in differ:
        print("DIFFERS", r)
    print(f"{len(a & b) - len(differ)} same, {len(differ)} differ, {len(a - b)} missing, {len(b - a)} extra")
    return 1 if differ or a != b else 0


if __name__ == "__main__":
    sys.exit(main())
