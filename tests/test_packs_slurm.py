"""Packs under a real Slurm (the cluster that .ci/slurm-up starts): four 1-node rungs in one
`sbatch` (profiles/slurm-localhost/packs.yaml), each run by `scaleladder pack` as the rung rule's
own job; a rung killed mid-run, a rung that hangs into the pack's time limit, and the reruns that
redo only what is missing.

The faults are real and come from outside, as on a cluster: a rank SIGKILLed (a node's OOM
killer, a crashed process) and a rank SIGSTOPped (a collective that never returns).

Skipped when no Slurm is up, except under CI=true, where it must run."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from conftest import snakemake, workflow_copy
from scaleladder.campaign.pack import last_record
from scaleladder.results.aggregate import read_ladder
from test_workflow_slurm import PROFILE, slurm  # noqa: F401  (the fixture: skip, or fail under CI=true)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.process]

PACKS = ("--configfile", "profiles/slurm-localhost/site.yaml", "profiles/slurm-localhost/packs.yaml")
SPECS = [f"vit-debug/{s}/fp32/pre-lag/n1/b4" for s in ("ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard")]
FILES = [f"results/rungs/{s}.h5" for s in SPECS]
# --set-resources replaces the profile's whole entry for the rule: the pack's other resources are repeated
PACK_RESOURCES = ("pack:nodes=1", "pack:tasks_per_node=2", "pack:cpus_per_task=1", "pack:mpi='srun'")


def _submitted(out: str, rule: str) -> list[str]:
    """The Slurm job ids the executor submitted for ``rule``'s jobs."""
    return re.findall(rf"submitted with SLURM jobid (\d+) \(log: \S*/rule_{rule}/", out)


def _ranks(spec: str) -> list[int]:
    """The pids of the rung's rank processes (`scaleladder run --spec SPEC`, started by srun's step)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            comm = (d / "comm").read_text().strip()
        except (OSError, ValueError):
            continue
        if comm != "srun" and b"run" in argv and b"--spec" in argv and spec.encode() in argv:
            pids.append(int(d.name))
    return pids


def _fault(spec: str, sig: signal.Signals, after_s: float = 1.0, within_s: float = 600.0) -> dict[str, list[int]]:
    """In the background: as soon as the rung's ranks run, ``sig`` to one of them, ``after_s`` later."""
    hit: dict[str, list[int]] = {"pids": []}

    def watch() -> None:
        end = time.monotonic() + within_s
        while time.monotonic() < end:
            if pids := _ranks(spec):
                time.sleep(after_s)
                os.kill(pids[0], sig)
                hit["pids"] = pids
                return
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    return hit


def _record(wf: Path, pack: str = "n1-p1") -> dict:
    """The pack driver's last record, from its log (written whether or not every rung finished)."""
    return last_record((wf / f"results/logs/packs/{pack}.log").read_text())


def _mtimes(wf: Path) -> dict[str, int]:
    return {f: (wf / f).stat().st_mtime_ns for f in FILES if (wf / f).exists()}


def test_a_pack_of_four_rungs_is_one_sbatch(slurm: None, tmp_path: Path) -> None:  # noqa: F811
    wf = workflow_copy(tmp_path / "wf")
    out = snakemake(wf, *PROFILE, *PACKS, timeout=900)
    log = out.stdout + out.stderr
    assert len(_submitted(log, "pack")) == 1 and not _submitted(log, "rung")
    rungs, _ = read_ladder(str(wf / "results/ladder.h5"))
    assert sorted(r["spec"] for r in rungs) == sorted(SPECS)
    assert all(r["status"] == "ok" and r["launcher"] == "slurm" for r in rungs)
    assert {str(r["slurm_job_id"]) for r in rungs} == set(_submitted(log, "pack"))  # all four in that one job
    rec = _record(wf)
    assert [r["status"] for r in rec["rungs"]] == ["recorded"] * 4
    # the job's own start-up comes before its first rung; each rung ran after the one before
    assert rec["job_started"] <= rec["driver_started"] <= rec["rungs"][0]["started"]
    assert all(a["ended"] <= b["started"] for a, b in zip(rec["rungs"], rec["rungs"][1:]))
    # packing off: the same rungs, finished, are not run again (nor with it on)
    for pack in ("false", "true"):
        assert "Nothing to be done" in snakemake(wf, *PROFILE, *PACKS, "-n", "--config", f"site={{pack: {pack}}}").stdout


def test_a_rung_killed_mid_run_costs_only_itself(slurm: None, tmp_path: Path) -> None:  # noqa: F811
    wf = workflow_copy(tmp_path / "wf")
    hit = _fault(SPECS[1], signal.SIGKILL)
    out = snakemake(wf, *PROFILE, *PACKS, check=False, timeout=900)
    assert hit["pids"], "the second rung's ranks were never seen"
    assert out.returncode != 0
    assert sorted(_mtimes(wf)) == sorted(FILES[:1] + FILES[2:])  # the other three are recorded
    assert [r["status"] for r in _record(wf)["rungs"]] == ["recorded", "failed (exit code 1)", "recorded", "recorded"]
    assert (wf / "results/failed" / f"{SPECS[1]}.h5.json").is_file()  # its failed attempt, noted
    before = _mtimes(wf)
    # the rerun: one pack job again, for that rung alone
    out = snakemake(wf, *PROFILE, *PACKS, timeout=900)
    assert len(_submitted(out.stdout + out.stderr, "pack")) == 1
    assert [(r["file"], r["status"]) for r in _record(wf)["rungs"]] == [(FILES[1], "recorded")]  # its only rung
    after = _mtimes(wf)
    assert sorted(after) == sorted(FILES) and all(after[f] == t for f, t in before.items())


def test_a_pack_cut_by_its_time_limit_keeps_the_earlier_rungs(slurm: None, tmp_path: Path) -> None:  # noqa: F811
    wf = workflow_copy(tmp_path / "wf")
    # the third rung hangs; the pack's job has 2 minutes: the driver stops the hung rung before
    # Slurm's limit, and the fourth has no time left to start
    hit = _fault(SPECS[2], signal.SIGSTOP, after_s=0.5)
    out = snakemake(wf, *PROFILE, *PACKS, "--set-resources", "pack:runtime=2", *PACK_RESOURCES, check=False, timeout=900)
    assert hit["pids"], "the third rung's ranks were never seen"
    assert out.returncode != 0
    assert sorted(_mtimes(wf)) == sorted(FILES[:2])
    status = [r["status"] for r in _record(wf)["rungs"]]
    assert status[:2] == ["recorded", "recorded"]
    assert re.fullmatch(r"stopped 30 s before the allocation ends, after \d+ s", status[2]), status
    assert status[3].startswith("not started: "), status
    notes = json.loads((wf / "results/failed" / f"{SPECS[2]}.h5.json").read_text())
    assert "before the allocation ends" in notes[-1]["reason"] and "in pack n1-p1" in notes[-1]["reason"]
    # nothing but finished results
    assert not [p for p in (wf / "results/rungs").rglob("*") if p.is_file() and not p.name.endswith(".h5")]
    before = _mtimes(wf)
    out = snakemake(wf, *PROFILE, *PACKS, timeout=900)
    after = _mtimes(wf)
    assert sorted(after) == sorted(FILES) and all(after[f] == t for f, t in before.items())
    assert [(r["file"], r["status"]) for r in _record(wf)["rungs"]] == [(f, "recorded") for f in FILES[2:]]
