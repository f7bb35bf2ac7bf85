"""gpu-check.md and gpu-check.json from what ran: the targets' verdicts, one table per section, the
time per section and every command."""

from __future__ import annotations

import json
import math
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder.files import atomic_write_text
from scaleladder.markdown import table

from . import host
from .config import (GIB, PRECISION, ROLES, STRATEGIES, TARGET_AC_COST, TARGET_HARNESS, TARGET_LOADER, TARGET_PLANNER, TARGET_STEP,
                     TARGET_VIT_H_MFU)
from .rows import RungResult, fmt, gib, pct, same_as, seconds_str, verdict

if TYPE_CHECKING:
    from .runner import Check


def write(c: Check, status: str) -> Path:
    md = c.out / "gpu-check.md"
    atomic_write_text(c.out / "gpu-check.json", json.dumps(summary(c, status), indent=1, default=str) + "\n")
    atomic_write_text(md, markdown(c, status))
    return md


# -- the numbers the targets and the tables share -------------------------------------------------------


def targets(c: Check) -> list[list[str]]:
    """One row per target of the issue: the goal, what was measured, and the verdict (never asserted)."""
    smoke = " (--smoke)" if c.args.smoke else ""
    rows: list[list[str]] = []
    vh = [r for r in c.rungs if r.section == "strategies" and r.role == "vit-huge" and r.status == "ok"
          and math.isfinite(r.num("mfu"))]
    if vh:
        best = max(vh, key=lambda r: r.num("mfu"))
        rows.append(["ViT-H/14 bf16-mixed MFU", f">= {TARGET_VIT_H_MFU:.0%}",
                     f"{pct(best.num('mfu'))} best ({best.spec}); `single`: "
                     f"{next((pct(r.num('mfu')) for r in vh if r.spec.split('/')[1] == 'single'), 'n/a')}",
                     verdict(best.num("mfu") >= TARGET_VIT_H_MFU)])
    else:
        why = "no peak FLOP/s for a CPU" if c.device == "cpu" else "no vit-huge rung ran" + smoke
        rows.append(["ViT-H/14 bf16-mixed MFU", f">= {TARGET_VIT_H_MFU:.0%}", "n/a", verdict(None, why)])
    hs = [h for h in c.harness if math.isfinite(h["ratio"])]
    rows.append(["harness/bare step time", f"<= {TARGET_HARNESS}",
                 ", ".join(f"{h['model']} {h['ratio']:.3f}" for h in hs) or "n/a",
                 verdict(all(h["ratio"] <= TARGET_HARNESS for h in hs) if hs else None, "no bench ran")])
    ratio = loader_ratio(c)
    rows.append(["loader/synthetic throughput", f">= {TARGET_LOADER}", fmt(ratio, 3),
                 verdict(ratio >= TARGET_LOADER if math.isfinite(ratio) else None, "a loader rung is missing")])
    costs = [(cost, s) for s, cost in ac_costs(c).items() if math.isfinite(cost)]
    if costs:
        worst = max(costs)
        rows.append(["AC throughput cost", f"<= {TARGET_AC_COST:.0%}", f"worst {pct(worst[0])} ({worst[1]}), "
                     f"{sum(cost <= TARGET_AC_COST for cost, _ in costs)} of {len(costs)} pairs within",
                     verdict(worst[0] <= TARGET_AC_COST)])
    else:
        rows.append(["AC throughput cost", f"<= {TARGET_AC_COST:.0%}", "n/a", verdict(None, "no AC pair ran")])
    why = "the CPU records no device memory" if c.device == "cpu" else "no rung measured memory"
    rows.append(_planner_target(c, "planner peak vs measured", "error", TARGET_PLANNER, why))
    rows.append(_planner_target(c, "planner step time vs measured", "step_error", TARGET_STEP,
                                "no rung has both a predicted and a measured step"))
    return rows


def _planner_target(c: Check, name: str, key: str, target: float, why_none: str) -> list[str]:
    """One target row over the planner rows' ``key`` (predicted / measured - 1); a row that ran
    the same strategy as an earlier one is not counted."""
    errs = [(abs(p[key]), p[key], p["rung"]) for p in c.planner if math.isfinite(p.get(key, math.nan)) and not p.get("same_as")]
    if not errs:
        return [name, f"within {target:.0%}", "n/a", verdict(None, why_none)]
    worst = max(errs)
    within = sum(e <= target for e, _, _ in errs)
    return [name, f"within {target:.0%}", f"{within} of {len(errs)} rungs within; worst {worst[1]:+.1%} ({worst[2]})",
            verdict(within == len(errs))]


