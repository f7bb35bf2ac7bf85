"""Check that every pin of an image's lock exists on the index that image installs it from.

    python containers/verify_pins.py cuda rocm      # exit 1 naming each pin that does not resolve

Why: ``pip install --index-url X`` looks ONLY at X. An image that installs torch from PyTorch's
ROCm index must find there exactly the versions the lock names, and everything else must be
on PyPI; a pin missing from its index is a build that fails after the base image is pulled,
or, worse, never built until someone needs it. Images cannot be built on our machines (no
registry for base images), so this is the check short of the build.

How: one ``pip install --dry-run --no-deps --isolated`` per index, for the image's Python
(3.11) and platform (manylinux x86_64): nothing is installed, only found. ``--isolated``
ignores this machine's pip config (a local wheel folder would answer for the real index).
Which pins come from which index is read from the Dockerfile itself (its TORCH_INDEX_URL and
the names its first ``pip install --no-deps`` takes), so the check follows the image.

Needs the network (the package indexes only): tests/test_containers.py runs it where
SCALELADDER_NETWORK_TESTS=1, not in default CI (download.pytorch.org is not reachable from
every machine, and a slow index must not fail an unrelated change).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYPI = "https://pypi.org/simple"
PYTHON = "3.11"
# Every manylinux tag the image's glibc (Debian bookworm: 2.36) accepts. TRAP: with --platform,
# pip takes exactly the tags given: naming only 2_28 and 2_17 made the nvidia-* wheels (tagged
# manylinux_2_27) look absent.
PLATFORMS = tuple(f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)) + ("manylinux2014_x86_64", "linux_x86_64")


def lock(flavor: str) -> dict[str, str]:
    pins = {}
    for line in (HERE / f"constraints-{flavor}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name] = version
    return pins


def torch_index(flavor: str) -> tuple[str, list[str]]:
    """(index URL, the lock names installed from it) as the Dockerfile says."""
    text = (HERE / f"Dockerfile.{flavor}").read_text()
    url = re.search(r"^ARG TORCH_INDEX_URL=(\S+)$", text, re.M)
    if not url:
        raise SystemExit(f"containers/Dockerfile.{flavor}: no ARG TORCH_INDEX_URL")
    # the first RUN, from its lock= (the names are its `"NAME==$(sed ...)"` arguments)
    step = text[text.index("lock=containers/"):]
    step = step[:step.index("\n\n")]
    names = re.findall(r'"([\w-]+)==\$\(sed', step)
    return url.group(1), names


def plan(flavor: str) -> dict[str, dict[str, str]]:
    """index URL -> {name: version} to find there."""
    pins = lock(flavor)
    url, names = torch_index(flavor)
    missing = [n for n in names if n not in pins]
    if missing:
        raise SystemExit(f"containers/Dockerfile.{flavor} installs {', '.join(missing)}, which the lock does not pin")
    out: dict[str, dict[str, str]] = {PYPI: {}}
    out.setdefault(url, {})
    for name, version in pins.items():
        out[url if name in names else PYPI][name] = version
    return {u: p for u, p in out.items() if p}


def unresolved(index: str, pins: dict[str, str], timeout: float = 600) -> list[str]:
    """The pins pip cannot find on ``index`` ([] when all resolve); raises on no network."""
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", "install", "--dry-run", "--no-deps", "--ignore-installed",
               "--target", tmp, "--quiet", "--index-url", index, "--python-version", PYTHON, *platforms,
               *(f"{n}=={v}" for n, v in pins.items())]
        bad: list[str] = []
        while True:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if run.returncode == 0:
                return bad
            m = re.search(r"No matching distribution found for (\S+)", run.stderr)
            if not m:
                why = [line for line in run.stderr.splitlines() if "ERROR" in line or "Failed to establish" in line]
                raise RuntimeError(f"pip against {index} failed: {(why or run.stderr.strip().splitlines() or ['?'])[-1].strip()}")
            culprit = m.group(1)
            bad.append(culprit)
            cmd = [c for c in cmd if c != culprit]  # go on: name every culprit, not the first
            if culprit not in run.args:
                raise RuntimeError(f"pip named {culprit}, which was not asked for")


def main(argv: list[str]) -> int:
    flavors = argv or ["cuda", "rocm"]
    failed = 0
    for flavor in flavors:
        for index, pins in plan(flavor).items():
            bad = unresolved(index, pins)
            for pin in bad:
                print(f"containers/constraints-{flavor}.txt: {pin} is not on {index} (the index Dockerfile.{flavor} takes it from)")
            failed += len(bad)
            print(f"{flavor}: {len(pins) - len(bad)}/{len(pins)} pins found on {index}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
