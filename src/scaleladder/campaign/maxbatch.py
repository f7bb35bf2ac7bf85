"""`scaleladder maxbatch`: find the largest local batch that trains, then run the rung at it.

Start at the planner's max batch (or 1), double while probes pass, bisect between the last
pass and the first failure. A probe is a real short run in fresh processes
(``supervise.launch``); it passes on status ``ok`` with allocator retries within
``--max-retries``; out of memory is ``rung.loop.is_oom``'s, and any other crash aborts the
search. The rung then runs in full at the found batch and its record keeps the probes.
Why: docs/planner.md, "`scaleladder maxbatch`".
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scaleladder.log import get_logger
from scaleladder.results.record import OK, OOM, Build, MaxBatch, Memory, Oom, Placement, Record, Spec, checked
from scaleladder.spec import RunSpec, SpecError, parse_positive, parse_steps_warmup

_log = get_logger(__name__)
PASS = "ok"


@dataclass(frozen=True)
class ProbeResult:
    """What one probe at one local batch found."""

    batch: int
    status: str  # "ok" | "oom" | "retries" (ok, but over the retry threshold) | "error"
    alloc_retries: int = 0
    peak_active_gib: float = float("nan")
    peak_reserved_gib: float = float("nan")
    reason: str = ""  # why it failed (the OOM message, the retry count), empty when it passed
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASS


@dataclass
class SearchResult:
    max_batch: int | None  # None: not even batch 1 trains
    probes: list[ProbeResult] = field(default_factory=list)
    start: int = 1
    capped: bool = False  # the search stopped at --max-batch-cap, not at a failure


class ProbeError(RuntimeError):
    """A probe failed for a reason other than memory: the search cannot go on."""


def judge(result: ProbeResult, max_retries: int) -> ProbeResult:
    """Turn an ``ok`` run over the retry threshold into a failed probe."""
    if result.status == PASS and result.alloc_retries > max_retries:
        return dataclasses.replace(result, status="retries",
                                   reason=f"{result.alloc_retries} allocator retries after warm-up (threshold {max_retries})")
    return result


def search(probe: Callable[[int], ProbeResult], start: int | None = None, cap: int | None = None,
           max_retries: int = 0, log: Callable[[str], None] | None = None) -> SearchResult:
    """Largest batch ``b`` whose probe passes: double from ``start``, then bisect.

    Assumes a monotone answer (if ``b`` fits, every smaller batch fits), which is what
    makes bisection valid; each batch is probed at most once.
    """
    if cap is not None and cap < 1:
        raise SpecError(f"--max-batch-cap must be >= 1, got {cap}")
    first = max(1, min(start or 1, cap or (start or 1)))
    res = SearchResult(None, start=first)
    tried: dict[int, ProbeResult] = {}

    def ok(b: int) -> bool:
        if b not in tried:
            r = judge(probe(b), max_retries)
            if r.status not in (PASS, "oom", "retries"):
                raise ProbeError(f"probe at batch {b} failed: {r.reason or r.status}")
            tried[b] = r
            res.probes.append(r)
            if log:
                log(f"probe b={b}: {r.status}" + (f" ({r.reason})" if r.reason else ""))
        return tried[b].passed

    lo: int | None = None  # largest batch known to pass
    hi: int | None = None  # smallest batch known to fail
    if ok(first):
        lo = first
        while True:  # double
            if cap is not None and lo >= cap:
                res.capped = True
                break
            nxt = lo * 2 if cap is None else min(lo * 2, cap)
            if ok(nxt):
                lo = nxt
            else:
                hi = nxt
                break
    else:
        hi = first
        b = first
        while b > 1:  # halve until something passes
            b = max(1, b // 2)
            if ok(b):
                lo = b
                break
            hi = b
        if lo is None:
            return res  # not even batch 1
    if hi is not None:
        while hi - lo > 1:  # bisect
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
    res.max_batch = lo
    return res


# -- probes through the real launcher ---------------------------------------------------------


def is_oom_message(text: str) -> bool:
    """Does a recorded error say the device ran out of memory — by the runner's own rule?"""
    from scaleladder.rung.loop import is_oom

    return is_oom(RuntimeError(text))


