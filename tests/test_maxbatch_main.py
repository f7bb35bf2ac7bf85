"""`scaleladder maxbatch` end to end through the real supervisor, with a fake launcher.

The launcher is a small Python script standing in for ``torchrun ... -m scaleladder``:
``supervise.launch`` runs ``<launcher> run <args>`` in a shell, and the script plays a
device with a memory limit — below it, an ``ok`` record (allocator retries as asked);
above it, what an out-of-memory rank of a multi-rank run leaves behind (a marker with
the runner's error text, exit 3), which the supervisor turns into an ``oom`` record.
So these tests exercise the search seeded by the planner, the probe files, the OOM
classification and the final rung exactly as a GPU run would, minus the GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import h5py
import pytest

from scaleladder.campaign import maxbatch
from scaleladder.cli import main as cli
from scaleladder.site.plan import predict
from scaleladder.spec import RunSpec

pytestmark = pytest.mark.slow  # one process per probe (still run by default and in CI)

FAKE_LAUNCHER = '''
import argparse, json, os, sys
from pathlib import Path
import numpy as np
from scaleladder.spec import RunSpec
from scaleladder.results.store import write_record

# "run --spec ... --out ...": parsed by hand, since importing the runner (torch) per probe is slow
p = argparse.ArgumentParser()
for a in ("--spec", "--out", "--steps", "--warmup", "--data", "--seed", "--lr"):
    p.add_argument(a)
args, _ = p.parse_known_args(sys.argv[2:])
spec, out, steps = RunSpec.from_path(args.spec), Path(args.out), int(args.steps)
if os.environ.get("FAKE_LOG"):  # one line per launch: batch and steps
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(f"{spec.batch} {steps}\\n")
world, rpn = int(os.environ["FAKE_WORLD"]), int(os.environ["FAKE_RPN"])
limit = int(os.environ["FAKE_LIMIT"])
if spec.batch > limit:
    # rank 1 of the world hits the limit inside cuBLAS (not torch's OutOfMemoryError): the runner
    # leaves its marker (rung.run.oom_marker's name) and exits 3 (rung.run.EXIT_OOM)
    error = "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    out.with_name(f"{out.name}.oom-rank1.json").write_text(json.dumps({"rank": 1, "world": world, "step": 0, "error": error}))
    sys.exit(3)
# allocator retries: FAKE_RETRIES=<steps>:<n> gives n retries to runs of that many steps at the limit
steps_with, _, n = os.environ.get("FAKE_RETRIES", "0:0").partition(":")
retries = int(n) if steps == int(steps_with) and spec.batch == limit else 0
write_record(out, {"status": "ok", **spec.as_attrs(), "steps": steps, "warmup": int(args.warmup), "data": args.data,
                   "world_size": world, "ranks_per_node": rpn, "alloc_retries": retries,
                   "peak_active_gib": spec.batch / limit * 30.0}, {"loss": np.zeros(steps)})
'''


@pytest.fixture
def launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    script = tmp_path / "fake_launcher.py"
    script.write_text(FAKE_LAUNCHER)

    def make(limit: int, world: int = 8, rpn: int = 8, **env: str) -> str:
        monkeypatch.setenv("FAKE_LIMIT", str(limit))
        monkeypatch.setenv("FAKE_WORLD", str(world))
        monkeypatch.setenv("FAKE_RPN", str(rpn))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return f"{sys.executable} {script}"

    return make


def _run(tmp_path: Path, spec: str, launcher: str, *extra: str) -> int:
    return cli(["maxbatch", "--spec", spec, "--steps", "3", "--warmup", "1", "--probe-steps", "2", "--probe-warmup", "1",
                "--out", str(tmp_path / "out" / "r.h5"), "--launcher", launcher, *extra])


def _attrs(tmp_path: Path) -> dict[str, Any]:
    with h5py.File(tmp_path / "out" / "r.h5") as f:
        a = dict(f.attrs)
        a["probes"] = list(f["maxbatch/probes/batch"][:]) if "maxbatch" in f else []
        a["statuses"] = list(f["maxbatch/probes/status"].asstr()[:]) if "maxbatch" in f else []
        a["reasons"] = list(f["maxbatch/probes/reason"].asstr()[:]) if "maxbatch" in f else []
    return a


SPEC = "vit-1b/ddp/bf16-mixed/pre-lag/n1/bmax"


@pytest.mark.process
def test_the_search_starts_at_the_planners_max_batch(tmp_path: Path, launcher: Any) -> None:
    planned = predict(RunSpec.from_path(SPEC), 8, 8, "a100-40gb").max_batch
    assert planned is not None and planned > 8
    limit = planned + 5  # the real device holds a little more than predicted
    assert _run(tmp_path, SPEC, launcher(limit), "--plan-device", "a100-40gb", "--ranks-per-node", "8") == 0
    a = _attrs(tmp_path)
    assert a["maxbatch_planned"] == planned and a["maxbatch_start"] == planned
    assert a["probes"][0] == planned and a["probes"][1] == 2 * planned  # start at the prediction, then double
    assert a["max_batch"] == limit and a["batch"] == str(limit) and a["status"] == "ok"
    assert len(a["probes"]) <= 2 + planned.bit_length()  # bisection from there, not from 1
    # the cuBLAS allocation failure above the limit counted as out of memory, not as a crash
    assert set(a["statuses"]) == {"ok", "oom"} and any("CUBLAS_STATUS_ALLOC_FAILED" in r for r in a["reasons"])


@pytest.mark.process
def test_the_planner_sees_the_runs_data_mode(tmp_path: Path, launcher: Any) -> None:
    # With a shard loader one input batch sits on the device instead of the synthetic pool:
    # the planned start is the planner's for that mode.
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")  # the fake launcher never reads it
    spec = "vit-base/ddp/bf16-mixed/pre-lag/n1/bmax"
    planned = {d: predict(RunSpec.from_path(spec), 8, 8, "a100-40gb", data=d).max_batch for d in ("synthetic", str(manifest))}
    assert planned[str(manifest)] != planned["synthetic"]
    assert _run(tmp_path, spec, launcher(10**6), "--plan-device", "a100-40gb", "--ranks-per-node", "8",
                "--data", str(manifest), "--max-batch-cap", str(planned[str(manifest)])) == 0
    a = _attrs(tmp_path)
    assert a["maxbatch_planned"] == planned[str(manifest)] and a["probes"] == [planned[str(manifest)]]


def test_plan_device_without_ranks_per_node_is_refused(tmp_path: Path, launcher: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, SPEC, launcher(8), "--plan-device", "a100-40gb") == 2
    err = capsys.readouterr().err.strip()
    assert "--ranks-per-node" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.process
def test_keep_probes_keeps_every_probe_including_the_winner(tmp_path: Path, launcher: Any) -> None:
    # Probes that ran the rung's own steps make the winning probe the rung: it used to be deleted.
    out = tmp_path / "out" / "r.h5"
    rc = cli(["maxbatch", "--spec", "vit-debug/single/fp32/pre-lag/n1/bmax", "--steps", "2", "--warmup", "1",
              "--probe-steps", "2", "--probe-warmup", "1", "--out", str(out), "--launcher", launcher(6, world=1, rpn=1),
              "--keep-probes"])
    assert rc == 0
    kept = maxbatch.probe_dir(out)
    assert kept == out.parent / ".r.h5.maxbatch"  # where --help says they are
    assert sorted(p.name for p in kept.iterdir()) == [f"probe-b{b}.h5" for b in sorted([1, 2, 4, 8, 6, 7])]
    assert h5py.File(out).attrs["max_batch"] == 6


@pytest.mark.process
def test_keep_probes_removes_only_the_rungs_temporary_file(tmp_path: Path, launcher: Any) -> None:
    assert _run(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", launcher(3, world=1, rpn=1), "--keep-probes") == 0
    kept = maxbatch.probe_dir(tmp_path / "out" / "r.h5")
    assert sorted(p.name for p in kept.iterdir()) == ["probe-b1.h5", "probe-b2.h5", "probe-b3.h5", "probe-b4.h5"]
    assert _attrs(tmp_path)["max_batch"] == 3


def test_help_says_where_kept_probes_go(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli(["maxbatch", "--help"])
    assert ".<name of --out>.maxbatch/" in " ".join(capsys.readouterr().out.split())


@pytest.mark.process
def test_a_full_rung_over_the_retry_threshold_is_recorded_as_such(tmp_path: Path, launcher: Any) -> None:
    # The 2-step probes at the limit stay clean; the 3-step rung at the found batch retries twice.
    assert _run(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", launcher(5, world=1, rpn=1, FAKE_RETRIES="3:2")) == 0
    a = _attrs(tmp_path)
    assert a["max_batch"] == 5 and a["status"] == "ok" and a["maxbatch_final_retries"] == 2
    assert "2 allocator retries" in a["maxbatch_note"] and "threshold 0" in a["maxbatch_note"]
    # within the threshold there is no note, and the count is still there
    assert _run(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", launcher(5, world=1, rpn=1, FAKE_RETRIES="3:2"),
                "--max-retries", "2") == 0
    a = _attrs(tmp_path)
    assert a["maxbatch_final_retries"] == 2 and "maxbatch_note" not in a


@pytest.mark.process
@pytest.mark.parametrize("error,status", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    ("HIP error: out of memory", "oom"),
    ("Cuda failure 2 'out of memory'", "oom"),  # NCCL's own OOM, the line the runner records (rung.loop.oom_line)
    ("HIP failure 'out of memory'", "oom"),  # RCCL's
    ("NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)", "error"),
    ("Segmentation fault", "error"),
])
def test_probe_records_are_classified_by_the_runners_rule(tmp_path: Path, error: str, status: str) -> None:
    from scaleladder.results.store import write_record

    write_record(tmp_path / "p.h5", {"status": "failed", "error": error})
    assert maxbatch.read_probe(tmp_path / "p.h5", 8, 1.0).status == status


@pytest.mark.process
def test_an_oom_search_record_says_the_world_the_probes_ran_on(tmp_path: Path, launcher: Any) -> None:
    # No planner, so no --ranks-per-node: the world comes from the probes' own records.
    assert _run(tmp_path, SPEC, launcher(0, world=8, rpn=8)) == 0
    a = _attrs(tmp_path)
    assert a["status"] == "oom" and a["max_batch"] == 0 and a["world_size"] == 8 and a["probes"] == [1]


@pytest.mark.process
def test_at_the_cap_the_probe_is_the_rung_and_no_launch_repeats_it(tmp_path: Path, launcher: Any) -> None:
    """A pass at --max-batch-cap ends the search, so that probe runs the rung's own
    steps (3 here, probes 2) and becomes the record: 3 launches, not 4."""
    log = tmp_path / "launches.txt"
    assert _run(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", launcher(100, world=1, rpn=1, FAKE_LOG=str(log)),
                "--max-batch-cap", "4") == 0
    assert log.read_text().split("\n")[:-1] == ["1 2", "2 2", "4 3"]
    a = _attrs(tmp_path)
    assert a["max_batch"] == 4 and a["steps"] == 3 and a["probes"] == [1, 2, 4] and a["maxbatch_capped"]
    # below the cap nothing changed: the short probes, then the rung at the found batch
    log.unlink()
    assert _run(tmp_path, "vit-debug/single/fp32/pre-lag/n1/bmax", launcher(3, world=1, rpn=1, FAKE_LOG=str(log)),
                "--max-batch-cap", "8") == 0
    assert log.read_text().split("\n")[:-1] == ["1 2", "2 2", "4 2", "3 2", "3 3"]
