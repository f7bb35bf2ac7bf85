"""Faults that must never cost finished work or leave the user guessing, for real:
a full disk (`ulimit -f` through RLIMIT_FSIZE, or a tiny tmpfs where mounting is allowed),
a truncated or misfiled rung file, garbage given to `compare`, the litter of killed runs.
Each test runs the real command in a subprocess; none takes more than a few seconds."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import write_rung

RUNG = "vit-debug/single/fp32/pre-lag/n1/b8"


def sl(*args: str, cwd: Path | None = None, fsize: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`scaleladder ARGS`, under a file size limit of ``fsize`` bytes (`ulimit -f`) if given."""
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "scaleladder", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit)


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr[-3000:]
    return lines[0]


def litter(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".tmp" in p.name or ".partial-" in p.name
                  or ".probe-" in p.name)


# -- fault 3: a rung that cannot write its output fails before training ---------------------------


@pytest.mark.process
def test_run_refuses_an_output_it_could_not_write_before_training(tmp_path: Path) -> None:
    # 100000 steps: were it to train first, it would run past the timeout
    p = sl("run", "--spec", RUNG, "--steps", "100000", "--warmup", "1", "--out", str(tmp_path / "x.h5"),
           fsize=16 * 1024, timeout=60)
    assert p.returncode == 1
    line = one_line(p)
    assert f"cannot write {tmp_path / 'x.h5'}" in line and "EFBIG" in line and "before training" in line
    assert not list(tmp_path.iterdir())


@pytest.mark.process
def test_launch_refuses_it_before_any_rank_starts(tmp_path: Path) -> None:
    p = sl("launch", "--launcher", "", "--spec", RUNG, "--steps", "100000", "--warmup", "1",
           "--out", str(tmp_path / "x.h5"), fsize=16 * 1024, timeout=60)
    assert p.returncode == 1 and one_line(p).startswith("scaleladder launch: error: cannot write")  # no launch line
    assert not list(tmp_path.iterdir())


@pytest.fixture
def tiny_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.process
def test_a_full_disk_is_found_before_training(tiny_fs: Path) -> None:
    p = sl("run", "--spec", RUNG, "--steps", "100000", "--warmup", "1", "--out", str(tiny_fs / "r" / "x.h5"), timeout=60)
    assert p.returncode == 1 and "no space left on the device [ENOSPC]" in one_line(p)
    assert litter(tiny_fs) == []


# -- fault 4: a write that fails is one line, no temporary file, no crash --------------------------


def big_rungs(root: Path, n: int = 3) -> list[Path]:
    """Rung files of ~0.5 MB each (a long step-time series), so their ladder exceeds a small limit."""
    files = []
    for batch in range(1, n + 1):
        f = write_rung(root, f"vit-debug/ddp/fp32/pre-lag/n1/b{batch}")
        with h5py.File(f, "a") as h:
            h.create_dataset("extra", data=np.random.default_rng(batch).random(64 * 1024))
        files.append(f)
    return files


@pytest.mark.process
def test_aggregate_on_a_full_disk_is_one_line_and_keeps_the_old_ladder(tmp_path: Path) -> None:
    files = big_rungs(tmp_path)
    ladder = tmp_path / "results" / "ladder.h5"
    ladder.write_bytes(b"the previous ladder")
    p = sl("aggregate", "--out", str(ladder), *map(str, files), fsize=256 * 1024)
    assert p.returncode == 1, p.stderr[-3000:]  # before: HDF5 error stacks, then a segfault (139)
    assert one_line(p) == (f"scaleladder aggregate: error: cannot write {ladder}: file too large (over the process's "
                           "file size limit, `ulimit -f`, or the filesystem's) [EFBIG]")
    assert ladder.read_bytes() == b"the previous ladder" and litter(tmp_path) == []


@pytest.mark.process
def test_shard_on_a_full_disk_names_the_file_and_leaves_nothing(tmp_path: Path) -> None:
    p = sl("shard", "--out", str(tmp_path / "sh"), "--samples", "64", "--per-shard", "16", "--image-size", "32",
           fsize=64 * 1024)
    assert p.returncode == 1
    line = one_line(p)
    assert f"cannot write {tmp_path / 'sh'}/synthetic-000000.tar" in line and "EFBIG" in line, line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.process