def read_probe(path: Path, batch: int, seconds: float) -> ProbeResult:
    from scaleladder.results.store import read_attrs

    a = read_attrs(path)
    status = str(a.get(Record.status, ""))
    reason = "" if status == "ok" else str(a.get(Oom.error, "") or status)
    if status not in ("ok", "oom"):
        # A record that failed some other way but whose error is an allocation failure
        # (e.g. CUBLAS_STATUS_ALLOC_FAILED) is an OOM for the search, as for the runner.
        status = "oom" if is_oom_message(reason) else "error"
    return ProbeResult(batch, status, int(a.get(Memory.alloc_retries, 0) or 0),
                       float(a.get(Memory.peak_active_gib, float("nan"))), float(a.get(Memory.peak_reserved_gib, float("nan"))),
                       reason, seconds)


def launcher_probe(cfg: Any, launcher: str, workdir: Path, steps: int, warmup: int,
                   full_at: int | None = None) -> Callable[[int], ProbeResult]:
    """A probe that runs ``steps`` real steps at a batch in fresh processes via supervise.launch.

    At ``full_at`` (the cap) it runs the rung's own steps instead: a pass there ends the search,
    so that probe IS the rung, and the launch that would repeat it is saved."""
    from scaleladder.campaign.supervise import launch

    def probe(batch: int) -> ProbeResult:
        spec = dataclasses.replace(cfg.spec, batch=batch)
        out = workdir / f"probe-b{batch}.h5"
        n, w = (cfg.steps, cfg.warmup) if batch == full_at else (steps, warmup)
        pc = dataclasses.replace(cfg, spec=spec, steps=n, warmup=w, out=out)
        t0 = time.perf_counter()
        rc = launch(pc, launcher)
        dt = time.perf_counter() - t0
        if rc != 0 or not out.is_file():
            return ProbeResult(batch, "error", reason=f"launcher failed with exit code {rc} (see its stderr)", seconds=dt)
        return read_probe(out, batch, dt)

    return probe


def planned_start(spec: RunSpec, device: str, ranks_per_node: int, data: str = "synthetic",
                  cached_only: bool = False) -> tuple[int | None, bool]:
    """(the planner's max batch or None, whether it predicts that not even batch 1 fits).

    A ``-compile`` rung: the planner's memory for it is its eager rung's (an upper bound), so the search STARTS at its
    eager counterpart's max batch (only a starting point: doubling and bisection find the
    compiled rung's own limit either way) and is never declared hopeless without a probe.

    A models-file model (``plan_trace.traced_model``) is planned by its trace: the cache's, else
    traced here (a maxbatch job has torch); ``cached_only`` (``budget``, torch-free) raises
    ``plan_trace.NotTraced`` instead. One that cannot be traced (FSDP1 on several ranks) has no
    planned start: (None, False), the search starts at 1 (``cached_only``: ``plan_trace.Untraceable``)."""
    import dataclasses

    from scaleladder.campaign.plan_trace import Untraceable, traced_model
    from scaleladder.flavors import get_flavor
    from scaleladder.planner.memory import predict

    compiled = spec.strategy.compile
    if compiled:
        spec = dataclasses.replace(spec, strategy=dataclasses.replace(spec.strategy, compile=False))
    world = spec.nodes * ranks_per_node
    if traced_model(get_flavor(spec.model)):
        from scaleladder.campaign.plan_trace import predict as predict_traced

        try:
            p = predict_traced(spec, world, ranks_per_node, device, data=data, cached_only=cached_only).prediction
        except Untraceable as e:
            if cached_only:
                raise
            _log.info(f"scaleladder maxbatch: {e}: no planned start")
            return None, False
    else:
        p = predict(spec, world, ranks_per_node, device, data=data)
    return p.max_batch, not compiled and p.capacity_bytes is not None and p.max_batch is None


def probes_datasets(probes: list[ProbeResult]) -> dict[str, np.ndarray]:
    """The ``maxbatch/probes`` group: one row per probe, in the order they ran."""
    return {
        "maxbatch/probes/batch": np.array([p.batch for p in probes], dtype=np.int64),
        "maxbatch/probes/status": np.array([p.status for p in probes], dtype=object),
        "maxbatch/probes/alloc_retries": np.array([p.alloc_retries for p in probes], dtype=np.int64),
        "maxbatch/probes/peak_active_gib": np.array([p.peak_active_gib for p in probes], dtype=np.float64),
        "maxbatch/probes/peak_reserved_gib": np.array([p.peak_reserved_gib for p in probes], dtype=np.float64),
        "maxbatch/probes/reason": np.array([p.reason for p in probes], dtype=object),
        "maxbatch/probes/seconds": np.array([p.seconds for p in probes], dtype=np.float64),
    }


def _write_datasets(f: Any, datasets: dict[str, np.ndarray]) -> None:
    import h5py

    for name, arr in datasets.items():
        if arr.dtype == object:
            f.create_dataset(name, data=arr.astype(str).tolist(), dtype=h5py.string_dtype())
        else:
            f.create_dataset(name, data=arr)


