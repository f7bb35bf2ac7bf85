"""The planner held against torch's own MemTracker / FSDPMemTracker, the full matrix.

    python3 benchmarks/bench_plan_check.py [--out results/plan-check.md]

vit-base and vit-huge × single, single-ac, fsdp2-full, fsdp2-full-ac (FSDP2 on the fake process
group at world 8) × two local batches, bf16-mixed: two runner steps on fake CPU tensors under the
tracker (scaleladder.campaign.plan_check), and the planner's prediction. Prints a markdown table (the
one in docs/planner.md) with the machine and the time each case took. Slow on a small CPU: each
case is a full-size model's step traced op by op (tens of seconds to minutes on dev-cpu); the
suite runs a fast subset (tests/test_plan_check.py). FLAVA is not covered yet (campaign/plan_check.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

from scaleladder.files import atomic_write_text
from scaleladder.markdown import row, rule

MODELS = ("vit-base", "vit-huge")
STRATEGIES = (("single", 1), ("single-ac", 1), ("fsdp2-full", 8), ("fsdp2-full-ac", 8))
BATCHES = {"vit-base": (8, 32), "vit-huge": (4, 16)}
TOLERANCE = 0.05  # tests/test_plan_check.py states why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--out", default="", help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    header = ["rung", "world", "planner (MiB)", "tracker (MiB)", "planned/tracked − 1", "params equal", "optimizer within 0.1%",
              "time (s)"]
    rows = [row(header), rule(len(header))]
    worst = 0.0
    for model in MODELS:
        for strategy, world in STRATEGIES:
            for b in BATCHES[model]:
                knobs = "pf0" if strategy.startswith("fsdp2") else "pre-lag"
                spec = f"{model}/{strategy}/bf16-mixed/{knobs}/n1/b{b}"
                # one process per case: a tracker and its fake process group leave nothing behind
                t0 = time.perf_counter()
                code = ("import json,sys; from scaleladder.campaign.plan_check import measure; from scaleladder.spec import RunSpec; "
                        f"c = measure(RunSpec.from_path({spec!r}), {world}); "
                        "print('CHECK ' + json.dumps({'p': c.planned_peak, 't': c.tracked_peak, 'sp': c.static('params'), "
                        "'so': c.static('optimizer')}))")
                proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
                took = time.perf_counter() - t0
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CHECK ")), None)
                if proc.returncode != 0 or line is None:
                    rows.append(f"| `{spec}` | {world} | error: {(proc.stderr.strip().splitlines() or ['?'])[-1][:120]} | | | | | {took:.0f} |")
                    continue
                import json

                d = json.loads(line[6:])
                err = d["p"] / d["t"] - 1
                worst = max(worst, abs(err))
                rows.append(row([f"`{spec}`", world, f"{d['p'] / 2**20:.1f}", f"{d['t'] / 2**20:.1f}", f"{err:+.1%}",
                                 "yes" if d["sp"][0] == d["sp"][1] else "NO",
                                 "yes" if abs(d["so"][1] - d["so"][0]) <= 1e-3 * d["so"][0] else "NO", f"{took:.0f}"]))
                print(rows[-1], flush=True)
    head = [f"Machine: {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
            f"`python3 benchmarks/bench_plan_check.py`; worst |error| {worst:.1%} (tolerance {TOLERANCE:.0%}).", ""]
    text = "\n".join(head + rows) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
