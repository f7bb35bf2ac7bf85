"""The step-time model's host table: bench_host's host ms and aten ops per step for
the real flavors' skeletons x the strategy kinds, written as a calibration file.

    python benchmarks/host_table.py --out src/scaleladder/planner/calibration/host_table.json
    python benchmarks/host_table.py --rows fsdp --merge src/scaleladder/planner/calibration/host_table.json
    PYTHONPATH=/tmp/old/src python benchmarks/host_table.py --tree 75af641 --rows h100 --out old.json

Each row is ``benchmarks/bench_host.py``'s measurement of one rung (``measure``: one gloo rank,
one thread, fp32, the training thread's CPU time, ``--repeats`` interleaved runs), on the
flavor's *skeleton* (its depth, token counts, vocabularies and losses; widths 32) at batch 2:
what is left of a step there is host work. ``planner/steptime.py`` reads the table
(``planner/rates.py``, ``HostTable``) and scales a row by the calibration host's factor and the site's
``timing.cpu_factor``. FLAVA rows are measured under every ``--flava-impl`` the tree has.

Row sets (``--rows``, comma-separated): ``eager`` (single, ddp, -ac, -sac, ddp-ac on vit-base,
vit-huge, flava-350m), ``compile`` (single-compile, ddp-compile on the two ViTs), ``singles``
(``single`` on every other real flavor), ``fsdp`` (FSDP1 and FSDP2, with -ac and -compile, on the
three; measured last: other work on FSDP's host overhead lands during the day), ``fsdp-key``
(FSDP1 and FSDP2 alone on the three: a quick re-measure after such work), ``h100``
(the 21 strategy rungs of docs/gpu-check-h100/, for the tree those rungs ran).
``--merge FILE`` replaces those rows in FILE and keeps the rest (each row keeps its own tree).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_host  # noqa: E402

THREE = ("vit-base", "vit-huge", "flava-350m")
VITS = ("vit-base", "vit-huge")
ROWS = {
    "eager": [(m, s) for m in THREE for s in ("single", "ddp", "single-ac", "single-sac", "ddp-ac")],
    "compile": [(m, s) for m in VITS for s in ("single-compile", "ddp-compile")],
    "singles": [(m, "single") for m in ("vit-1b", "vit-3b", "vit-5b", "vit-15b", "flava-900m", "flava-1.8b",
                                         "flava-2.7b", "flava-4.8b", "flava-10b")],
    "fsdp": [(m, s) for m in THREE for s in ("fsdp-full", "fsdp-full-ac", "fsdp2-full", "fsdp2-full-ac")]
            + [(m, s) for m in VITS for s in ("fsdp2-full-compile", "fsdp2-full-ac-compile")],
    "fsdp-key": [(m, s) for m in THREE for s in ("fsdp-full", "fsdp2-full")],  # a quick re-measure after FSDP work
    "h100": [(m, s) for m in THREE for s in ("single", "single-ac", "ddp", "ddp-ac", "fsdp-full", "fsdp-full-ac",
                                              "fsdp2-full")],
}
BATCH = 2


def tree(given: str | None) -> str:
    if given:
        return given
    out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return out.stdout.strip()


def from_records(folders: list[Path], traces: list[Path]) -> list[dict[str, Any]]:
    """bench_host's rows from the records STOPPED runs left in their work folders (each run's
    record is written whole, atomically): host ms per repeat as ``measure`` takes them (the
    untraced steps after the warm-up; a folder's repeat 0 traced one step), the median over every
    folder's repeats; aten ops from a repeat 0's trace where a copy was kept (``traces``: ``measure``
    deletes each trace once counted), else None."""
    import numpy as np

    runs: dict[tuple[str, str, int, str], list[tuple[int, Path]]] = {}
    for folder in folders:
        for rec in sorted(folder.glob("*-r*.h5")):
            head, rep = rec.name.removesuffix(".h5").rsplit("-r", 1)
            rest, impl = head.rsplit("-", 1)
            rest, batch = rest.rsplit("-b", 1)
            model = next(m for m in sorted(bench_host_models(), key=len, reverse=True) if rest.startswith(m + "-"))
            key = (model, rest[len(model) + 1:], int(batch), "" if impl == "default" else impl)
            runs.setdefault(key, []).append((int(rep), rec))
    rows = []
    for (model, strategy, batch, impl), reps in runs.items():
        times = [bench_host.host_ms(rec, 2 if rep == 0 else 1) for rep, rec in reps]
        ops = None
        for t in (d / rec.name.replace(".h5", ".trace.json") for d in traces for rep, rec in reps if rep == 0):
            if t.is_file():
                ops = bench_host.top_level_ops(json.loads(t.read_text())["traceEvents"])[0]
                break
        last = datetime.datetime.fromtimestamp(max(rec.stat().st_mtime for _, rec in reps), datetime.timezone.utc)
        rows.append({"model": model, "strategy": strategy, "batch": batch, "flava_impl": impl, "aten_ops_per_step": ops,
                     "host_ms_per_step": float(np.median(times)), "host_ms_repeats": times,
                     "when": last.strftime("%Y-%m-%d %H:%M UTC")})
    return rows


def bench_host_models() -> list[str]:
    from scaleladder.flavors import FLAVORS

    return [m + bench_host.SKELETON_SUFFIX for m in FLAVORS] + list(FLAVORS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="eager,compile,singles,fsdp", help=f"row sets: {', '.join(ROWS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--tree", default=None, help="the tree's commit, when the package imported is not this checkout's")
    ap.add_argument("--out", default=None, help="write a new table here")
    ap.add_argument("--merge", default=None, help="replace these rows in this table")
    ap.add_argument("--records", nargs="+", default=None, metavar="DIR",
                    help="measure nothing: read the rows from stopped runs' work folders (their records)")
    ap.add_argument("--traces", nargs="+", default=[], metavar="DIR", help="with --records: copies of their traces")
    a = ap.parse_args(argv)
    if bool(a.out) == bool(a.merge):
        raise SystemExit("host_table: give --out or --merge")
    unknown = [r for r in a.rows.split(",") if r not in ROWS]
    if unknown:
        raise SystemExit(f"host_table: unknown row set {unknown[0]!r}; known: {', '.join(ROWS)}")
    rungs = [f"{m}{bench_host.SKELETON_SUFFIX}/{s}/b{BATCH}" for r in a.rows.split(",") for m, s in ROWS[r]]
    import torch

    import torch.distributed.nn.functional  # noqa: F401  (bench_host's TRAP: before any process group)

    load_before = os.getloadavg()
    if a.records:
        rows = from_records([Path(d) for d in a.records], [Path(d) for d in a.traces])
    else:
        torch.set_num_threads(1)
        bench_host.register_skeletons(rungs)
        bench_host.use_clock("cpu")
        with tempfile.TemporaryDirectory(prefix="host_table-") as tmp:
            rows = bench_host.measure(rungs, a.repeats, a.steps, 1, 1, Path(tmp))
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = tree(a.tree)
    # a tree before --flava-impl ran TorchMultimodal's FLAVA: said so in the row
    out_rows = [{"model": r["model"].removesuffix(bench_host.SKELETON_SUFFIX), "strategy": r["strategy"],
                 "flava_impl": r["flava_impl"] or ("torchmultimodal" if r["model"].startswith("flava") else ""), "host_ms": round(r["host_ms_per_step"], 3),
                 "aten_ops": None if r["aten_ops_per_step"] is None else round(r["aten_ops_per_step"], 1), "host_ms_repeats": [round(x, 3) for x in r["host_ms_repeats"]],
                 "tree": commit, "measured": r.get("when", when),
                 "load": None if a.records else [round(x, 1) for x in load_before + os.getloadavg()]}
                for r in rows]
    command = "python benchmarks/host_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.merge:
        table = json.loads(Path(a.merge).read_text())
        keys = {(r["model"], r["strategy"], r["flava_impl"]) for r in out_rows}
        table["rows"] = [r for r in table["rows"] if (r["model"], r["strategy"], r["flava_impl"]) not in keys] + out_rows
        table["commands"] = table.get("commands", []) + [command]
        target = Path(a.merge)
    else:
        table = {
            "about": ("bench_host's host work per step on the flavors' skeletons (widths 32, batch 2; one gloo rank, one "
                      "thread, fp32, the training thread's CPU time; the median of interleaved repeats): what "
                      "planner/steptime.py scales by the calibration host's table_factor and the site's cpu_factor. "
                      "Each row names the tree it was measured on and the load averages (1/5/15 min) before and after."),
            "machine": (f"dev-cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
                        f"{platform.python_version()}, torch {torch.__version__} (CUDA build on the CPU); shared with "
                        "other engineers' jobs (see each row's load)"),
            "torch": torch.__version__,
            "batch": BATCH,
            "commands": [command],
            "rows": out_rows,
        }
        target = Path(a.out)
    table["rows"].sort(key=lambda r: (r["model"], r["strategy"], r["flava_impl"]))
    from scaleladder.files import atomic_write_text

    atomic_write_text(target, json.dumps(table, indent=1) + "\n")
    for r in out_rows:
        print(f"{r['model']}/{r['strategy']} {r['flava_impl'] or '-'}: {r['host_ms']:.2f} ms, {r['aten_ops']} ops, "
              f"{len(r['host_ms_repeats'])} repeat(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