def search_attrs(res: SearchResult, max_retries: int, cap: int | None, planned: int | None) -> dict[str, Any]:
    """The search as record attributes (results/record.py, MaxBatch)."""
    return {
        MaxBatch.max_batch: res.max_batch if res.max_batch is not None else 0,
        MaxBatch.maxbatch_probes: len(res.probes),
        MaxBatch.maxbatch_start: res.start,
        MaxBatch.maxbatch_planned: planned if planned is not None else 0,  # 0 = no prediction
        MaxBatch.maxbatch_capped: res.capped,
        MaxBatch.maxbatch_cap: cap or 0,
        MaxBatch.maxbatch_max_retries: max_retries,
    }


def final_retry_attrs(final: Path, batch: int, max_retries: int, rung_steps: int, probe_steps: int) -> dict[str, Any]:
    """The full rung's allocator retries after warm-up, and a note when they exceed the threshold."""
    from scaleladder.results.store import read_attrs

    retries = int(read_attrs(final).get(Memory.alloc_retries, 0) or 0)
    attrs: dict[str, Any] = {MaxBatch.maxbatch_final_retries: retries}
    if retries > max_retries:
        attrs[MaxBatch.maxbatch_note] = (f"the full rung at b={batch} ({rung_steps} steps) had {retries} allocator retries after "
                                  f"warm-up, over the threshold {max_retries} its {probe_steps}-step probe stayed within: "
                                  f"b={batch} is at the edge")
    return attrs


def record_result(final: Path, out: Path, spec: RunSpec, attrs: dict[str, Any], probes: list[ProbeResult]) -> None:
    """Copy the final run's file onto ``out`` with the search's attributes and probes, atomically."""
    import h5py

    from scaleladder.results.store import attr_value, h5_in_memory

    # The rung is the `max` rung: its spec stays b'max'; `batch` is the batch it ran at.
    added = checked({**attrs, Spec.spec: spec.path, Spec.batch: str(attrs[MaxBatch.max_batch])}, OK)
    # in memory, then written by Python: a full disk is one line, not an HDF5 crash (results.store)
    with h5py.File(final, "r") as src, h5_in_memory(out) as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        for name in src:
            src.copy(src[name], dst, name=name)
        for k, v in added.items():
            dst.attrs[k] = attr_value(v)
        _write_datasets(dst, probes_datasets(probes))


def record_oom(cfg: Any, world: int, attrs: dict[str, Any], probes: list[ProbeResult]) -> None:
    """Not even batch 1 trains: a status ``oom`` record carrying the probes."""

    from scaleladder.results.store import attr_value, h5_in_memory
    from scaleladder.rung import provenance

    reason = probes[-1].reason if probes else "out of memory"
    rec = checked({Record.status: "oom", **cfg.attrs(), Build.world_size: world, Oom.error: f"batch 1 does not train: {reason}",
                   **{k: v for k, v in provenance.collect("").items() if k != Placement.device_name}, **attrs}, OOM)
    with h5_in_memory(cfg.out) as f:
        for k, v in rec.items():
            f.attrs[k] = attr_value(v)
        _write_datasets(f, probes_datasets(probes))


# -- CLI ---------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    from scaleladder.rung.run_config import add_arguments as add_run_arguments

    add_run_arguments(p)
    p.add_argument("--launcher", default="", help="command prefix that starts the ranks, as for `scaleladder launch` (empty: one local process)")
    p.add_argument("--plan-device", default="", help="planner device key: start the search at the predicted max batch "
                   "(needs --ranks-per-node)")
    p.add_argument("--ranks-per-node", default=None, help="ranks per node, as the launcher starts them: the planner's world "
                   "is nodes × this (required with --plan-device)")
    p.add_argument("--run-predicted-oom", action="store_true", help="search even when the planner predicts batch 1 will not fit")
    p.add_argument("--max-retries", default="0", help="allocator retries after warm-up a probe may have and still pass (default 0)")
    p.add_argument("--max-batch-cap", default=None, help="never probe above this batch (the search's only end on a CPU)")
    p.add_argument("--probe-steps", default="5", help="steps per probe, warm-up included (default 5)")
    p.add_argument("--probe-warmup", default="2", help="warm-up steps per probe, excluded from its retry count (default 2)")
    p.add_argument("--keep-probes", action="store_true", help="keep the probes' HDF5 files, probe-b<N>.h5, in the folder "
                   ".<name of --out>.maxbatch/ next to --out (default: removed)")


