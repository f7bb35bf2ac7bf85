"""What each section runs: strategies, harness, loader, precision and max batch measure; the planner
section only asks the planner about what ran. Each takes the running :class:`~gpucheck.runner.Check`."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import BENCH_RUNG, GIB, OOM_RE, PRECISION, ROLES
from .machine import cores
from .rows import RungResult, fmt, judge, same_as, with_batch

if TYPE_CHECKING:
    from .runner import Check


def strategies(c: Check) -> None:
    for role, strategy in c.sel.strategies:
        c.guard("strategies", f"{role} {strategy}")
        c.run_rung("strategies", role, c.spec(role, strategy))


def harness(c: Check) -> None:
    """benchmarks/bench_rung.py: the harness's step against a bare loop's, per model."""
    for role, batch, steps, repeats in c.profile.harness:
        if role not in c.sel.harness_roles:
            continue
        c.guard("harness", role)
        flavor = c.profile.flavors[role]
        argv = [sys.executable, str(BENCH_RUNG), "--model", flavor, "--precision", PRECISION, "--batch", str(batch),
                "--steps", str(steps), "--repeats", str(repeats)]
        cmd = c.sh(f"harness {flavor} b{batch}", argv, c.limit(600))
        row: dict[str, Any] = {"role": role, "model": flavor, "precision": PRECISION, "batch": batch, "steps": steps,
                               "repeats": repeats, "status": "ok", "bare_ms": math.nan, "harness_ms": math.nan,
                               "ratio": math.nan, "seconds": cmd.seconds}
        m = re.search(r"bare mean step ([0-9.]+) ms \| harness mean step ([0-9.]+) ms \| harness/bare = ([0-9.]+)", cmd.tail())
        if m:
            row.update(bare_ms=float(m.group(1)), harness_ms=float(m.group(2)), ratio=float(m.group(3)))
        else:
            row["status"] = "timeout" if cmd.timed_out else ("oom" if OOM_RE.search(cmd.tail()) else "error")
            row["note"] = f"exit {cmd.rc}: {cmd.last_line()}"
        c.harness.append(row)
        print(f"gpu-check: [harness] {flavor} b{batch}: harness/bare {fmt(row['ratio'], 3)} ({cmd.seconds:.1f} s)", flush=True)


def loader(c: Check, work: Path) -> None:
    """Shards of web-sized JPEGs (300-900 px on a GPU) written by `scaleladder shard --images`, then
    the same rung fed by synthetic batches and by the shards: CPU decode and, on a GPU,
    ``--decode gpu``, each with every count of ``loader_workers`` (14 and 6)."""
    p, role = c.profile, "vit-base"
    flavor = p.flavors[role]
    from scaleladder.data.synthetic import write_image_folder
    from scaleladder.flavors import get_flavor

    size = get_flavor(flavor).image_size
    images, shards = work / "loader-images", work / "shards"
    c.guard("loader", "shard")
    shutil.rmtree(images, ignore_errors=True)
    write_image_folder(images, p.shard_samples, p.loader_sides, distinct=min(p.shard_samples, 128))
    cmd = c.sh("loader shard", c.scaleladder("shard", "--images", str(images), "--out", str(shards),
                                             "--per-shard", str(p.shard_per_shard), "--overwrite", "--quiet"), c.limit(600))
    if cmd.rc != 0:
        c.note("loader", f"`scaleladder shard` failed (exit {cmd.rc}): {cmd.last_line()}; no loader rung ran")
        return
    spec = c.spec(role, "single")
    decodes = ("cpu", "gpu") if c.device == "cuda" else ("cpu",)  # --decode gpu is refused without a GPU
    c.loader = {"workers": p.loader_workers, "samples": p.shard_samples, "image_size": size, "sides": p.loader_sides,
                "spec": spec, "cores": cores(), "rows": []}
    steps = {"steps": p.loader_steps, "warmup": p.loader_warmup}
    # Back to back, same steps: they differ only in where the batches come from. The synthetic
    # twin first, then the most workers with each decoder (the ratio's rows), then fewer.
    c.guard("loader", "the synthetic rung")
    c.loader["synthetic"] = c.run_rung("loader", role, spec, ["--data", "synthetic"], tag="-synthetic", **steps)
    for workers in p.loader_workers:
        for decode in decodes:
            c.guard("loader", f"the loader-fed rung, decode {decode}, {workers} workers")
            args = ["--data", str(shards / "manifest.json"), "--workers", str(workers), "--decode", decode]
            r = c.run_rung("loader", role, spec, args, tag=f"-data-{decode}-w{workers}", **steps)
            warmup = int(r.num("warmup")) if math.isfinite(r.num("warmup")) else 0
            c.loader["rows"].append({"decode": decode, "workers": workers, "rung": r,
                                     "wait_ms": _mean_wait_ms(r.file, warmup) if r.file is not None else math.nan})
            if "fed" not in c.loader and decode == "cpu":  # the target's row: CPU decode, the most workers
                c.loader["fed"], c.loader["wait_ms"] = r, c.loader["rows"][-1]["wait_ms"]


def precision(c: Check) -> None:
    role = "vit-base"
    for prec in c.sel.precisions:
        spec = c.spec(role, "single", prec)
        reuse = next((r for r in c.rungs if r.section == "strategies" and r.spec == spec and r.status == "ok"), None)
        if reuse is not None:
            c.rungs.append(RungResult("precision", role, spec, reuse.status, reuse.file, reuse.attrs,
                                      "the strategies section's rung (same spec and steps)", reuse.seconds))
            continue
        c.guard("precision", prec)
        c.run_rung("precision", role, spec)


def maxbatch(c: Check) -> None:
    """`scaleladder maxbatch` per (model, strategy), capped at the planner's max batch."""
    todo = list(c.sel.maxbatch)
    for i, (role, strategy) in enumerate(todo):
        c.guard("maxbatch", f"{role} {strategy}")
        p = c.profile
        spec = c.spec(role, strategy, batch="max")
        cap = p.maxbatch_caps[role] if not c.args.smoke else 1
        planned = planned_max(c, spec)
        if planned:
            cap = min(cap, planned)
        c.guard("maxbatch", f"{role} {strategy}")  # the planner's answer took time too
        out = c.rung_file("maxbatch", spec)
        out.unlink(missing_ok=True)
        argv = c.scaleladder("maxbatch", "--spec", spec, "--device", c.device,
                             "--steps", str(p.probe_steps), "--warmup", str(p.probe_warmup),
                             "--probe-steps", str(p.probe_steps), "--probe-warmup", str(p.probe_warmup),
                             "--max-batch-cap", str(cap), "--keep-probes", "--out", str(out))
        if c.plan_key:
            argv += ["--plan-device", c.plan_key, "--ranks-per-node", "1"]
        # A search is many processes: give each its share of what is left, shared within one
        # round of the models at a time: split over all nine searches, a GPU's
        # start-up cost leaves each too little to finish, and none would; this way the key
        # round (ddp for every model) finishes first. A killed search still leaves its probes.
        round_left = min(len(todo) - i, len(ROLES) - i % len(ROLES))  # searches left in this round
        share = c.section_remaining() / round_left
        cmd = c.sh(f"maxbatch {spec}", argv, max(60.0, share))
        rung = judge("maxbatch", role, spec, cmd, out)
        rung.attrs.setdefault("gpu_check_cap", cap)
        rung.attrs.setdefault("gpu_check_planned", planned or 0)
        if rung.file is None:
            rung.attrs.update(_probes_summary(out))  # a killed search: what its kept probes bracket
        shutil.rmtree(out.with_name(f".{out.name}.maxbatch"), ignore_errors=True)  # the record keeps the probe table
        c.rungs.append(rung)
        print(f"gpu-check: [maxbatch] {spec}: {rung.status}, max batch {rung.attrs.get('max_batch', '?')} "
              f"(cap {cap}, {cmd.seconds:.1f} s)", flush=True)


