"""The host section: is a rung bound by the GPU or by the host that issues its work?

Its rows are the ladder a user would run on one GPU, the rows the targets read first, so that
a 6-minute budget (`--sections host --budget-min 6`) leaves room for a rerun inside the 15
minutes a lent GPU gives. Each rung traces 3 steps after its warm-up (`--trace-steps`): the
kernel-busy fraction is read from that trace, and the throughput from the rung's UNTRACED
measured steps (the traced ones carry the profiler's cost, heavier on host-bound rungs). The
vit-base `single`/`fsdp-full` pair runs twice, interleaved: host-bound rungs moved 12-18%
between the first two H100 reports, and a pair measured back to back twice shows the drift.
Beside vit-base's `fsdp2-full` (a unit per layer) run its units of 2 and 4 layers (knobs `pf0-u2`,
`pf0-u4`): what fewer units, with fewer per-unit hooks, buy on a GPU (docs/performance.md,
"Units of k layers", has the CPU's curve).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder.markdown import table

from .rows import RungResult, fmt, pct, verdict

if TYPE_CHECKING:
    from .runner import Check

TRACE_STEPS = 3
COMMAND = 'make gpu-check GPU_CHECK_ARGS="--sections host --budget-min 6"'


@dataclass(frozen=True)
class HostRow:
    """One rung of the section: the role's flavor at a GPU batch; ``impl``: FLAVA's implementation."""

    role: str
    strategy: str
    batch: int  # the GPU batch; the CPU form maps it (CPU_BATCH)
    impl: str = ""
    repeat: int = 0
    knobs: str = ""  # "": the strategy's default knobs (pre-lag, pf0); FSDP2's units of k: pf0-u<k>

    def label(self) -> str:
        return (f"{self.role} {self.strategy}" + (f" {self.knobs}" if self.knobs else "") + f" b{self.batch}"
                + (f" {self.impl}" if self.impl else "") + (f" (repeat {self.repeat + 1})" if self.repeat else ""))

    def spec(self, default: str) -> str:
        """The rung's spec: ``default`` (the check's, with the strategy's default knobs), its knobs replaced."""
        if not self.knobs:
            return default
        parts = default.split("/")
        return "/".join(parts[:3] + [self.knobs] + parts[4:])


_VB, _VH, _FL = "vit-base", "vit-huge", "flava-350m"
# Key rows first: the FSDP pair (twice, interleaved), the AC costs at b128, FLAVA's MFU at b64,
# ViT-H's compiled MFU at b128; then the compiled vit-base rungs, the original FLAVA, the smaller batches.
GPU_ROWS = (
    HostRow(_VB, "single", 128), HostRow(_VB, "fsdp-full", 128),
    HostRow(_VB, "single", 128, repeat=1), HostRow(_VB, "fsdp-full", 128, repeat=1),
    HostRow(_VB, "fsdp2-full", 128), HostRow(_VB, "fsdp2-full", 128, knobs="pf0-u2"),
    HostRow(_VB, "fsdp2-full", 128, knobs="pf0-u4"),  # units of 2 and 4 layers beside a unit per layer
    HostRow(_VH, "single", 128), HostRow(_VH, "single-ac", 128), HostRow(_VH, "single-sac", 128),
    HostRow(_FL, "single", 64, "sdpa"),
    HostRow(_VH, "single-compile", 128),  # after FLAVA's: an inductor compile costs a minute or more
    HostRow(_VB, "single-compile", 128), HostRow(_VB, "fsdp2-full-compile", 128),
    HostRow(_FL, "single", 64, "torchmultimodal"), HostRow(_FL, "single", 16, "sdpa"),
    HostRow(_FL, "single", 16, "torchmultimodal"),
    HostRow(_VH, "single", 32), HostRow(_VH, "single-ac", 32), HostRow(_VH, "single-sac", 32),
    HostRow(_VH, "single-compile", 32),
)
# --smoke (the CPU test): the FSDP pair and FLAVA's two implementations.
SMOKE_ROWS = (HostRow(_VB, "single", 128), HostRow(_VB, "fsdp-full", 128),
              HostRow(_FL, "single", 16, "sdpa"), HostRow(_FL, "single", 16, "torchmultimodal"))
# The CPU form's batches: distinct per (role, GPU batch), so that every row is its own file.
CPU_BATCH = {(_VB, 128): 8, (_VH, 32): 4, (_VH, 128): 6, (_FL, 16): 2, (_FL, 64): 4}
STEPS = {"cuda": (30, 8), "cpu": (5, 1)}  # (steps, warm-up): the traced steps come right after the warm-up