def test_compare_figure_on_a_full_disk(tmp_path: Path) -> None:
    files = three_rungs(tmp_path)
    assert sl("aggregate", "--out", str(tmp_path / "ladder.h5"), *map(str, files)).returncode == 0
    p = sl("compare", str(tmp_path / "ladder.h5"), str(tmp_path / "ladder.h5"), "--figure", str(tmp_path / "c.png"),
           fsize=8 * 1024)
    assert p.returncode == 1 and f"cannot write {tmp_path / 'c.png'}" in p.stderr.splitlines()[-1]
    assert litter(tmp_path) == []


# -- fault 2: a corrupt rung file costs only that rung -----------------------------------------------


def three_rungs(root: Path) -> list[Path]:
    return [write_rung(root, s) for s in ("vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4",
                                          "flava-debug/ddp/fp32/pre-lag/n1/b4")]


@pytest.mark.process
def test_a_truncated_rung_is_named_and_marked_the_ladder_figures_and_report_still_come_out(tmp_path: Path) -> None:
    from scaleladder.results.aggregate import read_ladder

    files = three_rungs(tmp_path)
    os.truncate(files[0], 5000)
    p = sl("aggregate", "--out", "results/ladder.h5", "--provenance", '{"site": "local"}', "--dir", "results/rungs",
           cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rel = "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5"
    redo = f"snakemake {rel} --profile profiles/local --forcerun {rel}"
    line = one_line(p)
    assert line.startswith(f"scaleladder aggregate: {rel}: not a readable HDF5 file (truncated file") and line.endswith(redo)
    rungs, root = read_ladder(str(tmp_path / "results/ladder.h5"))
    by = {r["spec"]: r for r in rungs}
    assert by["vit-debug/ddp/fp32/pre-lag/n1/b4"]["status"] == "corrupt"
    assert by["vit-debug/ddp/fp32/pre-lag/n1/b4"]["redo"] == redo
    assert [by[s]["status"] for s in sorted(by) if "ddp/fp32/pre-lag/n1/b4" not in s or "flava" in s] == ["ok", "ok"]
    assert sl("plots", "--ladder", "results/ladder.h5", "--out-dir", "results/plots", cwd=tmp_path).returncode == 0
    assert sl("report", "--ladder", "results/ladder.h5", "--plots", "results/plots", "--html", "results/report.html",
              "--md", "results/report.md", cwd=tmp_path).returncode == 0
    md = (tmp_path / "results/report.md").read_text()
    assert "## Corrupt rung files" in md and redo in md


@pytest.mark.process
def test_a_record_filed_under_another_rungs_path_is_not_taken_for_it(tmp_path: Path) -> None:
    files = three_rungs(tmp_path)
    wrong = files[0].with_name("b1500.h5")
    shutil.copy(files[0], wrong)  # a b4 record copied to b1500.h5
    p = sl("aggregate", "--out", "ladder.h5", *map(str, [*files, wrong]), cwd=tmp_path)
    assert p.returncode == 0
    assert "the record inside is rung 'vit-debug/ddp/fp32/pre-lag/n1/b4', not 'vit-debug/ddp/fp32/pre-lag/n1/b1500'" in one_line(p)
    from scaleladder.results.aggregate import read_ladder

    statuses = {r["spec"]: r["status"] for r in read_ladder(str(tmp_path / "ladder.h5"))[0]}
    assert statuses["vit-debug/ddp/fp32/pre-lag/n1/b1500"] == "corrupt"
    assert statuses["vit-debug/ddp/fp32/pre-lag/n1/b4"] == "ok"


@pytest.mark.process
def test_compare_names_a_garbage_or_truncated_file_and_exits_2(tmp_path: Path) -> None:
    files = three_rungs(tmp_path)
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(os.urandom(3000))
    p = sl("compare", str(garbage), str(tmp_path / "results/rungs"), "--figure", str(tmp_path / "c.png"))
    assert p.returncode == 2
    assert one_line(p) == f"scaleladder compare: error: {garbage}: not a readable HDF5 file (file signature not found)"
    os.truncate(files[1], 4000)
    p = sl("compare", str(tmp_path / "results/rungs"), str(tmp_path / "results/rungs"), "--figure", str(tmp_path / "c.png"))
    assert p.returncode == 2 and f"{files[1]}: not a readable HDF5 file (truncated file" in p.stderr.splitlines()[-1]


# -- fault 7: the next run cleans up its own dead leftovers, never a live process's ---------------------


@pytest.mark.process
def test_dead_leftovers_are_removed_live_ones_kept(tmp_path: Path) -> None:
    files = three_rungs(tmp_path)
    out = tmp_path / "results" / "ladder.h5"
    live = subprocess.Popen(["sleep", "60"])
    try:
        dead_old = out.with_name(f"ladder.h5.{2**22 + 1}.tmp")  # the old aggregate's name; pid_max is at most 2**22
        dead = out.with_name(f"ladder.h5.tmp-{2**22 + 1}")
        kept = out.with_name(f"ladder.h5.tmp-{live.pid}")
        for f in (dead_old, dead, kept):
            f.write_bytes(b"x")
        assert sl("aggregate", "--out", str(out), *map(str, files)).returncode == 0
        assert not dead_old.exists() and not dead.exists() and kept.exists()
    finally:
        live.kill()
        live.wait()


# -- fault 8: a reference holds only under the conditions it states -------------------------------------


@pytest.mark.process
def test_a_reference_refuses_a_rung_measured_under_other_conditions(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[1]
    spec = "vit-debug/ddp/fp32/pre-lag/n1/b4"
    # the workflow's rung: read from shards on this CPU, far slower than the synthetic reference
    f = write_rung(tmp_path, spec, items_per_s=232.7, data="results/shards/32px/manifest.json", device_name="cpu (x86_64)")
    p = sl("compare", str(f.parents[5]), "--reference", str(repo / "profiles/local/references.yaml"))
    assert p.returncode == 2, p.stdout + p.stderr  # before: REGRESSION, exit 1
    assert one_line(p).endswith(f"rung {spec} was measured under other conditions than the reference holds for: data "
                                "'shards' (new) vs 'synthetic' (reference); not judged (measure a reference under the "
                                "rung's conditions)")
    with h5py.File(f, "r+") as h:  # the reference's own conditions: judged
        h.attrs["data"] = "synthetic"
        h.attrs["items_per_s"] = 508.8
    p = sl("compare", str(f.parents[5]), "--reference", str(repo / "profiles/local/references.yaml"))
    assert p.returncode == 0 and "within reference" in p.stdout
    bare = tmp_path / "bare.yaml"
    bare.write_text(f"rungs:\n  {spec}:\n    items_per_s: [600.0, -0.6, null]\n")
    p = sl("compare", str(f.parents[5]), "--reference", str(bare))
    assert p.returncode == 2 and "a reference must state the conditions it was measured under" in one_line(p)


# -- fault 6: a long rung shows that it is alive ---------------------------------------------------------


@pytest.mark.process
def test_rank_0_prints_progress_lines_at_a_steady_interval(tmp_path: Path) -> None:
    def run(every: str | None) -> list[str]:
        every_arg = ["--progress-s", every] if every else []
        p = subprocess.run([sys.executable, "-m", "scaleladder", "run", "--spec", RUNG, "--steps", "40", "--warmup", "2",
                            "--out", str(tmp_path / "r.h5"), *every_arg], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "\r" not in p.stderr  # a Slurm log keeps every redraw
        return [line for line in p.stderr.splitlines() if line.startswith(f"scaleladder run: {RUNG}: ")]

    lines = run("0.01")  # 40 steps of ~5-250 ms: several lines
    assert lines[0].endswith("building vit-debug (device init) on 1 rank(s), cpu ...")  # before the model exists
    lines = lines[1:]
    assert lines[0].endswith("training 40 steps (2 warm-up) ...")
    assert lines[1].startswith(f"scaleladder run: {RUNG}: step 1/40 after ") and "max RSS" in lines[1]
    steady = [line for line in lines[2:] if " steps/s, ETA " in line]
    done = [int(line.split(": step ")[1].split("/")[0]) for line in steady]
    assert done and done == sorted(set(done)) and done[-1] <= 40, lines
    # the default interval (30 s): a short rung says it builds, starts, took its first step, no more
    assert len(run(None)) == 3


@pytest.mark.process
def test_shard_into_a_log_says_what_it_does_at_a_few_lines_a_minute(tmp_path: Path) -> None:
    p = sl("shard", "--out", str(tmp_path / "s"), "--samples", "64", "--per-shard", "16", "--image-size", "32")
    assert p.returncode == 0 and "\r" not in p.stderr
    lines = p.stderr.splitlines()
    # stderr is a pipe here, as in a job's log: no 2-second lines, the tokenizer phase named
    assert lines[0].startswith("shard: training the tokenizer on 64 captions (") and lines[0].endswith(" MB) ...")
    assert len(lines) == 1 and p.stdout.startswith("wrote 64 samples in 4 shards")  # and the summary


# -- fault 5: a cluster profile says what it is missing before any job --------------------------------


@pytest.mark.process
def test_missing_site_settings_are_said_before_any_job_even_on_a_dry_run(tmp_path: Path) -> None:
    from conftest import snakemake, workflow_copy

    wf = workflow_copy(tmp_path / "wf")
    for name, count in (("frontier", 3), ("a100", 2)):
        out = snakemake(wf, "--profile", f"profiles/{name}", "-n", SCALELADDER_SLURM_ACCOUNT="",
                        SCALELADDER_RCCL_NET_PLUGIN="", SCALELADDER_IMAGE="")
        err = out.stderr
        head = f"scaleladder: profile {name}: {count} required setting(s) missing; every job would fail without them:"
        assert head in err and f"scaleladder doctor --profile {name}" in err, err[-3000:]
        assert "  - SCALELADDER_SLURM_ACCOUNT (the Slurm account the jobs are charged to): not set" in err
    (wf / "img.sif").write_text("")
    out = snakemake(wf, "--profile", "profiles/frontier", "-n", SCALELADDER_SLURM_ACCOUNT="abc123",
                    SCALELADDER_RCCL_NET_PLUGIN="/opt/x/librccl-net.so", SCALELADDER_IMAGE=str(wf / "img.sif"))
    assert "required setting(s) missing" not in out.stderr


# -- the smaller ones ------------------------------------------------------------------------------------


@pytest.mark.process
def test_an_empty_or_garbage_jpeg_is_named_without_a_python_repr(tmp_path: Path) -> None:
    from PIL import Image

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    Image.new("RGB", (40, 40), "red").save(imgs / "b.jpg")
    for name in ("a", "b"):
        (imgs / f"{name}.txt").write_text("a red square\n")
    (imgs / "a.jpg").write_bytes(b"")
    p = sl("shard", "--images", str(imgs), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and one_line(p) == (f"scaleladder shard: error: {imgs / 'a.jpg'}: corrupt or truncated "
                                                 "image (empty file, 0 bytes) (pass --skip-bad to skip such samples)")
    (imgs / "a.jpg").write_bytes(b"GIF89a but not really an image")
    p = sl("shard", "--images", str(imgs), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "cannot identify image file" in one_line(p) and "BytesIO" not in p.stderr


@pytest.mark.process
def test_a_caption_that_is_not_utf8_is_counted_and_said(tmp_path: Path) -> None:
    import json

    from PIL import Image

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for name in ("a", "b"):
        Image.new("RGB", (40, 40), "red").save(imgs / f"{name}.jpg")
    (imgs / "a.txt").write_bytes(b"caf\xe9 au lait\n")  # Latin-1, not UTF-8
    (imgs / "b.txt").write_text("a red square\n")
    p = sl("shard", "--images", str(imgs), "--out", str(tmp_path / "o"), "--quiet")
    assert p.returncode == 0
    assert one_line(p) == ("scaleladder shard: 1 caption(s) were not valid UTF-8; their undecodable bytes were replaced "
                           "with U+FFFD (manifest: stats.captions_not_utf8)")
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["scaleladder"]["stats"]["captions_not_utf8"] == 1


@pytest.mark.process
def test_converge_help_states_its_own_defaults() -> None:
    p = subprocess.run([sys.executable, "-m", "scaleladder", "converge", "--help"], capture_output=True, text=True, timeout=120)
    text = " ".join(p.stdout.split())
    assert p.returncode == 0 and "--warmup WARMUP must be 0 (the default)" in text and "default 100" not in text


# -- fault 1 (and 7's forced rerun): a failed attempt never costs the finished ladder --------------------

ONE_RUNG = "steps: 3\nwarmup: 1\nladders:\n  - models: [vit-debug]\n    strategies: [ddp]\n    batches: [4]\n"
RUNG_FILE = "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.h5"


def planned(out: str) -> set[str]:
    import re

    if "Nothing to be done" in out:
        return set()
    return {m[1] for m in re.finditer(r"^(\w+)\s+\d+$", out[out.index("Job stats:"):], re.M)} - {"total", "job"}


@pytest.mark.process
def test_a_failed_attempt_with_other_settings_never_reruns_a_finished_rung(tmp_path: Path) -> None:
    from conftest import snakemake, workflow_copy

    wf = workflow_copy(tmp_path / "wf")
    (wf / "one.yaml").write_text(ONE_RUNG)
    prof = ("--profile", "profiles/local", "--configfile", "profiles/local/site.yaml", "one.yaml")
    snakemake(wf, RUNG_FILE, *prof)  # the finished "ladder": shards and one rung
    good = (wf / RUNG_FILE).read_bytes()

    # fault 7: a forced rerun that fails (a shard cut short under it) keeps the good result
    tar = next((wf / "results/shards/32px").glob("*.tar"))
    whole = tar.read_bytes()
    os.truncate(tar, 1000)
    out = snakemake(wf, RUNG_FILE, *prof, "--forcerun", RUNG_FILE, check=False)
    log = (wf / "results/logs/rungs/vit-debug/ddp/fp32/pre-lag/n1/b4.log").read_text()
    assert out.returncode != 0 and "shard is 1000 bytes" in log, log
    assert (wf / RUNG_FILE).read_bytes() == good  # before: deleted when the job started
    tar.write_bytes(whole)

    # fault 1: a shard attempt with other settings fails, as it should ...
    bad = wf / "bad-images"
    bad.mkdir()
    (bad / "a.jpg").write_bytes(b"")
    (bad / "a.txt").write_text("an empty picture\n")
    out = snakemake(wf, "results/shards/32px/manifest.json", *prof, "--config", f"data={{images: {bad}}}", check=False)
    assert out.returncode != 0 and (wf / "results/shards/32px/manifest.json").is_file()  # kept: update()
    # ... and with the settings back, the finished rung is not planned again (before: reshard + every rung)
    out = snakemake(wf, RUNG_FILE, *prof, "-n")
    assert "rung" not in planned(out.stdout), out.stdout[-3000:]
    # data changed on purpose is another matter: the shards are rewritten and the rung measured again
    out = snakemake(wf, RUNG_FILE, *prof, "--config", "data={samples: 32}", "-n")
    assert {"shard", "rung"} <= planned(out.stdout), out.stdout[-3000:]


def test_a_value_of_no_allowed_form_names_the_forms() -> None:
    import yaml

    import scaleladder.site.config as site_config

    repo = Path(__file__).resolve().parents[1]
    cfg = {**yaml.safe_load((repo / "config/config.yaml").read_text()), **yaml.safe_load((repo / "profiles/local/site.yaml").read_text())}
    cfg["ladders"][0]["batches"] = ["four"]  # before: "'four' is not valid under any of the given schemas"
    with pytest.raises(site_config.ConfigError, match=r"config key 'ladders\[0\]\.batches\[0\]': 'four' is none of the allowed "
                                                      r"forms: an integer >= 1, or 'max'"):
        site_config.validate_config(cfg, repo / "workflow/schemas/config.schema.yaml")


@pytest.mark.process
def test_every_reader_of_a_ladder_names_an_unreadable_one(tmp_path: Path) -> None:
    garbage = tmp_path / "ladder.h5"
    garbage.write_bytes(b"\0" * 4096)
    for args in (("plots", "--ladder", str(garbage), "--out-dir", str(tmp_path / "plots")),
                 ("report", "--ladder", str(garbage), "--plots", str(tmp_path), "--html", str(tmp_path / "r.html"),
                  "--md", str(tmp_path / "r.md"))):
        p = sl(*args)
        assert p.returncode == 2 and one_line(p) == (f"scaleladder {args[0]}: error: {garbage}: not a readable HDF5 file "
                                                     "(file signature not found)"), p.stderr


@pytest.mark.process
def test_plots_and_report_on_a_full_disk_are_one_line(tmp_path: Path) -> None:
    files = three_rungs(tmp_path)
    assert sl("aggregate", "--out", str(tmp_path / "ladder.h5"), *map(str, files)).returncode == 0
    p = sl("plots", "--ladder", str(tmp_path / "ladder.h5"), "--out-dir", str(tmp_path / "plots"), fsize=4096)
    assert p.returncode == 1 and "cannot write " + str(tmp_path / "plots") in one_line(p) and "EFBIG" in p.stderr
    p = sl("report", "--ladder", str(tmp_path / "ladder.h5"), "--plots", str(tmp_path), "--html",
           str(tmp_path / "r.html"), "--md", str(tmp_path / "r.md"), fsize=2048)
    assert p.returncode == 1 and "cannot write " in one_line(p) and "EFBIG" in p.stderr
    assert litter(tmp_path) == []