def ac_costs(c: Check) -> dict[str, float]:
    """1 - throughput(X-ac) / throughput(X), for every pair that both ran ok."""
    # a row that ran the same strategy as an earlier one is not a pair of its own
    rows = {r.spec: r for r in c.rungs if r.section == "strategies" and r.status == "ok" and same_as(c.rungs, r) is None}
    costs: dict[str, float] = {}
    for spec, r in rows.items():
        parts = spec.split("/")
        if parts[1].endswith("-ac"):
            base = "/".join([parts[0], parts[1][:-3], *parts[2:]])
            if base in rows:
                costs[spec] = 1 - r.num("items_per_s") / rows[base].num("items_per_s")
    return costs


def loader_ratio(c: Check) -> float:
    fed, syn = c.loader.get("fed"), c.loader.get("synthetic")
    if not fed or not syn or fed.status != "ok" or syn.status != "ok":
        return math.nan
    return float(fed.num("items_per_s") / syn.num("items_per_s"))


# -- gpu-check.md -----------------------------------------------------------------------------------------


def markdown(c: Check, status: str) -> str:
    L = _md_head(c, status)
    L += ["## Targets", ""] + table(["target", "goal", "measured", "verdict"], targets(c), escape=True) + [""]
    L += _md_strategies(c) + _md_maxbatch(c) + _md_harness(c) + _md_loader(c) + _md_precision(c)
    L += host.markdown(c) + _md_planner(c) + _md_figures(c)
    L += ["## Time per section", ""] + table(
        ["section", "time", "notes"],
        [[s, seconds_str(t), "; ".join(c.notes.get(s, []))] for s, t in c.section_s.items()]
        + [["total", seconds_str(c.elapsed()), f"budget {c.args.budget_min:g} min"]], escape=True) + [""]
    other = [f"- {s}: {n}" for s, ns in c.notes.items() if s not in c.section_s for n in ns]
    if other:
        L += ["## Notes", "", *other, ""]
    L += ["## Commands", "", "In the order they ran, each in a fresh process (exit code, wall time, log under `logs/`):", ""]
    for i, cmd in enumerate(c.commands, 1):
        ended = "killed at its limit" if cmd.timed_out else f"exit {cmd.rc}"
        argv = shlex.join(cmd.argv) if cmd.name != "probe" else shlex.join(cmd.argv[:2]) + " <environment probe>"
        L.append(f"{i}. `{argv}` — {ended}, {cmd.seconds:.1f} s, `{cmd.log.relative_to(c.out)}`")
    L.append("")
    if c.env_info.get("pythonpath"):
        L += [f"With `PYTHONPATH={c.env_info['pythonpath']}`.", ""]
    return "\n".join(L)


def _md_head(c: Check, status: str) -> list[str]:
    """The title, the machine's table, and what the numbers mean."""
    e, p = c.env_info, c.profile
    cuda = f"CUDA {e.get('cuda')}" if e.get("cuda") else ""
    hip = f"HIP {e.get('hip')}" if e.get("hip") else ""
    mode = f"--device {c.device}" + (" --smoke" if c.args.smoke else "") + (
        f" (debug flavors: {', '.join(f'{r}->{f}' for r, f in p.flavors.items())})" if c.device == "cpu" else "")
    gpu = e.get("name", "?")
    if e.get("total_bytes"):
        gpu += f", {e['total_bytes'] / GIB:.1f} GiB as torch reports it, {e.get('count', 1)} visible (rungs use the first)"
    L: list[str] = [f"# make gpu-check: {e.get('name', '?')}", ""]
    if status != "complete":
        L += [f"**{status}**", ""]
    L += table(["", ""], [
        ["device", gpu],
        ["driver", e.get("driver") or "unknown"],
        ["torch", f"{e.get('torch', '?')} ({', '.join(x for x in (cuda, hip) if x) or 'CPU build'})"],
        ["python", e.get("python", "?")],
        ["scaleladder", _md_commit(e)],
        ["date (UTC)", e.get("date", "?")],
        ["host", f"{e.get('host', '?')}, {e.get('cores', '?')} CPU cores"],
        ["mode", mode],
        ["planner device", e.get("plan_device", "?")],
        ["time", f"{seconds_str(c.elapsed())} of a {c.args.budget_min:g} min budget"],
        ["command", f"`{shlex.join([Path(sys.executable).name, *sys.argv])}`"],
    ], escape=True)
    L += ["", "Every number below was measured by this run on this machine (commands at the end); the targets "
              "are reported, not asserted. A rung that ran out of memory is a row saying `oom`.", ""]
    if c.device == "cpu":
        L += ["On the CPU the numbers say nothing about GPUs: no MFU (no peak FLOP/s), no device memory. "
              "This form exists to prove the path end to end.", ""]
    return L


