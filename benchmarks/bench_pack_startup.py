"""What a batch job pays once and what each rung pays again, measured in packs on the 2-node CI Slurm.

    python benchmarks/bench_pack_startup.py --work DIR [--out FILE.json]   (after .ci/slurm-up --nodes 2)

Runs two packs through the real Slurm executor (profiles/slurm-localhost/packs.yaml): its four
1-node rungs in one job, and two 2-node rungs (ddp, fsdp-full) in another; then reads each pack
driver's record (results/logs/packs/<pack>.log, campaign/pack.py) and each rung's record.

* **Once per job**: Slurm's queue (submit -> start, to the second: the allocation), then the job's
  start -> the driver's start (the batch script, the job's own Snakemake reading the workflow,
  Python's imports; on a container site the image's first start falls here too).
* **Again per rung**: its inner Snakemake's wall time less its steady steps (steps x the median
  of its measured step times): the inner Snakemake reading the workflow, srun, the ranks'
  processes and imports, the process group, model and loader, the first batch, what the warm-up
  steps take beyond a steady step, the record's write. Of it, ``startup_s`` (rung/startup.py) is
  the ranks' part from their process start to the first step.

The result prints as a Markdown table and, with ``--out``, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from scaleladder.campaign.pack import last_record

REPO = Path(__file__).resolve().parents[1]
PARTS = ("Snakefile", "workflow", "profiles", "config")
PACKS = ("--profile", "profiles/slurm-localhost", "--configfile", "profiles/slurm-localhost/site.yaml",
         "profiles/slurm-localhost/packs.yaml")
# the 2-node pack: the same ladder on 2 nodes, two of its strategies
TWO_NODES = "ladders=[{name: two nodes, models: [vit-debug], strategies: [ddp, fsdp-full], precisions: [fp32], batches: [4], nodes: [2]}]"


def run_packs(work: Path, extra: tuple[str, ...]) -> Path:
    """A fresh copy of the workflow in ``work``, its packs run to the end."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for part in PARTS:
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy2)(REPO / part, work / part)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.setdefault("SCALELADDER_SLURM_ACCOUNT", "bench")
    snakemake = str(Path(sys.executable).parent / "snakemake")
    subprocess.run([snakemake, *PACKS, *extra], cwd=work, env=env, check=True, capture_output=True, text=True, timeout=1800)
    return work


def rung_row(wf: Path, r: dict) -> dict:
    with h5py.File(wf / r["file"], "r") as f:
        steps, warmup = int(f.attrs["steps"]), int(f.attrs["warmup"])
        times = np.asarray(f["step_time_s"][()], dtype=float)
        startup = float(f.attrs["startup_s"])
    steady = float(np.median(times[warmup:])) if len(times) > warmup else float("nan")
    wall = r["ended"] - r["started"]
    return {"rung": r["file"].removeprefix("results/rungs/").removesuffix(".h5"), "wall_s": wall,
            "steady_steps_s": steps * steady, "rung_overhead_s": wall - steps * steady, "ranks_startup_s": startup}


def measure(work: Path) -> dict:
    out: dict = {"packs": []}
    for name, extra in (("1 node", ()), ("2 nodes", ("--config", TWO_NODES))):
        wf = run_packs(work / name.replace(" ", "-"), extra)
        for log in sorted((wf / "results/logs/packs").glob("*.log")):
            rec: dict = last_record(log.read_text())
            out["packs"].append({
                "placement": name, "pack": rec["pack"], "slurm_job_id": rec["slurm_job_id"],
                "queue_s": rec["job_started"] - rec["job_submitted"],
                "job_once_s": rec["driver_started"] - rec["job_started"],
                "rungs": [rung_row(wf, r) for r in rec["rungs"]],
            })
    return out


def table(result: dict) -> str:
    lines = ["| placement | pack | queue (submit -> start) | job once (start -> driver) | per rung: overhead (median, range) "
             "| of it, the ranks' start-up | rungs |", "|---|---|---|---|---|---|---|"]
    for p in result["packs"]:
        over = [r["rung_overhead_s"] for r in p["rungs"]]
        ranks = [r["ranks_startup_s"] for r in p["rungs"]]
        lines.append(f"| {p['placement']} | {p['pack']} | {p['queue_s']:.0f} s | {p['job_once_s']:.1f} s | "
                     f"{statistics.median(over):.1f} s ({min(over):.1f}-{max(over):.1f}) | {statistics.median(ranks):.1f} s | "
                     f"{len(p['rungs'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=None, help="where the workflow copies run (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="the measurements as JSON")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="pack-startup-"))
    result = measure(work)
    print(table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
