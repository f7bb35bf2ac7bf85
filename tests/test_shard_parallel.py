"""Sharding at tar speed and in parallel: the tar writer's bytes, the cheap JPEG
checks, N slice jobs giving the same bytes for every N, a killed slice redone alone
(the real CLI, a real SIGKILL; a real Snakemake run)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest
from PIL import Image

from conftest import VENV_BIN, snakemake, snakemake_env, workflow_copy
from scaleladder.data import synthetic
from scaleladder.data.jpeg import read_frame
from scaleladder.data.manifest import read_manifest
from scaleladder.data.prepare import prepare_image
from scaleladder.data.shard_command import main as shard
from scaleladder.data.slices import record_name
from scaleladder.data.tarout import header
from scaleladder.site import commands as swf

PY = sys.executable


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_tar_header_is_what_tarfile_writes() -> None:
    # The writer builds ustar headers itself (4 per sample, the hot path); they must stay
    # byte-identical to tarfile's, which WebDataset's TarWriter wrote before.
    for name, size in [("000000001.jpg", 0), ("000000001.jpg", 123457), ("k" * 99, 8**11 - 1), ("x.txt", 511)]:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode, ti.uname, ti.gname = size, 0, 0o444, "", ""
        assert header(name, size) == ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"), (name, size)
    with pytest.raises(ValueError, match="too long"):
        header("k" * 100, 1)


def test_jpeg_kept_without_decode_and_what_is_reencoded() -> None:
    good = synthetic.make_sample(0, 3, 48).jpeg
    assert read_frame(good) == (48, 48, 3, 8)
    assert prepare_image(good, None) == (good, 48, 48)  # the bytes, untouched
    assert prepare_image(good, 48) == (good, 48, 48)  # not larger than --image-size: kept
    small, w, h = prepare_image(good, 24)  # larger: re-encoded, shorter side 24
    assert (w, h) == (24, 24) and small != good and read_frame(small) == (24, 24, 3, 8)
    cmyk = io.BytesIO()
    Image.open(io.BytesIO(good)).convert("CMYK").save(cmyk, format="JPEG")
    out, w, h = prepare_image(cmyk.getvalue(), None)  # 4 components: re-encoded as RGB
    assert out != cmyk.getvalue() and Image.open(io.BytesIO(out)).mode == "RGB"
    # A damaged header (the frame segment's length cut) is left to the decoder, which names it.
    broken = good[:2] + b"\xff\xc0\x00\x01" + good[6:]
    assert read_frame(broken) is None
    with pytest.raises(ValueError, match="corrupt or truncated image"):
        prepare_image(broken, None)


def _photos(d: Path, n: int) -> None:
    """JPEGs and PNGs with captions and labels; one corrupt JPEG (skipped with --skip-bad)."""
    d.mkdir(parents=True)
    for i in range(n):
        s = synthetic.make_sample(11, i, 40)
        if i % 5 == 0:
            Image.open(io.BytesIO(s.jpeg)).save(d / f"p{i:03d}.png")
        else:
            (d / f"p{i:03d}.jpg").write_bytes(s.jpeg if i != 7 else s.jpeg[: len(s.jpeg) // 2])
        (d / f"p{i:03d}.txt").write_text(s.caption)
        (d / f"p{i:03d}.cls").write_text(str(s.label))


def _sliced(src: list[str], parts: Path, out: Path, n: int) -> dict[str, bytes]:
    common = [*src, "--per-shard", "4", "--parts", str(parts), "--skip-bad", "--quiet"]
    for k in range(n):
        assert shard([*common, "--slice", f"{k}/{n}"]) == 0
    assert shard([*common, "--gather", str(n), "--out", str(out)]) == 0
    return _files(out)


def test_slices_give_the_same_bytes_for_1_2_and_4_jobs(tmp_path: Path) -> None:
    _photos(tmp_path / "photos", 23)  # 6 shards of 4 (the last of 3); N=4 gives slices of 1, 2, 1, 2 shards
    # An input WebDataset with a truncated tar among good ones: its report must be made
    # once, and sorted into place, whatever N is.
    assert shard(["--out", str(tmp_path / "in"), "--samples", "30", "--per-shard", "6", "--image-size", "24", "--quiet"]) == 0
    cut = tmp_path / "in/synthetic-000002.tar"
    cut.write_bytes(cut.read_bytes()[:4096])
    for src in (["--images", str(tmp_path / "photos")], ["--wds", str(tmp_path / "in")]):
        got = {}
        for n in (1, 2, 4):
            parts, out = tmp_path / "parts", tmp_path / "out"
            got[n] = _sliced(src, parts, out, n)
            shutil.rmtree(parts)
            shutil.rmtree(out)
        assert got[1] == got[2] == got[4], src
        m = json.loads(got[1]["manifest.json"])
        stats = m["scaleladder"]["stats"]
        skipped = m["scaleladder"]["skipped"]
        assert stats["samples"] < 30 and skipped["total"] >= 1
        # Shard names and keys follow the input index: shard i holds samples 4i..4i+3.
        names = [s["url"] for s in m["shardlist"]]
        assert names == sorted(names) and names[0].endswith("-000000.tar")
        if src[0] == "--images":
            assert skipped["by_reason"] == {"corrupt_image": 1} and "p007.jpg" in skipped["examples"][0]
            counts = [s["nsamples"] for s in m["shardlist"]]
            assert len(counts) == 6 and sum(counts) == 22 and counts.count(3) == 2  # the last, and the bad sample's gap
        else:
            assert skipped["by_reason"]["corrupt_tar"] >= 1 and "synthetic-000002.tar" in skipped["examples"][0]


def test_without_bad_samples_the_shards_equal_the_one_process_writer(tmp_path: Path) -> None:
    one = tmp_path / "one"
    assert shard(["--out", str(one), "--samples", "20", "--per-shard", "4", "--quiet"]) == 0
    sliced = _sliced(["--samples", "20"], tmp_path / "parts", tmp_path / "out", 3)
    tars = {k: v for k, v in _files(one).items() if k.endswith(".tar")}
    assert tars == {k: v for k, v in sliced.items() if k.endswith(".tar")}
    assert _files(one)["tokenizer.json"] == sliced["tokenizer.json"]


_KILL_MID_SLICE = textwrap.dedent("""
    import os, signal, sys
    from scaleladder.data import tarout
    from scaleladder.data.shard_command import main
    closed = []
    real_close = tarout.ShardFile.close
    def close(self):
        closed.append(real_close(self))
        if len(closed) == 2:  # the slice's second shard is done, its record not yet written
            os.kill(os.getpid(), signal.SIGKILL)
        return closed[-1]
    tarout.ShardFile.close = close
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.process
def test_a_killed_slice_is_redone_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--samples", "36", "--per-shard", "4", "--parts", str(tmp_path / "parts"), "--skip-bad", "--quiet"]
    assert shard([*common, "--slice", "0/3"]) == 0
    killed = subprocess.run([PY, "-c", _KILL_MID_SLICE, *common, "--slice", "1/3"], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert shard([*common, "--slice", "2/3"]) == 0
    parts = tmp_path / "parts"
    assert not (parts / record_name(1, 3)).exists()  # no record: the slice counts as not done
    assert [p.name for p in parts.iterdir() if p.name.startswith(f".{record_name(1, 3)}.partial-")]
    # The gather refuses, naming the slice to rerun; nothing is written.
    assert shard([*common, "--gather", "3", "--out", str(tmp_path / "out")]) == 2
    assert "slice 1/3 was not written" in capsys.readouterr().err and not (tmp_path / "out").exists()
    before = {p.name: p.stat().st_mtime_ns for p in parts.glob("*.json")}
    assert shard([*common, "--slice", "1/3"]) == 0  # only the missing slice
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("*.json")} == {**before, record_name(1, 3): (parts / record_name(1, 3)).stat().st_mtime_ns}
    assert shard([*common, "--gather", "3", "--out", str(tmp_path / "out")]) == 0
    resumed = _files(tmp_path / "out")
    assert read_manifest(tmp_path / "out").samples == 36
    shutil.rmtree(parts)
    shutil.rmtree(tmp_path / "out")
    assert _sliced(["--samples", "36"], parts, tmp_path / "out", 1) == resumed  # as if nothing had been killed