def _md_commit(e: dict[str, Any]) -> str:
    text = f"tree at commit {e.get('commit', '?')} (from {e.get('commit_from', '?')}); package imported from {e.get('scaleladder_from', '?')}"
    wheel = e.get("wheel_commit")
    if wheel:
        text += f", a wheel built from {wheel} (.whl/COMMIT)"
        if wheel != e.get("commit"):
            text += " — NOT the tree's commit: `make gpu-wheels` again to measure the tree"
    return text


def _status(r: RungResult) -> str:
    return r.status if r.status == "ok" else f"**{r.status}**" + (f": {r.note}" if r.note else "")


def _md_strategies(c: Check) -> list[str]:
    order = {s: i for i, s in enumerate(STRATEGIES)}
    rows = sorted((r for r in c.rungs if r.section == "strategies"),  # run in RUN_ORDER, shown by model
                  key=lambda r: (ROLES.index(r.role) if r.role in ROLES else 99, order.get(r.spec.split("/")[1], 99)))
    L = [f"## Strategies at a fixed batch ({PRECISION}, one rank)", "",
         "At one rank FSDP1 runs every sharding strategy as `NO_SHARD` (torch warns and switches), so "
         "`fsdp-grad-op*` and `fsdp-no-shard*` are not run: they would measure `fsdp-full*` again. FSDP2 keeps "
         "its schedule but shards over one rank. 'ran as' is the sharding read from the wrapped model "
         "(`sharding_ran`); a row that ran the same strategy as an earlier row says so and is left out of the "
         "AC-cost and planner targets. AC cost = 1 − throughput with AC ÷ throughput without. Start-up: the "
         "rung's `startup_s`, process start to its first step (imports, process group, model build and wrapping; "
         "compile is in the warm-up steps); wall: the whole process as this check timed it.", ""]
    if not rows:
        return L + ["Not run.", ""]
    costs = ac_costs(c)
    body = []
    for r in rows:
        dup = same_as(c.rungs, r)
        ran = str(r.attrs.get("sharding_ran", "")) or "n/a"
        if dup is not None:
            ran += f" (same strategy as `{dup.spec.split('/')[1]}`)"
        body.append([r.role, f"`{r.spec}`", _status(r), ran, fmt(r.num("items_per_s")),
                     fmt(1e3 * r.num("step_time_mean_s"), 1), pct(r.num("mfu")), fmt(r.num("tflops_per_device"), 1),
                     gib(r.mem("peak_active_gib")), gib(r.mem("peak_reserved_gib")),
                     gib(r.mem("peak_device_used_gib")), pct(costs[r.spec]) if r.spec in costs else "",
                     fmt(r.num("startup_s"), 1), fmt(r.seconds, 1), f"`{r.file.name}`" if r.file else ""])
    return L + table(["model", "rung", "status", "ran as", "items/s", "step (ms)", "MFU", "TFLOP/s", "peak active (GiB)",
                      "peak reserved (GiB)", "device used (GiB)", "AC cost", "start-up (s)", "wall (s)", "file"], body,
                     escape=True) + [""]


def _md_maxbatch(c: Check) -> list[str]:
    rows = [r for r in c.rungs if r.section == "maxbatch"]
    p = c.profile
    L = ["## Max batch", "",
         f"`scaleladder maxbatch` from the planner's predicted max batch (`--plan-device`), capped at the smaller "
         f"of that prediction and {', '.join(f'{k} {v}' for k, v in p.maxbatch_caps.items())}"
         f"{' (1 in --smoke)' if c.args.smoke else ''}; probes of {p.probe_steps} steps ({p.probe_warmup} warm-up), "
         "each a fresh process, and the passing probe at the max is the rung. `≥N (cap)`: the search stopped at its "
         "cap, so the true max batch is at least N; a search killed by the time guard says what its probes bracket.", ""]
    if not rows:
        return L + ["Not run.", ""]
    body = []
    for r in rows:
        mb = r.attrs.get("max_batch")
        capped = str(r.attrs.get("maxbatch_capped", "")).lower() in ("true", "1")
        if r.status == "ok":
            found = f"≥{mb} (cap)" if capped else str(mb)
        elif "probe_lo" in r.attrs:
            found = f"[{r.attrs['probe_lo']}, {r.attrs.get('probe_hi') or '?'})"
        else:
            found = "none" if r.status == "oom" else ""
        planned = int(r.attrs.get("gpu_check_planned", 0) or 0)
        body.append([r.role, r.spec.split("/")[1], _status(r), str(planned or "n/a"),
                     str(r.attrs.get("gpu_check_cap", "")), found, str(r.attrs.get("maxbatch_probes", r.attrs.get("probes_run", ""))),
                     fmt(r.num("items_per_s")), pct(r.num("mfu")), gib(r.mem("peak_active_gib")),
                     gib(r.mem("peak_device_used_gib")), seconds_str(r.seconds)])
    return L + table(["model", "strategy", "status", "planner max", "cap", "max batch", "probes", "items/s at max",
                      "MFU", "peak active (GiB)", "device used (GiB)", "search time"], body, escape=True) + [""]