TARGET_FSDP_VS_SINGLE = 0.9
TARGET_AC_COST = 0.30
TARGET_SAC_COST = 0.15
TARGET_FLAVA_MFU = 0.20
TARGET_VIT_H_COMPILE_MFU = 0.45


def rows_for(c: Check) -> tuple[HostRow, ...]:
    return SMOKE_ROWS if c.args.smoke else GPU_ROWS


def batch_for(c: Check, row: HostRow) -> int:
    return row.batch if c.device == "cuda" else CPU_BATCH[(row.role, row.batch)]


def flava_impls() -> tuple[str, ...]:
    """What `scaleladder run --flava-impl` takes in the package the rungs import (() before it existed)."""
    import argparse

    from scaleladder.rung.run_config import add_arguments  # torch-free

    p = argparse.ArgumentParser()
    add_arguments(p)
    return next((tuple(a.choices or ()) for a in p._actions if "--flava-impl" in a.option_strings), ())


def run(c: Check) -> None:
    """The section: each row a fresh `scaleladder run` with a 3-step trace, in key order."""
    steps, warmup = STEPS[c.device]
    impls = flava_impls()
    for row in rows_for(c):
        c.guard("host", row.label())
        if row.impl and row.impl not in impls:
            c.note("host", f"{row.label()}: skipped, `scaleladder run` here has no --flava-impl {row.impl}")
            continue
        spec = row.spec(c.spec(row.role, row.strategy, batch=batch_for(c, row)))
        extra = ["--trace-steps", str(TRACE_STEPS)] + (["--flava-impl", row.impl] if row.impl else [])
        tag = "".join(f"-{x}" for x in (row.impl, f"r{row.repeat + 1}" if row.repeat else "") if x)
        rung = c.run_rung("host", row.role, spec, extra, tag=tag, steps=steps, warmup=warmup)
        rung.attrs["gpu_check_row"] = row
        if rung.file is not None:
            rung.attrs.update(read_figures(rung.file, warmup))


def read_figures(record: Path, warmup: int) -> dict[str, Any]:
    """From the rung's files: throughput over its untraced measured steps, and the kernel-busy
    fraction of its trace (the trace is removed after: tens of MB per GPU rung)."""
    import h5py
    import numpy as np

    out: dict[str, Any] = {}
    try:
        with h5py.File(record, "r") as f:
            a = dict(f.attrs)
            times = f["step_time_s"][()]
        untraced = times[warmup + int(a.get("trace_steps", 0) or 0):]
        if len(untraced) and math.isfinite(float(a.get("items_per_s", math.nan))):
            rate = float(a["items_per_s"]) * float(np.mean(times[warmup:])) / float(np.median(untraced))
            out["untraced_items_per_s"] = rate
            out["untraced_mfu"] = float(a.get("mfu", math.nan)) * rate / float(a["items_per_s"])
    except (OSError, KeyError, ValueError):
        pass
    trace = record.with_name(record.name.removesuffix(".h5") + ".trace.json")
    if trace.is_file():
        try:
            out["kernel_busy"] = kernel_busy(json.loads(trace.read_text())["traceEvents"])
        except (OSError, ValueError, KeyError):
            pass
        trace.unlink()
    return out


