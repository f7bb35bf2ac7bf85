"""The planner's step time against DDP, FSDP and HYBRID rungs run on the 2-node CI Slurm (issue 32, 4b).

    python benchmarks/steptime_two_nodes.py --records DIR [--write-calibration FILE]

DIR holds one record per rung, named by its spec path with '/' -> '_' (as
``scaleladder run --out DIR/<path with _>.h5`` under srun wrote them; docs/planner.md, "Two
nodes", has the commands). The compute rate is solved from ONE rung, ``vit-debug-wide/single``
b1 (one rank, no communication): the ceiling stays the datasheet's 0.80 and ``h_half`` is what
makes that rung come back; the host's us per op stays ``calibration/cpu.json``'s. Every other
rung is predicted with the profile's measured links (``profiles/slurm-localhost``) and the
stated ``cpu_factor`` of ranks per core (1 on one node, 2 with 4 ranks on the 2 cores), both
fixed before these rungs ran. Needs h5py to read the records; the model itself is torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import h5py

from scaleladder.files import atomic_file
from scaleladder.planner.rates import OPT_BYTES_PER_PARAM, Rates, datasheet, rates
from scaleladder.planner.steptime import Site, StepTime, flops_per_sample, host_seconds, predict_step, site_from_config
from scaleladder.planner.step_setup import step_setup
from scaleladder.models.flavors import get_flavor
from scaleladder.profiles import load_profile
from scaleladder.spec import RunSpec

REPO = Path(__file__).resolve().parent.parent
MODEL = "vit-debug-wide"
CALIBRATION_RUNG = f"{MODEL}/single/fp32/pre-lag/n1/b1"
RUNGS = [f"{MODEL}/{s}/fp32/pre-lag/n{n}/b1" for s in ("ddp", "fsdp-full", "fsdp-hybrid2") for n in (1, 2)]
RANKS_PER_NODE, CORES = 2, 2
RESOLVE_RUNG = f"{MODEL}/ddp/fp32/pre-lag/n1/b1"


def measured(records: Path, path: str) -> float | None:
    f = records / (path.replace("/", "_") + ".h5")
    if not f.exists():
        return None
    with h5py.File(f, "r") as h:
        return float(h.attrs["step_time_median_s"])


def solve_compute(step_s: float) -> dict[str, float | str]:
    """``h_half`` (ceiling fixed at the datasheet's) that gives the one-rank rung back."""
    spec = RunSpec.from_path(CALIBRATION_RUNG)
    flavor, r = get_flavor(MODEL), rates("cpu", "fp32")
    host, _ = host_seconds(spec, r, site_from_config({}, "none"))
    opt = step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, 1).local.trainable * OPT_BYTES_PER_PARAM / r.hbm_bps
    flops = flops_per_sample(flavor, False, 1).hardware
    rate = flops / (step_s - host - opt)
    ceiling = float(datasheet()["stated_efficiency"]["ceiling"])
    h_half = flavor.hidden * (r.peak_flops * ceiling / rate - 1)
    return {"ceiling": ceiling, "h_half": round(h_half, 1), "from": f"{CALIBRATION_RUNG}: {step_s * 1e3:.1f} ms"}


def _predict(path: str, r: Rates, site: Site) -> StepTime:
    spec = RunSpec.from_path(path)
    world = 1 if spec.strategy.wrapper == "single" else RANKS_PER_NODE * spec.nodes
    return predict_step(spec, world, min(world, RANKS_PER_NODE), 1, r, replace(site, cpu_factor=max(1.0, world / CORES)))


def resolve_on(path: str, step_s: float, r: Rates, site: Site) -> Rates:
    """The second column: ``h_half`` re-solved (bisection) so that ``path`` -- a 2-rank rung, whose
    ranks share the 2 cores as every other rung's do -- comes back."""
    lo, hi = 1.0, 1e9
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if _predict(path, replace(r, h_half=mid), site).step_time_s < step_s else (lo, mid)
    return replace(r, h_half=lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=Path, required=True)
    p.add_argument("--write-calibration", type=Path, help="write the solved calibration here (JSON)")
    args = p.parse_args(argv)
    cal_step = measured(args.records, CALIBRATION_RUNG)
    if cal_step is None:
        print(f"steptime_two_nodes: no record of the calibration rung {CALIBRATION_RUNG} in {args.records}", file=sys.stderr)
        return 2
    base = json.loads((REPO / "src/scaleladder/planner/calibration/cpu.json").read_text())
    cal = {**base, "about": base["about"] + f" Compute (fp32) solved from {CALIBRATION_RUNG} alone by "
           "benchmarks/steptime_two_nodes.py, on the 2-node CI Slurm (docs/planner.md, 'Two nodes').",
           "compute": {"fp32": solve_compute(cal_step)}}
    if args.write_calibration:
        with atomic_file(args.write_calibration) as tmp:
            Path(tmp).write_text(json.dumps(cal, indent=2) + "\n")
    r = rates("cpu", "fp32", cal, "the solved calibration")
    site = site_from_config(load_profile("slurm-localhost", REPO).config, "slurm-localhost")
    print(f"calibration: h_half {cal['compute']['fp32']['h_half']} (ceiling {cal['compute']['fp32']['ceiling']}) "
          f"from {cal['compute']['fp32']['from']}\n")
    r2 = resolve_on(RESOLVE_RUNG, measured(args.records, RESOLVE_RUNG) or cal_step, r, site)
    print(f"re-solved on {RESOLVE_RUNG}: h_half {r2.h_half:.1f}\n")
    print("| rung | ranks (nodes) | measured (ms) | predicted (ms) | error | compute / host / comm / exposed (ms) "
          "| predicted comm share | re-solved on ddp n1 (ms) | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    errs: dict[str, list[float]] = {"one-rank": [], "ddp n1": []}
    for path in [CALIBRATION_RUNG, *RUNGS]:
        st, st2, m = _predict(path, r, site), _predict(path, r2, site), measured(args.records, path)
        world, n = (1 if "/single/" in path else RANKS_PER_NODE * RunSpec.from_path(path).nodes), RunSpec.from_path(path).nodes
        e1 = e2 = ""
        if m is not None:
            e1, e2 = f"{st.step_time_s / m - 1:+.1%}", f"{st2.step_time_s / m - 1:+.1%}"
            if path != CALIBRATION_RUNG:
                errs["one-rank"].append(st.step_time_s / m - 1)
            if path not in (CALIBRATION_RUNG, RESOLVE_RUNG):
                errs["ddp n1"].append(st2.step_time_s / m - 1)
        e1 += " (calibration rung)" if path == CALIBRATION_RUNG else ""
        e2 += " (calibration rung)" if path == RESOLVE_RUNG else ""
        print(f"| `{path}` | {world} ({n}) | {'not run' if m is None else f'{m * 1e3:.1f}'} | {st.step_time_s * 1e3:.1f} | "
              f"{e1} | {st.compute_s * 1e3:.1f} / {st.host_s * 1e3:.1f} / {st.comm_s * 1e3:.1f} / {st.exposed_comm_s * 1e3:.1f} | "
              f"{st.comm_s / st.step_time_s:.0%} | {st2.step_time_s * 1e3:.1f} | {e2} |")
    for k, e in errs.items():
        print(f"\ncalibrated on {k}: {sum(abs(x) <= 0.25 for x in e)} of {len(e)} within 25%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
