"""Host work per step, on the CPU: how much Python, dispatcher, autograd and
wrapper-hook work one training step of a rung costs, whatever the GPU would do.

Per rung it reports three figures, each from the rung's own run (`scaleladder run` called
in this process, on one gloo rank, one thread):

- **aten ops/step**: top-level ``aten::`` ops in the rung's ``--trace-steps`` trace (an
  aten op inside another aten op is not counted again), divided by the traced steps;
- **syncs/step**: the ops of that trace that would make a GPU step wait for the device,
  :data:`SYNC_OPS` (``aten::_local_scalar_dense`` is what ``.item()``, ``bool(t)``,
  ``float(t)`` and ``aten::is_nonzero`` end in; ``aten::nonzero`` is what boolean-mask
  indexing calls; ``masked_select`` and ``unique`` size their output from the data), one
  count per outermost such op;
- **host ms/step**: the median step time of the rung's UNTRACED measured steps (on the CPU
  the step is all host work), then the median over ``--repeats`` runs of every rung,
  interleaved (A, B, A, B, ...) in one process so that drift and the neighbours' load hit
  every rung alike. The traced steps carry the profiler's overhead and are left out. The
  step's clock is the training thread's CPU time (``--clock cpu``, the default: the loop's
  ``perf_counter`` replaced by ``time.thread_time`` in this process), so that on a shared
  machine the time the thread waited for a core is not counted; ``--clock wall`` keeps the
  loop's own clock. With one torch thread every op runs on the training thread (CPU
  autograd included), so its CPU time is the step's host work.

Rungs: the debug flavors, and a *skeleton* of each real flavor (:func:`skeleton`: the
flavor's depth, token counts, text length, vocabularies, codebook and losses; widths
shrunk to 32), so that what remains of a step is host work.

    python benchmarks/bench_host.py                       # the table in docs/performance.md
    python benchmarks/bench_host.py --quick --json h.json # seconds: what tests/test_bench.py runs
    python benchmarks/bench_host.py --rungs vit-debug/single/b4,vit-debug/fsdp-full/b4 --repeats 7
    python benchmarks/bench_host.py --units 1,2,3,4,6 --repeats 5 \
        --rungs vit-base-skeleton/single/b2,vit-base-skeleton/fsdp2-full/b2   # host work against k

A rung is ``model/strategy/b<batch>`` at the strategy's default knobs, or
``model/strategy/<knobs>/b<batch>`` (``vit-base-skeleton/fsdp2-full/pf0-u4/b2``: units of 4
blocks). ``--units K,...`` runs each FSDP2 rung at every unit size k (knobs ``pf0-u<k>``; k = 1 is
the rung as it is); FSDP1 cannot group blocks (spec.FSDP1_UNIT_REFUSAL), so its rungs run as given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

#: ops that would sync a GPU step with the host (see the module docstring)
SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
})
# TRAP: the CPU kernels of the fused optimizers read each parameter's step count with
# ``.item()`` (one aten::_local_scalar_dense per parameter); the CUDA kernels read it on
# the device. Syncs inside them are the CPU's, not the rung's, and are not counted.
CPU_ONLY_SYNC_PARENTS = frozenset({"aten::_fused_adamw_", "aten::_fused_adam_", "aten::_fused_sgd_"})
SKELETON_WIDTH = 32
SKELETON_SUFFIX = "-skeleton"
STRATEGIES = ("single", "ddp", "fsdp-full", "fsdp2-full", "single-ac", "single-compile")
REAL = ("vit-base", "vit-huge", "flava-350m")  # gpu-check's host section's models
# The default table: every strategy on the debug flavors at b4 (the targets), the
# skeletons of gpu-check's models at b2 (their token counts are the real ones: a larger
# batch adds compute, not host work). --all adds every real flavor's skeleton.
DEFAULT_RUNGS = tuple(
    [f"vit-debug/{s}/b4" for s in STRATEGIES]
    + [f"flava-debug/{s}/b4" for s in STRATEGIES if s != "single-compile"]
    + [f"{m}{SKELETON_SUFFIX}/{s}/b2" for m in REAL for s in ("single", "fsdp-full", "fsdp2-full")]
)
QUICK_RUNGS = ("vit-debug/single/b4", "vit-debug/fsdp-full/b4")


def skeleton(name: str) -> Any:
    """The flavor ``name`` with its widths shrunk to :data:`SKELETON_WIDTH`: same depth,
    image and patch (so the same tokens), text length, vocabularies, codebook size and
    losses; hidden 32, MLP 128, 2 heads, a DALL-E encoder of width 8."""
    from scaleladder.flavors import get_flavor

    real = get_flavor(name)
    return dataclasses.replace(real, name=name + SKELETON_SUFFIX, hidden=SKELETON_WIDTH, mlp=4 * SKELETON_WIDTH, heads=2,
                               codebook_hidden=8, seed_params_m=None, seed_size_gib=None, debug=True)


def register_skeletons(rungs: list[str]) -> None:
    """Makes the skeletons the rungs name known to this process's flavor registry (only here:
    `scaleladder models` and the planner never see them)."""
    from scaleladder.flavors import FLAVORS, register

    for r in rungs:
        model = r.split("/")[0]
        if model.endswith(SKELETON_SUFFIX) and model not in FLAVORS:
            register(skeleton(model.removesuffix(SKELETON_SUFFIX)))


def parse_rung(text: str) -> tuple[str, str, int]:
    """``model/strategy[/<knobs>]/b<batch>`` -> (model, strategy, batch), the knobs kept in the
    strategy as ``strategy:knobs`` (:func:`split_knobs`); a bad one: one line, exit 2."""
    parts = text.strip().split("/")
    if len(parts) not in (3, 4) or not parts[-1].startswith("b") or not parts[-1][1:].isdigit():
        raise SystemExit(f"bench_host: rung {text!r} is not model/strategy[/knobs]/b<batch>")
    strategy = parts[1] + (f":{parts[2]}" if len(parts) == 4 else "")
    return parts[0], strategy, int(parts[-1][1:])


def split_knobs(strategy: str) -> tuple[str, str]:
    """``strategy[:knobs]`` -> (strategy, knobs); "" for the strategy's default knobs."""
    name, _, knobs = strategy.partition(":")
    return name, knobs