def kernel_busy(events: list[dict[str, Any]]) -> float:
    """The fraction of the traced steps' device time some kernel (or copy, or memset) was running:
    their merged intervals over first start to last end. NaN without device events (a CPU trace)."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                   if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    if not spans:
        return math.nan
    busy, start, end = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > end:
            busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    total = max(e for _, e in spans) - spans[0][0]
    return busy / total if total > 0 else math.nan


# -- the report ----------------------------------------------------------------------------------------


def _rows(c: Check) -> list[RungResult]:
    return [r for r in c.rungs if r.section == "host"]


def _rate(rs: list[RungResult], role: str, strategy: str, batch: int, impl: str = "", knobs: str = "") -> float:
    """The median over repeats of the untraced items/s of one row (NaN if none ran ok)."""
    vals = [v for r in rs if _is(r, role, strategy, batch, impl, knobs) and math.isfinite(v := r.num("untraced_items_per_s"))]
    return statistics.median(vals) if vals else math.nan


def _is(r: RungResult, role: str, strategy: str, batch: int, impl: str = "", knobs: str = "") -> bool:
    row = r.attrs.get("gpu_check_row")
    return (r.status == "ok" and isinstance(row, HostRow)
            and (row.role, row.strategy, row.batch, row.knobs) == (role, strategy, batch, knobs)
            and (not impl or row.impl == impl))


def targets(c: Check) -> list[list[str]]:
    """The issue's host targets; on the CPU every verdict is 'not measured', with the command."""
    rs = _rows(c)
    gpu = c.device == "cuda"
    why = f"no GPU: run `{COMMAND}` on one" if not gpu else "its rungs did not run"

    def judged(value: float, ok: bool) -> str:
        return verdict(ok if gpu and math.isfinite(value) else None, why)

    out = []
    single = _rate(rs, _VB, "single", 128)
    for strategy, name in (("fsdp-full", "FSDP1"), ("fsdp2-full", "FSDP2")):
        ratio = _rate(rs, _VB, strategy, 128) / single
        out.append([f"{name} vs `single`, vit-base b128", f">= {TARGET_FSDP_VS_SINGLE}×", fmt(ratio, 2, "×"),
                    judged(ratio, ratio >= TARGET_FSDP_VS_SINGLE)])
    base = _rate(rs, _VH, "single", 128)
    for strategy, goal in (("single-ac", TARGET_AC_COST), ("single-sac", TARGET_SAC_COST)):
        cost = 1 - _rate(rs, _VH, strategy, 128) / base
        out.append([f"`{strategy}` cost, vit-huge b128", f"<= {goal:.0%}", pct(cost), judged(cost, cost <= goal)])
    for role, strategy, batch, impl, goal, name in (
            (_FL, "single", 64, "sdpa", TARGET_FLAVA_MFU, "flava-350m `single` b64 MFU"),
            (_VH, "single-compile", 128, "", TARGET_VIT_H_COMPILE_MFU, "ViT-H/14 `single-compile` b128 MFU")):
        mfu = next((r.num("untraced_mfu") for r in rs if _is(r, role, strategy, batch, impl)), math.nan)
        out.append([name, f">= {goal:.0%}", pct(mfu), judged(mfu, mfu >= goal)])
    return out


def markdown(c: Check) -> list[str]:
    """The section's tables: its targets, then one row per rung in the order they ran."""
    wanted = not c.args.sections or "host" in c.args.sections.split(",")
    L = ["## Host-bound or GPU-bound (`--sections host`)", ""]
    if not wanted and not _rows(c):
        return L + [f"Not asked for: `{COMMAND}` runs it alone (about 6 minutes on one H100).", ""]
    steps, warmup = STEPS[c.device]
    L += [f"Each rung: {steps} steps ({warmup} warm-up), the {TRACE_STEPS} after the warm-up traced. items/s and MFU "
          "from the untraced measured steps (the record's own figure, with its 95% interval, includes the traced "
          "ones); host-boundness and device lag from the record (docs/metrics.md, 'Host-boundness'); kernel busy: "
          "the traced steps' merged kernel time over their span on the device. × single: against the same "
          "model and batch's `single`, median over repeats.", "", "### Host targets", ""]
    L += table(["target", "goal", "measured", "verdict"], targets(c), escape=True) + [""]
    rs = _rows(c)
    if not rs:
        return L + ["No rung ran.", ""]
    body = []
    for r in rs:
        row = r.attrs.get("gpu_check_row")
        base = _rate(rs, row.role, "single", row.batch, row.impl) if isinstance(row, HostRow) else math.nan
        lo, hi = r.num("items_per_s_ci_low"), r.num("items_per_s_ci_high")
        body.append([row.label() if isinstance(row, HostRow) else r.role, f"`{r.spec}`", r.status if r.status == "ok"
                     else f"**{r.status}**", fmt(r.num("untraced_items_per_s")),
                     f"{fmt(r.num('items_per_s'))} [{fmt(lo)}, {fmt(hi)}]", pct(r.num("untraced_mfu")),
                     fmt(r.num("host_boundness"), 2), fmt(1e3 * r.num("device_lag_median_s"), 2),
                     pct(r.num("kernel_busy")), fmt(r.num("untraced_items_per_s") / base, 2, "×"),
                     f"`{r.file.name}`" if r.file else r.note])
    return L + table(["row", "rung", "status", "items/s (untraced)", "items/s [95%] (record)", "MFU (untraced)",
                      "host-boundness", "device lag (ms)", "kernel busy", "× single", "file"], body, escape=True) + [""]

