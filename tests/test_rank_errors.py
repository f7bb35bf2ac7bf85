"""Who prints a data error under a 2-rank torchrun: a fault every rank finds is printed
once (by rank 0), a fault one rank alone found is printed by that rank, and a rank that
only learned of another's fault (preflight.agreed) exits 2 without a word.

torchrun prefixes nothing: every rank writes to the one stderr, so N ranks printing the
same fault show N copies, even run together on one line when they write at once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from scaleladder.data.manifest import read_manifest, sha256_file
from scaleladder.data.shard_command import main as shard

pytestmark = [pytest.mark.slow, pytest.mark.process]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
# tiny and short: the faults are found before the first batch, so only start-up costs
RUN = ["-m", "scaleladder", "run", "--spec", "vit-debug/ddp/fp32/pre-lag/n1/b2", "--steps", "3", "--warmup", "1",
       "--workers", "0"]


def _torchrun(*args: str, data: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TORCHRUN, *args, *RUN, "--data", str(data), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


def _exit_codes(stderr: str) -> list[int]:
    """The ranks' exit codes from torchrun's failure report."""
    return [int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)]


def _ranks_exited_2(stderr: str) -> None:
    codes = _exit_codes(stderr)
    # 2 (bad input) from every rank that exited by itself; torchrun stops the rest with
    # SIGTERM once one has exited: -15, or 143 where runner's SIGTERM handler ran
    assert 2 in codes and set(codes) <= {2, -15, 143}, stderr


def test_a_fault_every_rank_finds_is_one_line_from_rank_0(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(4):  # captions without labels: fine for FLAVA, not for a classifier
        Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(photos / f"{i}.png")
        (photos / f"{i}.txt").write_text(f"picture {i}")
    data = tmp_path / "s"
    assert shard(["--images", str(photos), "--out", str(data), "--per-shard", "2", "--vocab-size", "64", "--quiet"]) == 0
    p = _torchrun(data=data, out=tmp_path / "x.h5")
    assert p.returncode != 0
    expected = f"scaleladder run: error: {read_manifest(data).path}: not every sample has a label, and vit-debug is a classifier"
    assert p.stderr.count("not every sample has a label") == 1, p.stderr  # not once per rank
    assert expected in p.stderr.splitlines(), p.stderr  # on a line of its own
    _ranks_exited_2(p.stderr)
    assert not list(tmp_path.glob("x.h5*"))


def test_a_shard_only_one_rank_hashed_is_printed_by_that_rank_alone(tmp_path: Path) -> None:
    data = tmp_path / "s"
    assert shard(["--out", str(data), "--samples", "8", "--per-shard", "2", "--image-size", "32", "--quiet"]) == 0
    # rank r hashes shards[r::2] (preflight.shards_to_hash): shard 1 is rank 1's alone
    target = read_manifest(data).shards[1].path
    raw = bytearray(target.read_bytes())
    raw[700] ^= 0xFF  # same size, other bytes: only rank 1's sha256 can tell
    target.write_bytes(bytes(raw))
    logs = tmp_path / "logs"
    # --redirects 2: each rank's stderr in its own file, to tell who printed what
    p = _torchrun("--log-dir", str(logs), "--redirects", "2", data=data, out=tmp_path / "x.h5")
    assert p.returncode != 0
    per_rank = {r: next(logs.glob(f"*/attempt_0/{r}/stderr.log")).read_text() for r in (0, 1)}
    line = f"scaleladder run: error: {target}: sha256 is {sha256_file(target)}, but manifest.json expects "
    finder = [ln for ln in per_rank[1].splitlines() if str(target) in ln]
    assert len(finder) == 1 and finder[0].startswith(line), per_rank[1]
    # rank 0 learned of it through the gather: nothing, not even "(found by rank 1)"
    assert str(target) not in per_rank[0] and "scaleladder run:" not in per_rank[0], per_rank[0]
    assert str(target) not in p.stderr, p.stderr  # torchrun itself repeats nothing
    _ranks_exited_2(p.stderr)
