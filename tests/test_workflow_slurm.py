"""The workflow under a real Slurm (the one-node localhost cluster that .ci/slurm-up
starts): the same rule code as on Frontier, sbatch per job, srun starting the ranks,
squeue for status; and a rung that Slurm kills at its time limit leaves no output.

Skipped when no Slurm is up, except under CI=true, where it must run."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import snakemake, workflow_copy
from scaleladder.results.aggregate import read_ladder

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.process]

PROFILE = ("--profile", "profiles/slurm-localhost")


def _slurm_state() -> str:
    if not shutil.which("sinfo"):
        return "no sinfo on PATH"
    out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    states = set(out.stdout.split())
    if out.returncode == 0 and states & {"idle", "mixed", "allocated", "completing"}:
        return ""
    return f"sinfo says {out.stdout.strip() or out.stderr.strip() or 'nothing'}"


@pytest.fixture(scope="module")
def slurm() -> None:
    why = _slurm_state()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but no Slurm cluster is up ({why}); .ci/slurm-up starts one")
        pytest.skip(f"no Slurm cluster is up ({why}); run .ci/slurm-up")


@pytest.fixture(scope="module")
def ran(slurm: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    wf = workflow_copy(tmp_path_factory.mktemp("slurm") / "wf")
    snakemake(wf, *PROFILE, timeout=900)
    return wf


def test_debug_ladder_through_the_slurm_executor(ran: Path) -> None:
    rungs, root = read_ladder(str(ran / "results/ladder.h5"))
    assert sorted(r["spec"] for r in rungs) == [
        "vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/fsdp-full/fp32/pre-lag/n1/b4", "vit-debug/fsdp-full/fp32/pre-lag/n1/bmax"]
    for r in rungs:
        assert r["status"] == "ok" and r["world_size"] == 2
        assert str(r["slurm_job_id"]).isdigit()  # it ran inside a Slurm job ...
        assert r["launcher"] == "slurm"  # ... and its ranks came from srun, not torchrun
    assert len({r["slurm_job_id"] for r in rungs}) == 3  # one batch job per rung
    # the max-batch search probed through srun inside its batch job, up to the site's cap
    (mx,) = [r for r in rungs if r["spec"].endswith("/bmax")]
    assert mx["max_batch"] == 4 and int(mx["batch"]) == 4
    for f in ("results/report.html", "results/plots/weak_scaling.png"):
        assert (ran / f).exists()


def test_rung_killed_at_its_time_limit_leaves_nothing(ran: Path) -> None:
    # a rung of a batch the ladder does not have, made long, under a 1-minute limit;
    # --set-resources replaces the profile's whole entry, so the rung's other resources are repeated
    target = "results/rungs/vit-debug/ddp/fp32/pre-lag/n1/b2.h5"
    out = snakemake(ran, target, *PROFILE, "--config", "steps=10000000", "--set-resources", "rung:runtime=1",
                    "rung:nodes=1", "rung:tasks_per_node=2", "rung:cpus_per_task=1", "rung:mpi='srun'",
                    check=False, timeout=600)
    assert out.returncode != 0
    assert "TIMEOUT" in out.stdout + out.stderr
    assert not (ran / target).exists()
    # nothing but finished results: no `<out>.tmp-<pid>` from the store, no OOM marker
    assert not [p for p in (ran / "results/rungs").rglob("*") if p.is_file() and not p.name.endswith(".h5")]
    # the ladder itself is untouched and still complete
    assert "Nothing to be done" in snakemake(ran, *PROFILE, "-n").stdout
