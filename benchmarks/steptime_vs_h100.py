"""The planner's step time against every H100 rung of docs/gpu-check-h100/.

    python benchmarks/steptime_vs_h100.py            # a Markdown table, then the tallies

The calibration (planner/calibration/h100.json) was solved from two rungs of the `full/`
report only: vit-base single b128 (compute) and flava-350m single b16 (the host's
``table_factor``: its 196.2 ms over the host table's row for the same rung). Every other figure
is predicted: the 21 strategy rungs of the `strategies/` report (another run on the same
machine), the 8 max-batch rungs that finished, and the rest of the `full/` report's rows. No
.h5 records were committed; the figures are the reports' (step ms, or batch over items/s for a
max-batch rung). Torch-free.

The H100 ran the tree of b5d4501 (docs/gpu-check-h100/README.md): TorchMultimodal's FLAVA (no
``--flava-impl`` yet) and FSDP1 before its host-work fixes. So the host work comes from the host table
measured on that code (``calibration/host_table_75af641.json``: 75af641 has the same rung/ and
models/ as b5d4501), and FLAVA is predicted as ``torchmultimodal``. ``--table`` names another.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from scaleladder.planner.rates import HostTable, rates
from scaleladder.planner.steptime import predict_step
from scaleladder.spec import RunSpec

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "docs" / "gpu-check-h100"
STRATEGY_ROW = re.compile(r"^\| [\w.-]+ \| `([^`]+)` \| ok \| [^|]+ \| ([\d,.]+) \| ([\d.]+) \|")
MAXBATCH_ROW = re.compile(r"^\| ([\w.-]+) \| ([\w-]+) \| ok \| \d+ \| \d+ \| ≥?(\d+)[^|]* \| \d+ \| ([\d,.]+) \|")
TREE_TABLE = REPO / "src" / "scaleladder" / "planner" / "calibration" / "host_table_75af641.json"
CALIBRATION = {("full", "vit-base/single/bf16-mixed/pre-lag/n1/b128"), ("full", "flava-350m/single/bf16-mixed/pre-lag/n1/b16")}


def measured_rows() -> list[tuple[str, str, float]]:
    """(report, spec path, measured step in s) for every rung that ran."""
    out = []
    for report in ("strategies", "full"):
        for line in (REPORTS / report / "gpu-check.md").read_text().splitlines():
            if m := STRATEGY_ROW.match(line):
                out.append((report, m.group(1), float(m.group(3)) / 1e3))
            elif (m := MAXBATCH_ROW.match(line)) and report == "full":
                batch, ips = int(m.group(3)), float(m.group(4).replace(",", ""))
                knobs = "pf0" if m.group(2).startswith("fsdp2") else "pre-lag"
                out.append(("max batch", f"{m.group(1)}/{m.group(2)}/bf16-mixed/{knobs}/n1/b{batch}", batch / ips))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default=str(TREE_TABLE), help="the host table (default: the H100 run's tree's)")
    ap.add_argument("--under-load", action="store_true",
                    help="the table's rows_under_load instead, the host factor fixed again from their own flava-350m row")
    a = ap.parse_args(argv)
    raw = json.loads(Path(a.table).read_text())
    table = HostTable.from_json({"rows": raw["rows_under_load"] if a.under_load else raw["rows"]}, a.table)
    factor = None
    if a.under_load:  # the same calibration rung, over the same condition's row
        factor = 196.2 / table.rows[("flava-350m", "single", "torchmultimodal")]["host_ms"]
    rows = ["| report | rung | measured (ms) | predicted (ms) | bound | compute / host (ms) | error |", "|---|---|---|---|---|---|---|"]
    tally: dict[str, list[float]] = {}
    for report, path, meas in measured_rows():
        spec = RunSpec.from_path(path)
        r = rates("h100-80gb", spec.precision)
        st = predict_step(spec, 1, 1, int(spec.batch), r if factor is None else replace(r, table_factor=factor),
                          flava_impl="torchmultimodal", table=table)
        err = st.step_time_s / meas - 1
        cal = (report, path) in CALIBRATION
        if not cal:
            tally.setdefault(report, []).append(err)
        rows.append(f"| {report} | `{path}` | {meas * 1e3:.1f} | {st.step_time_s * 1e3:.1f} | {st.bound} | "
                    f"{st.compute_s * 1e3:.1f} / {st.host_s * 1e3:.1f} | {err:+.1%}" + (" (calibration rung)" if cal else "") + " |")
    print("\n".join(rows))
    for report, errs in tally.items():
        ok = sum(abs(e) <= 0.20 for e in errs)
        print(f"\n{report}: {ok} of {len(errs)} within 20%; median |error| {sorted(abs(e) for e in errs)[len(errs) // 2]:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
