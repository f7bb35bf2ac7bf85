"""The planner's step time against DDP, FSDP and HYBRID rungs run on the 2-node CI Slurm.

    python benchmarks/steptime_two_nodes.py --bench DIR --records DIR [--write-calibration FILE] [--links-yaml]

Everything the prediction uses is fixed BEFORE the multi-rank rungs run:

* the links, per collective, from ``benchmarks/bench_comm.py``'s files in ``--bench``:
  ``intra.json`` (``srun -N1 -n2``: two ranks in one node) gives ``intra_node``; ``four.json``
  (``srun -N2 -n4``: the 2-node rungs' placement, 2 ranks per node) gives ``inter_node`` (the
  node's figure: the fitted per-rank bandwidth x the node's 2 ranks, which ``comm.py`` shares
  out again); the median of each size, since a rung's step is a median under the same load,
  refitted here with bench_comm's ``figures`` (alpha up to 64 KiB, beta from 16 MiB);
  ``backend: gloo`` (a reduce-scatter is an all-reduce; ``comm.py``). ``--links-yaml`` prints
  them as ``profiles/slurm-localhost/site.yaml``'s ``timing.links`` reads;
* the overlap: ``intra.json``'s measured ``--overlap`` (0 when the two add up);
* the compute rate from ONE rung, ``vit-debug-wide/single`` b1 (one rank, no communication,
  in ``--records``): the ceiling stays the stated 0.80 (rates.STATED_CEILING) and ``h_half`` is what makes that
  rung come back; the host's us per op stays ``calibration/cpu.json``'s (``--cpu-calibration``);
* the CPU share: how much slower a rank computes when all the ranks of a placement compute at
  once than one rank alone, as bench_comm measured it (``contention.factor``: ``intra.json`` for
  the 2-rank rungs, ``four.json`` for the 4-rank ones), applied to a rank's host work AND its
  compute (a CPU rank computes on the shared cores; under the other engineers' load the factor is
  nearer 1 than ranks / cores); the links measured under their rungs' placement already carry it.

Then the six rungs (``ddp``, ``fsdp-full``, ``fsdp-hybrid2`` at 1 and 2 nodes, b1) in
``--records`` are read and compared. A rung not yet run is predicted and marked "not run"
(the table printed before the rungs run is the prediction). Needs h5py to read the records.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from scaleladder.files import atomic_file
from scaleladder.flavors import get_flavor
from scaleladder.planner.comm import COLLECTIVES, links_from_profile
from scaleladder.errors import SpecError
from scaleladder.planner.rates import OPT_BYTES_PER_PARAM, STATED_CEILING, Rates, check_calibration, rates, read_calibration
from scaleladder.planner.step_setup import step_setup
from scaleladder.planner.steptime import Site, StepTime, flops_per_sample, host_seconds, predict_step, site_from_config
from scaleladder.spec import RunSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_comm import figures  # noqa: E402  (one fit for the bench and this table)
MODEL = "vit-debug-wide"
CALIBRATION_RUNG = f"{MODEL}/single/fp32/pre-lag/n1/b1"
RUNGS = [f"{MODEL}/{s}/fp32/pre-lag/n{n}/b1" for s in ("ddp", "fsdp-full", "fsdp-hybrid2") for n in (1, 2)]
RANKS_PER_NODE, CORES = 2, 2  # CORES: the VM's, named in the sources


def measured(records: Path, path: str) -> float | None:
    import h5py

    f = records / (path.replace("/", "_") + ".h5")
    if not f.exists():
        return None
    with h5py.File(f, "r") as h:
        return float(h.attrs["step_time_median_s"])


def links_block(bench: Path) -> dict[str, Any]:
    """``timing.links`` from bench_comm's files (the module docstring)."""
    def link(name: str, node_ranks: int) -> dict[str, Any]:
        b = json.loads((bench / name).read_text())
        fit = {c: figures(c, int(b["ranks"]), b["sizes_bytes"], b["median_s"][c]) for c in COLLECTIVES}
        one = {c: {"alpha_us": fit[c]["alpha_us"], "gbps": round(fit[c]["gbps"] * node_ranks, 4)} for c in COLLECTIVES}
        return {**one["all_reduce"], **{c: one[c] for c in ("all_gather", "reduce_scatter")}}

    return {"backend": "gloo", "intra_node": link("intra.json", 1), "inter_node": link("four.json", RANKS_PER_NODE)}


def solve_compute(step_s: float, base: dict[str, Any]) -> dict[str, float | str]:
    """``h_half`` (ceiling fixed at the stated one) that gives the one-rank rung back, with ``base``'s host figure."""
    spec = RunSpec.from_path(CALIBRATION_RUNG)
    flavor, r = get_flavor(MODEL), rates("cpu", "fp32", base, "--cpu-calibration")
    host, _ = host_seconds(spec, r, Site())
    opt = step_setup(spec.model, spec.strategy, spec.precision, spec.knobs, 1).local.trainable * OPT_BYTES_PER_PARAM / r.hbm_bps
    rate = flops_per_sample(flavor, False, 1).hardware / (step_s - host - opt)
    ceiling = STATED_CEILING
    h_half = flavor.hidden * (r.peak_flops * ceiling / rate - 1)
    return {"ceiling": ceiling, "h_half": round(h_half, 1), "from": f"{CALIBRATION_RUNG}: {step_s * 1e3:.1f} ms"}


def shares(bench: Path) -> dict[int, float]:
    """Ranks of a placement -> how much slower each computes (the module docstring)."""
    out = {1: 1.0}
    for name in ("intra.json", "four.json"):
        b = json.loads((bench / name).read_text())
        out[int(b["ranks"])] = max(1.0, float(b["contention"]["factor"]))
    return out