def probe_dir(out: Path) -> Path:
    """Where the probes run (and stay with --keep-probes): a hidden folder next to the result."""
    return out.with_name(f".{out.name}.maxbatch")


def main(args: argparse.Namespace) -> int:
    from scaleladder.campaign.supervise import launch
    from scaleladder.rung.run_config import config_from_args

    cfg = config_from_args(args)
    if cfg.spec.batch != "max":
        raise SpecError(f"maxbatch searches the batch: the spec must end in /bmax, got {cfg.spec.path!r}")
    if args.plan_device and args.ranks_per_node is None:
        raise SpecError("--plan-device needs --ranks-per-node (the planner plans nodes × ranks-per-node ranks)")
    rpn = None if args.ranks_per_node is None else parse_positive("ranks-per-node", args.ranks_per_node)
    try:
        max_retries = int(args.max_retries)
    except ValueError:
        raise SpecError(f"--max-retries must be an integer >= 0, got {args.max_retries!r}") from None
    if max_retries < 0:
        raise SpecError(f"--max-retries must be an integer >= 0, got {args.max_retries!r}")
    cap = None if args.max_batch_cap is None else parse_positive("max-batch-cap", args.max_batch_cap)
    steps, warmup = parse_steps_warmup(args.probe_steps, args.probe_warmup, prefix="--probe-")
    planned, hopeless = None, False
    if args.plan_device and rpn is not None:  # (rpn is required with --plan-device: checked above)
        planned, hopeless = planned_start(cfg.spec, args.plan_device, rpn, cfg.data)
    if hopeless and not args.run_predicted_oom and rpn is not None:
        from scaleladder.campaign.supervise import record_predicted_oom

        # The same verdict `launch --plan-device` records for a fixed batch: no probe is spent.
        if record_predicted_oom(cfg, args.plan_device, rpn, "maxbatch"):
            return 0

    def log(msg: str) -> None:
        _log.info(f"scaleladder maxbatch: {cfg.spec.path}: {msg}")

    workdir = probe_dir(cfg.out)
    workdir.mkdir(parents=True, exist_ok=True)
    temp_final = workdir / "final.h5"  # the full rung's own run; never a probe's file
    try:
        log(f"start at b={planned or 1}" + (f" (planner, {args.plan_device})" if planned else "") + (f", cap {cap}" if cap else ""))
        try:
            res = search(launcher_probe(cfg, args.launcher, workdir, steps, warmup, full_at=cap), planned, cap, max_retries, log)
        except ProbeError as e:
            log(str(e))
            return 1
        attrs = search_attrs(res, max_retries, cap, planned)
        if res.max_batch is None:
            record_oom(cfg, _world(res.probes, workdir, cfg.spec.nodes * (rpn or 1)), attrs, res.probes)
            log(f"not even batch 1 trains; recorded as 'oom' in {cfg.out}")
            return 0
        log(f"max batch {res.max_batch}{' (the cap)' if res.capped else ''} after {len(res.probes)} probes")
        probe_file = workdir / f"probe-b{res.max_batch}.h5"
        if ((steps, warmup) == (cfg.steps, cfg.warmup) or res.max_batch == cap) and probe_file.is_file():
            final = probe_file  # the passing probe already WAS the full rung: same command, same steps
        else:
            log(f"running the rung at b={res.max_batch}")
            final = temp_final
            rung = dataclasses.replace(cfg, spec=dataclasses.replace(cfg.spec, batch=res.max_batch), out=final)
            rc = launch(rung, args.launcher)
            if rc != 0 or not final.is_file():
                log(f"the rung at b={res.max_batch} failed (exit {rc}); no result written")
                return rc or 1
        attrs.update(final_retry_attrs(final, res.max_batch, max_retries, cfg.steps, steps))
        if MaxBatch.maxbatch_note in attrs:
            log(str(attrs[MaxBatch.maxbatch_note]))
        record_result(final, cfg.out, cfg.spec, attrs, res.probes)
        log(f"-> {cfg.out}")
        return 0
    finally:
        if args.keep_probes:
            temp_final.unlink(missing_ok=True)  # only the rung's temporary copy: every probe stays
            log(f"probes kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _world(probes: list[ProbeResult], workdir: Path, fallback: int) -> int:
    """The world the probes ran on, as their own records say (the launcher decides it)."""
    from scaleladder.results.store import read_attrs

    for p in reversed(probes):
        f = workdir / f"probe-b{p.batch}.h5"
        if f.is_file():
            return int(read_attrs(f).get(Build.world_size, fallback) or fallback)
    return fallback
