"""The results side at scale: `aggregate`, `export`, `compare`, `plots` and `report` at N rungs.

Makes N rung files from ONE real rung (a `vit-debug` rung trained here with `scaleladder run`,
its 92 attributes and per-step datasets), each with its own spec (model, strategy, precision,
nodes, batch) and its throughput and step times jittered, so that every file is distinct and
a second ladder differs from the first as a rerun would. Then times each stage as its own
process (`scaleladder <stage> ...`), best of ``--repeats``, with the child's peak RSS
(``getrusage(RUSAGE_CHILDREN)`` of a fresh interpreter per stage) and the HTML report's size.

Not a test: run it by hand and quote the table in docs/performance.md::

    .venv/bin/python benchmarks/bench_results.py --n 2000 10000 [--repeats 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

MODELS = ("vit-debug", "vit-base", "vit-huge", "vit-1b", "vit-3b", "flava-350m", "flava-900m")
STRATEGIES = ("single", "ddp", "fsdp-full", "fsdp-grad-op", "fsdp-hybrid2", "fsdp-full-ac", "fsdp2-full", "fsdp2-full-ac")
PRECISIONS = ("fp32", "bf16-mixed")
NODES = (1, 2, 4, 8)
STAGES = ("aggregate", "export", "compare", "plots", "report")


def specs(n: int) -> list[str]:
    """n distinct, valid spec paths (single only at one node)."""
    out: list[str] = []
    for b in itertools.count(8, 8):
        for m, s, p, nodes in itertools.product(MODELS, STRATEGIES, PRECISIONS, NODES):
            if s == "single" and nodes > 1:
                continue
            knobs = "pf1" if s.startswith("fsdp2") else "pre-lag"
            out.append(f"{m}/{s}/{p}/{knobs}/n{nodes}/b{b}")
            if len(out) == n:
                return out
    raise AssertionError("unreachable")


def real_rung(dest: Path) -> Path:
    """One real rung, trained here (4 s on the 2-core machine)."""
    out = dest / "real.h5"
    subprocess.run([sys.executable, "-m", "scaleladder", "run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4",
                    "--steps", "30", "--warmup", "3", "--out", str(out)], check=True, capture_output=True)
    return out


def make_rungs(real: Path, root: Path, n: int, seed: int) -> list[Path]:
    """n rung files under root/results/rungs/ copied from ``real``, spec and figures changed."""
    from scaleladder.spec import RunSpec

    rng = np.random.default_rng(seed)
    files = []
    for k, path in enumerate(specs(n)):
        spec = RunSpec.from_path(path)
        out = root / "results" / "rungs" / f"{path}.h5"
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real, out)
        with h5py.File(out, "r+") as f:
            for key, v in spec.as_attrs().items():
                f.attrs[key] = v
            if k % 17 == 5:  # some rungs ran out of memory: a result, with fewer attributes
                f.attrs["status"] = "oom"
                continue
            jitter = float(rng.normal(1.0, 0.05))
            for key in ("items_per_s", "samples_per_s", "mfu"):
                if key in f.attrs:
                    f.attrs[key] = float(f.attrs[key]) * jitter
            f["step_time_s"][...] = f["step_time_s"][()] / jitter
            for key in [a for a in f.attrs if a.startswith("items_per_s_ci") or a.startswith("items_per_s_se")]:
                f.attrs[key] = float(f.attrs[key]) * jitter
        files.append(out)
    return files


def timed(argv: list[str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, peak RSS GiB of the child, exit code) of ``scaleladder argv`` run in ``cwd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "scaleladder", *argv], cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if p.returncode:
        print(f"  {' '.join(argv[:1])}: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    # ru_maxrss of RUSAGE_CHILDREN is the largest child so far: a stage smaller than an earlier
    # one shows the earlier one's; each stage therefore runs in its own wrapper process below.
    return wall, max(rss, before) / 2**20, p.returncode


def stage_argv(stage: str, root: Path, other: Path) -> list[str]:
    ladder = str(root / "results" / "ladder.h5")
    return {
        "aggregate": ["aggregate", "--out", ladder, *[str(p) for p in sorted((root / "results" / "rungs").rglob("*.h5"))]],
        "export": ["export", "--ladder", ladder, "--out", str(root / "results" / "rungs.csv")],
        "compare": ["compare", str(other / "results" / "ladder.h5"), ladder, "--table", str(root / "compare.csv")],
        "plots": ["plots", "--ladder", ladder, "--out-dir", str(root / "results" / "plots")],
        "report": ["report", "--ladder", ladder, "--plots", str(root / "results" / "plots"),
                   "--html", str(root / "results" / "report.html"), "--md", str(root / "results" / "report.md")],
    }[stage]


def measure(stage: str, root: Path, other: Path, repeats: int) -> tuple[float, float, int]:
    """Best wall time of ``repeats``, the largest peak RSS, the last exit code; each run in a
    fresh wrapper so that its RSS is its own."""
    best, rss, rc = float("inf"), 0.0, 0
    # the argv goes in on stdin: aggregate's 10,000 paths as one argument would pass the
    # kernel's 128 KiB limit on a single argument (MAX_ARG_STRLEN); as separate arguments they do not
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); from bench_results import timed; from pathlib import Path; "
            "print(json.dumps(timed(json.loads(sys.stdin.read()), Path(sys.argv[2]))))")
    for _ in range(repeats):
        p = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(root)],
                           input=json.dumps(stage_argv(stage, root, other)), capture_output=True, text=True, check=True)
        wall, peak, rc = json.loads(p.stdout.strip().splitlines()[-1])
        best, rss = min(best, wall), max(rss, peak)
    return best, rss, rc


def available(stage: str) -> bool:
    """Whether this checkout has the command (a stage added later is skipped, not failed)."""
    return subprocess.run([sys.executable, "-m", "scaleladder", stage, "--help"], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[2000, 10000])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    ap.add_argument("--keep", type=Path, default=None, help="make the ladders here and keep them (default: a temporary folder)")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-results-"))
    base.mkdir(parents=True, exist_ok=True)
    real = real_rung(base)
    rows = []
    for n in args.n:
        root, other = base / f"n{n}", base / f"n{n}-base"
        for where, seed in ((root, 1), (other, 2)):
            if not (where / "results" / "rungs").is_dir():
                make_rungs(real, where, n, seed)
        if not (other / "results" / "ladder.h5").is_file():
            subprocess.run([sys.executable, "-m", "scaleladder", "aggregate", "--out", str(other / "results" / "ladder.h5"),
                            *[str(p) for p in sorted((other / "results" / "rungs").rglob("*.h5"))]], check=True, capture_output=True)
        for stage in args.stages:
            if not available(stage):
                print(f"{n:>6} {stage:<9} not available (no `scaleladder {stage}` command here)", flush=True)
                continue
            wall, rss, rc = measure(stage, root, other, args.repeats)
            html = root / "results" / "report.html"
            size = f"{html.stat().st_size / 1e3:.0f} KB HTML" if stage == "report" and html.is_file() else ""
            rows.append((n, stage, wall, rss, rc, size))
            print(f"{n:>6} {stage:<9} {wall:7.1f} s  {rss:5.2f} GiB  exit {rc}  {size}", flush=True)
    print(f"\n| rungs | stage | wall (s, best of {args.repeats}) | peak RSS (GiB) | exit | |")
    print("|---|---|---|---|---|---|")
    for n, stage, wall, rss, rc, size in rows:
        print(f"| {n:,} | `{stage}` | {wall:.1f} | {rss:.2f} | {rc} | {size} |")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SCALELADDER_LOG_LEVEL", "warning")
    sys.exit(main())