def predict(path: str, r: Rates, site: Site, share: dict[int, float]) -> StepTime:
    spec = RunSpec.from_path(path)
    world = 1 if spec.strategy.wrapper == "single" else RANKS_PER_NODE * spec.nodes
    k = share[world]  # the host work and the compute both slow by it
    return predict_step(spec, world, min(world, RANKS_PER_NODE), 1, replace(r, peak_flops=r.peak_flops / k),
                        replace(site, cpu_factor=k, cpu_source=f"{world} ranks on {CORES} shared cores, measured"))


def main(argv: list[str] | None = None) -> int:
    """Long because it is the whole of part (b)'s procedure in order: links, calibration, table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", type=Path, required=True, help="bench_comm's intra.json and four.json")
    p.add_argument("--records", type=Path, required=True)
    p.add_argument("--write-calibration", type=Path, help="write the solved calibration here (JSON)")
    p.add_argument("--links-yaml", action="store_true", help="print the links as site.yaml's timing.links")
    p.add_argument("--cpu-calibration", type=Path, default=REPO / "src/scaleladder/planner/calibration/cpu.json",
                   help="the calibration whose host us_per_op the prediction keeps (default: the package's cpu.json; "
                   "a committed round's own: `git show COMMIT:src/scaleladder/planner/calibration/cpu.json`)")
    args = p.parse_args(argv)
    try:  # first, so a wrong file is one line before any record is read
        base = read_calibration(args.cpu_calibration)
        check_calibration(base, "cpu", None, str(args.cpu_calibration))
    except SpecError as e:
        print(f"steptime_two_nodes: --cpu-calibration: {e}", file=sys.stderr)
        return 2
    cal_step = measured(args.records, CALIBRATION_RUNG)
    if cal_step is None:
        print(f"steptime_two_nodes: no record of the calibration rung {CALIBRATION_RUNG} in {args.records}", file=sys.stderr)
        return 2
    block, share = links_block(args.bench), shares(args.bench)
    intra = json.loads((args.bench / "intra.json").read_text())
    ov = max(0.0, min(1.0, float(intra["overlap"]["overlap"])))
    cal = {**base, "about": base["about"] + f" Compute (fp32) solved from {CALIBRATION_RUNG} alone by "
           "benchmarks/steptime_two_nodes.py, on the 2-node CI Slurm (docs/planner.md, 'Two nodes').",
           "compute": {"fp32": solve_compute(cal_step, base)},
           "overlap": round(ov, 2),
           "overlap_from": "benchmarks/bench_comm.py --overlap, 2 ranks in one node ({}): compute alone {:.0f} ms, an async "
           "16 MiB all-reduce alone {:.0f} ms, both at once {:.0f} ms (medians); overlap median {} (quartiles {})".format(
               "load average " + str(intra["load_average"][0]), intra["overlap"]["compute_s"] * 1e3,
               intra["overlap"]["comm_s"] * 1e3, intra["overlap"]["both_s"] * 1e3, intra["overlap"]["overlap"],
               intra["overlap"].get("overlap_quartiles"))}
    if args.write_calibration:
        with atomic_file(args.write_calibration) as tmp:
            Path(tmp).write_text(json.dumps(cal, indent=2) + "\n")
    if args.links_yaml:
        import yaml

        print(yaml.safe_dump({"timing": {"links": block}}, sort_keys=False, default_flow_style=None))
    r = rates("cpu", "fp32", cal, "the solved calibration")
    links, _ = links_from_profile(block, "timing.links")
    site = replace(site_from_config({}, "bench"), links=links)
    profile = site_from_config(__import__("scaleladder.site.profiles", fromlist=["x"]).load_profile("slurm-localhost", REPO).config,
                               "slurm-localhost")
    if profile.links != links:
        print("NOTE: profiles/slurm-localhost's timing.links differ from these bench files (--links-yaml prints them)\n")
    print(f"calibration: h_half {cal['compute']['fp32']['h_half']} (ceiling {cal['compute']['fp32']['ceiling']}) "
          f"from {cal['compute']['fp32']['from']};\noverlap {cal['overlap']} ({cal['overlap_from']});\nCPU share "
          f"(ranks: factor) {share}\n")
    print("| rung | ranks (nodes) | measured (ms) | predicted (ms) | error | compute / host / comm / exposed (ms) "
          "| predicted comm share |")
    print("|---|---|---|---|---|---|---|")
    errs = []
    for path in [CALIBRATION_RUNG, *RUNGS]:
        st, m = predict(path, r, site, share), measured(args.records, path)
        spec = RunSpec.from_path(path)
        world = 1 if spec.strategy.wrapper == "single" else RANKS_PER_NODE * spec.nodes
        e = "" if m is None else f"{st.step_time_s / m - 1:+.1%}"
        if m is not None and path != CALIBRATION_RUNG:
            errs.append(st.step_time_s / m - 1)
        print(f"| `{path}` | {world} ({spec.nodes}) | {'not run' if m is None else f'{m * 1e3:.1f}'} | "
              f"{st.step_time_s * 1e3:.1f} | {e}{' (calibration rung)' if path == CALIBRATION_RUNG else ''} | "
              f"{st.compute_s * 1e3:.1f} / {st.host_s * 1e3:.1f} / {st.comm_s * 1e3:.1f} / {st.exposed_comm_s * 1e3:.1f} | "
              f"{st.comm_s / st.step_time_s:.0%} |")
    print(f"\n{sum(abs(x) <= 0.25 for x in errs)} of {len(errs)} multi-rank rungs within 25%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