def with_units(rungs: list[str], units: list[int]) -> list[str]:
    """Each FSDP2 rung at every unit size in ``units`` (knobs ``pf<n>-u<k>``, its prefetch kept),
    right after it; every other rung once. k = 1 is the rung as given."""
    from scaleladder.spec import Fsdp2Knobs, parse_knobs, parse_strategy

    out: list[str] = []
    for r in rungs:
        model, strategy, batch = parse_rung(r)
        name, knobs = split_knobs(strategy)
        if not parse_strategy(name).is_fsdp2:
            out.append(r)
            continue
        pf = parse_knobs(knobs).prefetch_layers if knobs else 0  # type: ignore[union-attr]
        for k in units:
            out.append(r if k == 1 else f"{model}/{name}/{Fsdp2Knobs(pf, k)}/b{batch}")
    return out


def flava_impls() -> list[str]:
    """The FLAVA implementations `scaleladder run --flava-impl` takes ([""]: no such option yet)."""
    from scaleladder.rung.run_config import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    for action in p._actions:
        if "--flava-impl" in action.option_strings:
            return list(action.choices or [])
    return [""]


def top_level_ops(events: list[dict[str, Any]]) -> tuple[int, int]:
    """(top-level aten ops, outermost sync ops) in a Chrome trace's CPU op events."""
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: (e.get("tid"), e["ts"], -e.get("dur", 0)))
    aten, syncs = 0, 0
    open_aten: dict[Any, float] = {}  # tid -> end of the outermost aten op open there
    open_sync: dict[Any, float] = {}
    open_cpu_only: dict[Any, float] = {}
    for e in ops:
        name, tid, ts, end = e["name"], e.get("tid"), e["ts"], e["ts"] + e.get("dur", 0)
        if name.startswith("aten::") and ts >= open_aten.get(tid, -1.0):
            aten += 1
            open_aten[tid] = end
        if name in CPU_ONLY_SYNC_PARENTS:
            open_cpu_only[tid] = max(end, open_cpu_only.get(tid, -1.0))
        if name in SYNC_OPS and ts >= open_sync.get(tid, -1.0) and ts >= open_cpu_only.get(tid, -1.0):
            syncs += 1
            open_sync[tid] = end
    return aten, syncs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def use_clock(clock: str) -> None:
    """The timed loop's step clock in this process: the thread's CPU time, or wall time."""
    import time
    import types

    from scaleladder.rung import loop

    loop.time = types.SimpleNamespace(perf_counter=time.thread_time if clock == "cpu" else time.perf_counter)  # type: ignore[assignment]


def run_rung(model: str, strategy: str, batch: int, impl: str, out: Path, steps: int, warmup: int, trace: int) -> Path:
    """One `scaleladder run` of the rung in this process, one gloo rank on the CPU."""
    from scaleladder.rung import run

    p = argparse.ArgumentParser()
    run.add_arguments(p)
    strategy, knobs = split_knobs(strategy)
    argv = ["--model", model, "--strategy", strategy, "--precision", "fp32", "--batch", str(batch),
            "--steps", str(steps), "--warmup", str(warmup), "--device", "cpu", "--out", str(out), "--trace-steps", str(trace)]
    if impl:
        argv += ["--flava-impl", impl]
    if knobs:
        argv += ["--knobs", knobs]
    os.environ["MASTER_PORT"] = str(_free_port())  # other rungs and other people's runs may hold 29500
    rc = run.main(p.parse_args(argv))
    if rc != 0:
        raise SystemExit(f"bench_host: {model}/{strategy}/b{batch} exited {rc}")
    return out


def host_ms(record: Path, first_untraced: int) -> float:
    import h5py
    import numpy as np

    with h5py.File(record, "r") as f:
        return float(np.median(f["step_time_s"][first_untraced:]) * 1e3)