def test_bad_slice_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--slice", "2/2", "--parts", str(tmp_path / "p")], "need 0 <= K < N"),
        (["--slice", "x", "--parts", str(tmp_path / "p")], "expected K/N"),
        (["--slice", "0/2"], "need --parts"),
        (["--gather", "2", "--parts", str(tmp_path / "p"), "--out", str(tmp_path / "o")], "slice 0/2 was not written"),
    ]:
        assert shard([*argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_workflow_names_the_records_the_cli_writes() -> None:
    assert swf.shard_slice_records(32, 12)[3] == f"results/shards/32px.parts/{record_name(3, 12)}"


SLICED = """
steps: 4
warmup: 1
data: {samples: 24, per_shard: 4, slices: 2}
ladders:
  - models: [vit-debug]
    strategies: [ddp]
    batches: [4]
"""


def _job_counts(out: str) -> dict[str, int]:
    if "Nothing to be done" in out:
        return {}
    table = out[out.index("Job stats:"):].splitlines()[3:]
    counts = {}
    for line in table:
        words = line.split()
        if len(words) != 2 or words[0] == "total":
            break
        counts[words[0]] = int(words[1])
    return counts


@pytest.mark.process
@pytest.mark.slow
def test_snakemake_killed_mid_slices_reruns_only_the_missing_ones(tmp_path: Path) -> None:
    """A real Snakemake run of 2 slice jobs, SIGKILLed (snakemake and its running job)
    while the second runs; the next run plans and runs only the slices without a record,
    then the gather, and the set equals the one-process (N=1) CLI's. (~40 s on an idle
    2-core VM: two Snakemake starts and four jobs of a few seconds each.)"""
    wf = workflow_copy(tmp_path / "wf")
    (wf / "sliced.yaml").write_text(SLICED)
    args = ("results/shards/32px/manifest.json", "--profile", "profiles/local", "--cores", "1",
            "--configfile", "profiles/local/site.yaml", "sliced.yaml")
    parts = wf / "results/shards/32px.parts"
    proc = subprocess.Popen([os.path.join(VENV_BIN, "snakemake"), *args], cwd=wf, env=snakemake_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        logs = wf / "results/logs/shard"
        # Killed once a slice is done AND the next job has started: Snakemake has then
        # recorded the first as complete (killed sooner, it would rightly count as incomplete).
        while time.time() < deadline and not (list(parts.glob("slice-*.json"))
                                              and len(list(logs.glob("*slice*.log"))) > len(list(parts.glob("slice-*.json")))):
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = {p.name: p.stat().st_mtime_ns for p in parts.glob("slice-*.json")}
    assert len(done) == 1 and not (wf / "results/shards/32px/manifest.json").exists()
    plan = _job_counts(snakemake(wf, *args, "-n").stdout)
    assert plan == {"shard": 1, "shard_slice": 1}
    snakemake(wf, *args, "--unlock")  # a SIGKILLed Snakemake leaves its lock, as after a power loss
    snakemake(wf, *args)
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("slice-*.json") if p.name in done} == done
    got = _files(wf / "results/shards/32px")
    ref = _sliced(["--samples", "24", "--image-size", "32"], tmp_path / "p1", tmp_path / "o1", 1)
    assert {k: v for k, v in got.items() if k != "manifest.json"} == {k: v for k, v in ref.items() if k != "manifest.json"}
    assert json.loads(got["manifest.json"])["shardlist"] == json.loads(ref["manifest.json"])["shardlist"]