def _md_harness(c: Check) -> list[str]:
    L = ["## Harness overhead", "", "`benchmarks/bench_rung.py`: the harness's loop against a bare loop in one process, "
         "interleaved; both timed by the harness's window. Median of the repeats.", ""]
    if not c.harness:
        return L + ["Not run.", ""]
    body = [[h["model"], h["precision"], str(h["batch"]), f"{h['steps']} × {h['repeats']}",
             h["status"] + (f": {h['note']}" if h.get("note") else ""), fmt(h["bare_ms"], 2), fmt(h["harness_ms"], 2),
             fmt(h["ratio"], 3)] for h in c.harness]
    return L + table(["model", "precision", "batch", "steps × repeats", "status", "bare step (ms)",
                      "harness step (ms)", "harness/bare"], body, escape=True) + [""]


def _md_loader(c: Check) -> list[str]:
    L = ["## Loader against synthetic data", ""]
    lo = c.loader
    if not lo.get("rows") and not lo.get("synthetic"):
        return L + ["Not run.", ""]
    lo_px, hi_px = lo.get("sides", (lo["image_size"], lo["image_size"]))
    L += [f"`{lo['spec']}`, {c.profile.loader_steps} steps ({c.profile.loader_warmup} warm-up), back to back: "
          f"shards of {lo['samples']} JPEGs of {lo_px}-{hi_px} px (`scaleladder shard --images`), cut to "
          f"{lo['image_size']} px; uint8 across the workers' boundary, normalised on the device; "
          f"{lo.get('cores', '?')} cores on this machine.", ""]
    syn = lo.get("synthetic")
    body = []
    if syn is not None:
        body.append(["synthetic (`--data synthetic`)", "", "", _status(syn), fmt(syn.num("items_per_s")),
                     fmt(1e3 * syn.num("step_time_mean_s"), 1), "", "", "", f"`{syn.file.name}`" if syn.file else ""])
    for row in lo.get("rows", []):
        r = row["rung"]
        ratio = (r.num("items_per_s") / syn.num("items_per_s")) if syn is not None and r.status == "ok" and syn.status == "ok" else math.nan
        body.append([f"shards, `--decode {row['decode']}`", str(row["workers"]), str(r.attrs.get("loader_transport", "")), _status(r),
                     fmt(r.num("items_per_s")), fmt(1e3 * r.num("step_time_mean_s"), 1), fmt(row["wait_ms"], 2),
                     fmt(1e3 * r.num("loader_cpu_s_per_batch"), 1), fmt(ratio, 3), f"`{r.file.name}`" if r.file else ""])
    L += table(["data", "workers", "transport", "status", "items/s", "step (ms)", "loader wait per step (ms)",
                "workers' CPU per batch (ms)", "/ synthetic", "file"], body, escape=True)
    return L + ["", f"loader/synthetic (CPU decode, the most workers) = **{fmt(loader_ratio(c), 3)}** "
                    f"(target ≥ {TARGET_LOADER}, with CPU decode and with GPU decode).", ""]


def _md_precision(c: Check) -> list[str]:
    rows = [r for r in c.rungs if r.section == "precision"]
    L = ["## Precision (vit-base, `single`)", "",
         "MFU is against the device's peak for each precision (fp32, tf32, bf16 = fp16: `rung/device_peak.py`).", ""]
    if not rows:
        return L + ["Not run.", ""]
    fp32 = next((r.num("items_per_s") for r in rows if r.spec.split("/")[2] == "fp32" and r.status == "ok"), math.nan)
    body = [[r.spec.split("/")[2], f"`{r.spec}`", _status(r), fmt(r.num("items_per_s")),
             fmt(1e3 * r.num("step_time_mean_s"), 1), pct(r.num("mfu")), fmt(r.num("peak_tflops_per_device"), 1),
             fmt(r.num("items_per_s") / fp32, 2, "×"), fmt(r.num("final_loss"), 4), gib(r.mem("peak_active_gib")),
             r.note if r.status == "ok" else ""] for r in rows]
    return L + table(["precision", "rung", "status", "items/s", "step (ms)", "MFU", "peak TFLOP/s", "vs fp32",
                      "final loss", "peak active (GiB)", "note"], body, escape=True) + [""]