def measure(rungs: list[str], repeats: int, steps: int, warmup: int, trace: int, work: Path) -> list[dict[str, Any]]:
    """Every rung ``repeats`` times, interleaved; the first repeat traces ``trace`` steps.
    Long because: the rung loop, the interleaving and the row assembly read best in one place."""
    import numpy as np

    impls = flava_impls()
    plan = []
    for r in rungs:
        model, strategy, batch = parse_rung(r)
        for impl in (impls if model.startswith("flava") else [""]):
            plan.append((model, strategy, batch, impl))
    times: dict[tuple[str, str, int, str], list[float]] = {k: [] for k in plan}
    counts: dict[tuple[str, str, int, str], tuple[int, int]] = {}
    for rep in range(repeats):
        for key in plan:
            model, strategy, batch, impl = key
            t = trace if rep == 0 else 0
            out = work / f"{model}-{strategy.replace(':', '-')}-b{batch}-{impl or 'default'}-r{rep}.h5"
            run_rung(model, strategy, batch, impl, out, steps, warmup, t)
            times[key].append(host_ms(out, warmup + t))
            if t:
                trace_file = out.with_name(out.name.removesuffix(".h5") + ".trace.json")
                events = json.loads(trace_file.read_text())["traceEvents"]
                a, s = top_level_ops(events)
                counts[key] = (a, s)
                trace_file.unlink()
    rows = []
    for key in plan:
        model, strategy, batch, impl = key
        a, s = counts[key]
        name, knobs = split_knobs(strategy)
        rows.append({"model": model, "strategy": name, **({"knobs": knobs} if knobs else {}), "batch": batch,
                     "flava_impl": impl, "aten_ops_per_step": a / trace, "syncs_per_step": s / trace,
                     "host_ms_per_step": float(np.median(times[key])), "host_ms_repeats": times[key]})
    singles = {(r["model"], r["batch"], r["flava_impl"]): r["host_ms_per_step"] for r in rows if r["strategy"] == "single"}
    for r in rows:
        base = singles.get((r["model"], r["batch"], r["flava_impl"]))
        r["host_vs_single"] = r["host_ms_per_step"] / base if base else None
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    from scaleladder.markdown import table as md_table

    impl = any(r["flava_impl"] for r in rows)
    head = ["rung", *(["FLAVA impl"] if impl else []), "aten ops/step", "syncs/step", "host ms/step", "× single"]
    body = [[f"{r['model']}/{r['strategy']}/" + (f"{r['knobs']}/" if r.get("knobs") else "") + f"b{r['batch']}", *([r["flava_impl"] or "-"] if impl else []),
             f"{r['aten_ops_per_step']:.0f}", f"{r['syncs_per_step']:.0f}", f"{r['host_ms_per_step']:.2f}",
             "-" if r["host_vs_single"] is None else f"{r['host_vs_single']:.2f}"] for r in rows]
    return md_table(head, body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rungs", default=None, help="comma-separated model/strategy/b<batch> (default: the table's)")
    ap.add_argument("--all", action="store_true", help="add `single` on the skeleton of every real flavor")
    ap.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK_RUNGS)}, 1 repeat, 4 steps: seconds")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs of every rung (median)")
    ap.add_argument("--steps", type=int, default=7, help="steps per run, warm-up and traced steps included")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--trace-steps", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="the step's clock: the training thread's CPU time (default) or wall time")
    ap.add_argument("--units", default=None,
                    help="comma-separated unit sizes k: each FSDP2 rung at every k (knobs pf<n>-u<k>; 1: as given)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    rungs = [r for r in a.rungs.split(",") if r.strip()] if a.rungs else list(QUICK_RUNGS if a.quick else DEFAULT_RUNGS)
    if a.all:
        from scaleladder.flavors import FLAVORS

        rungs += [f"{m}{SKELETON_SUFFIX}/single/b2" for m, f in FLAVORS.items() if not f.debug and m not in REAL]
    if a.units:
        try:
            units = [int(k) for k in a.units.split(",") if k.strip()]
        except ValueError:
            raise SystemExit(f"bench_host: --units {a.units!r} is not a comma-separated list of integers") from None
        rungs = with_units(rungs, units)
    if a.quick:
        a.repeats, a.steps, a.warmup, a.trace_steps = 1, 4, 1, 1
    if a.steps - a.warmup - a.trace_steps < 1:
        raise SystemExit("bench_host: --steps must leave at least one untraced step after --warmup and --trace-steps")
    for r in rungs:
        parse_rung(r)
    import torch

    # TRAP: imported before any process group exists (tests/helpers/gloo.py says why).
    import torch.distributed.nn.functional  # noqa: F401

    torch.set_num_threads(1)
    register_skeletons(rungs)
    use_clock(a.clock)
    with tempfile.TemporaryDirectory(prefix="bench_host-") as tmp:
        rows = measure(rungs, a.repeats, a.steps, a.warmup, a.trace_steps, Path(tmp))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, 1 gloo rank on the CPU, fp32, {a.clock} clock; "
          f"{a.repeats} interleaved repeats of {a.steps} steps ({a.warmup} warm-up, {a.trace_steps} traced)")
    print("\n".join(table(rows)))
    if a.json:
        from scaleladder.files import atomic_write_text

        atomic_write_text(Path(a.json), json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