def planned_max(c: Check, spec: str) -> int | None:
    """The planner's max local batch for ``spec`` on this device (None: unbounded or unknown)."""
    pred = predict(c, spec.replace("/bmax", "/b1"), "synthetic")
    mb = pred.get("max_batch") if pred else None
    return int(mb) if mb else None


def predict(c: Check, spec: str, data: str) -> dict[str, Any] | None:
    cmd = c.sh(f"plan {spec}", c.scaleladder("plan", "--spec", spec, "--gpus-per-node", "1", "--data", data,
                                             "--json", *c.plan_args), 120)
    if cmd.rc != 0:
        return None
    text = cmd.tail(200_000)
    try:
        out: dict[str, Any] = json.loads(text[text.index("{"):])
        return out
    except ValueError:
        return None


def planner(c: Check) -> None:
    """Predicted against measured peak for every rung that ran (a rung reused by two sections, once)."""
    seen: set[Path] = set()
    for r in c.rungs:
        if r.status != "ok" or r.file is None or r.file in seen or r.section == "host":  # host: time, not memory
            continue
        seen.add(r.file)
        batch = r.attrs.get("batch", "")
        data = "synthetic" if str(r.attrs.get("data", "synthetic")) == "synthetic" else "loader"
        pred = predict(c, with_batch(r.spec, batch), data)
        dup = same_as(c.rungs, r)
        row: dict[str, Any] = {"rung": r.spec, "section": r.section, "batch": batch, "data": data,
                               "same_as": dup.spec if dup else "",
                               "measured_active_gib": r.mem("peak_active_gib"),
                               "measured_reserved_gib": r.mem("peak_reserved_gib"),
                               # absent in records of runners that predate it: missing, not a crash
                               "measured_device_used_gib": r.mem("peak_device_used_gib"),
                               "predicted_gib": math.nan, "required_gib": math.nan, "error": math.nan,
                               # the step: the record's median after warm-up (the planner predicts a
                               # steady step; a mean carries the odd slow step), against plan's step_time_s
                               "measured_step_ms": 1e3 * r.num("step_time_median_s"),
                               "predicted_step_ms": math.nan, "step_bound": "", "step_error": math.nan}
        if pred:
            row.update(predicted_gib=pred["peak_bytes"] / GIB, required_gib=pred["required_bytes"] / GIB)
            if pred.get("step_time_s"):  # absent from a plan that predates the step-time model
                row.update(predicted_step_ms=1e3 * float(pred["step_time_s"]), step_bound=str(pred.get("step_time_bound", "")))
        m = row["measured_active_gib"]
        if math.isfinite(m) and m > 0 and math.isfinite(row["predicted_gib"]):
            row["error"] = row["predicted_gib"] / m - 1
        t = row["measured_step_ms"]
        if math.isfinite(t) and t > 0 and math.isfinite(row["predicted_step_ms"]):
            row["step_error"] = row["predicted_step_ms"] / t - 1
        c.planner.append(row)