def _md_planner(c: Check) -> list[str]:
    L = ["## Planner against measurement", "",
         f"`scaleladder plan --spec <rung at the batch it ran> --gpus-per-node 1 --data <synthetic|loader> "
         f"{shlex.join(c.plan_args)} --json` for every rung that ran. The planner's peak is the allocator's "
         "active peak; its 'required' adds fragmentation, the CUDA context and the comm library, which is what "
         "the device reports in use. error = predicted ÷ measured active − 1. The step: the planner's "
         "`step_time_s` (compute, host work and exposed communication; 'bound' says which decides it) against "
         "the record's median step after warm-up; step error = predicted ÷ measured − 1.", ""]
    if not c.planner:
        return L + ["No rung to compare.", ""]
    body = [[f"`{p['rung']}`" + (f" (same strategy as `{p['same_as'].split('/')[1]}`)" if p.get("same_as") else ""),
             p["section"], str(p["batch"]), p["data"], gib(p["predicted_gib"]),
             gib(p["measured_active_gib"]), f"{p['error']:+.1%}" if math.isfinite(p["error"]) else "n/a",
             gib(p["measured_reserved_gib"]), gib(p["required_gib"]), gib(p["measured_device_used_gib"]),
             fmt(p.get("predicted_step_ms", math.nan), 1), p.get("step_bound", ""), fmt(p.get("measured_step_ms", math.nan), 1),
             f"{p['step_error']:+.1%}" if math.isfinite(p.get("step_error", math.nan)) else "n/a"]
            for p in c.planner]
    return L + table(["rung", "section", "batch", "data", "predicted peak (GiB)", "measured active (GiB)", "error",
                      "measured reserved (GiB)", "predicted required (GiB)", "measured device used (GiB)",
                      "predicted step (ms)", "bound", "measured step (ms)", "step error"], body,
                     escape=True) + [""]


def _md_figures(c: Check) -> list[str]:
    L = ["## Figures", ""]
    if not c.figures:
        return L + ["None (see the notes).", ""]
    for name, caption in c.figures:
        L += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    return L


# -- gpu-check.json ----------------------------------------------------------------------------------------


def summary(c: Check, status: str) -> dict[str, Any]:
    """The same numbers as the report, for programs: JSON-clean (NaN -> null, paths relative to --out)."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, RungResult):
            return {"section": v.section, "role": v.role, "spec": v.spec, "status": v.status, "file": v.file}
        if isinstance(v, Path):
            return str(v.relative_to(c.out)) if v.is_relative_to(c.out) else str(v)
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if hasattr(v, "item"):  # numpy scalars from the records
            return clean(v.item())
        return v

    rungs = [{**{k: v for k, v in asdict(r).items() if k != "attrs"},
              **{k: r.num(k) for k in ("items_per_s", "step_time_mean_s", "mfu", "peak_active_gib", "peak_reserved_gib",
                                      "peak_device_used_gib", "untraced_items_per_s", "untraced_mfu", "host_boundness",
                                      "kernel_busy")}, "max_batch": r.attrs.get("max_batch")}
             for r in c.rungs]
    result: dict[str, Any] = clean({"status": status, "device": c.device, "smoke": c.args.smoke, "env": c.env_info,
                                    "budget_s": c.budget_s, "elapsed_s": c.elapsed(), "sections_s": c.section_s,
                                    "notes": c.notes, "targets": [dict(zip(("target", "goal", "measured", "verdict"), t))
                                                                  for t in targets(c)],
                                    "rungs": rungs, "harness": c.harness, "loader_ratio": loader_ratio(c),
                                    "ac_costs": ac_costs(c), "planner": c.planner,
                                    "host_targets": [dict(zip(("target", "goal", "measured", "verdict"), t))
                                                     for t in host.targets(c)], "figures": [f for f, _ in c.figures],
                                    "commands": [{"argv": cmd.argv, "rc": cmd.rc, "seconds": cmd.seconds}
                                                 for cmd in c.commands]})
    return result