def _mean_wait_ms(path: Path, warmup: int) -> float:
    """Mean host wait for the loader per measured step, when the record has it (``loader_wait_s``)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if "loader_wait_s" not in f:
                return math.nan
            w = f["loader_wait_s"][()]
        w = w[warmup:] if len(w) > warmup else w
        return float(1e3 * w.mean()) if len(w) else math.nan
    except (OSError, KeyError, ValueError):
        return math.nan


def _probes_summary(out: Path) -> dict[str, Any]:
    """What the kept probes of a killed search bracket: the largest passing and smallest failing batch."""
    from scaleladder.results.store import read_attrs

    workdir = out.with_name(f".{out.name}.maxbatch")
    passed: list[int] = []
    failed: list[int] = []
    n = 0
    for f in sorted(workdir.glob("probe-b*.h5")):
        n += 1
        try:
            a = read_attrs(f)
        except OSError:
            continue
        b = int(f.stem.split("-b")[1])
        (passed if a.get("status") == "ok" and not int(a.get("alloc_retries", 0) or 0) else failed).append(b)
    summary: dict[str, Any] = {"probes_run": n}
    if passed:
        summary["probe_lo"] = max(passed)
        above = [b for b in failed if b > max(passed)]
        summary["probe_hi"] = min(above) if above else 0
    return summary
