"""`scaleladder run`: one rung, on every rank. Spec → model → parallelize → loop → HDF5.

This is the per-rank program. It runs as a single process, under ``torchrun``,
or under ``srun`` (rung/launch.py reads whichever variables are there). Rank 0 writes
the result file; no rank writes anything else except an OOM marker.

Exit codes: 0 (ok, or an OOM recorded as a result in a one-rank run), 2 (bad
input: one line naming the culprit, no file), 3 (this rank ran out of memory in a
multi-rank run: marker written, the supervisor records it), 1 (anything else).
Under a launcher every rank finds the same bad input; only rank 0 prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scaleladder.flavors import Flavor

# TRAP: no torch at import time: `scaleladder run --help` and a bad argument answer at once, and
# the start-up clock (rung/startup.py) times the imports as a phase of their own. The rank-side
# functions import torch themselves; tests/test_startup.py checks that importing this module
# loads no torch.
from scaleladder.log import get_logger
from scaleladder.models.families import family_of  # torch-free: the family's methods import torch themselves
from scaleladder.rung import startup
from scaleladder.rung.oom_record import EXIT_OOM, oom_marker, write_oom_record
from scaleladder.rung.run_config import RunConfig, config_from_args
from scaleladder.rung.run_config import add_arguments as add_arguments  # the CLI's `run` (cli.COMMANDS)
from scaleladder.spec import RunSpec, SpecError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import torch

    from scaleladder.models.flops import FlopCount
    from scaleladder.rung.batches import SyntheticBatches
    from scaleladder.rung.feed import Batch, DeviceFeed
    from scaleladder.rung.launch import DistEnv
    from scaleladder.rung.loop import Measurement, RungOptimizer
    from scaleladder.rung.parallelize import WrapReport
    from scaleladder.rung.precision import PrecisionPolicy

_log = get_logger(__name__)
CLOCK = startup.StartupClock()  # this rank's start-up phases (rung/startup.py)


def _terminate(signum: int, _frame: Any) -> None:
    # Slurm sends SIGTERM at a time limit. Raising lets `finally` blocks remove
    # temporary files, so an interrupted rung leaves nothing behind.
    raise SystemExit(128 + signum)


def main(args: argparse.Namespace) -> int:
    from scaleladder.data.data_errors import DataError, speaker
    from scaleladder.rung import launch

    env = launch.detect()  # no process group yet: bad input must fail before one exists
    try:
        return _main(args, env)
    except SpecError as e:
        speaks = speaker(e)  # decided by preflight.agreed, which saw every rank's verdict
        if speaks is None:
            # Every rank reads the same arguments and finds the same fault: rank 0's one
            # line is the message, N copies (and the launcher's per-rank report) are noise.
            # Not so for data: each rank reads its own shards, and only it can name a bad one.
            # A missing GPU is a node's fault (an old driver, a bad --gpus-per-task on one
            # node): the first rank of each node names it, once per node.
            speaks = env.rank == 0 or isinstance(e, DataError) or (isinstance(e, launch.NoGPUError) and env.local_rank == 0)
        if not speaks:
            # TRAP: the launcher kills the other ranks as soon as one exits (torchrun at
            # once, srun --kill-on-bad-exit): a silent rank that exits first can take the
            # speaker's only line with it. A moment's grace lets the speaker print and
            # exit first, so the launcher also names it as the root cause.
            import time

            time.sleep(2.0)
            raise SystemExit(2) from None
        raise  # cli.py prints it: one line, exit 2


def check_world(cfg: RunConfig, world: int, nodes: int) -> None:
    """What the launcher started must be what the spec says."""
    cfg.spec.strategy.check_world(world)
    if nodes != cfg.spec.nodes:
        raise SpecError(f"the spec says n{cfg.spec.nodes} but the launcher started ranks on {nodes} node(s)")


def _main(args: argparse.Namespace, env: DistEnv) -> int:
    from scaleladder.rung import launch

    cfg = config_from_args(args)
    if cfg.spec.batch == "max":
        raise SpecError("batch 'max' is searched by `scaleladder maxbatch`, not `run`")
    check_world(cfg, env.world, env.nodes)
    if cfg.tensorboard:  # a missing package: one line now, not after training
        from scaleladder.results.trackers import require

        require("tensorboard", "tensorboard", "--tensorboard")
    family = family_of(cfg.flavor)
    startup.import_rank_modules(family)
    CLOCK.mark("imports")
    if env.rank == 0:  # the writer: a read-only or full results/ fails now, not after training
        from scaleladder.results.store import check_writable, record_bytes

        check_writable(cfg.out, record_bytes(cfg.steps))
    launch.check_master(env)  # an unresolvable master or a port in use: one line, before any group
    signal.signal(signal.SIGTERM, _terminate)
    device = launch.pick_device(env, cfg.device)
    if cfg.memory_snapshot and device.type != "cuda":  # --device auto found no GPU
        from scaleladder.rung.profiling import check_profiling

        check_profiling(cfg.trace_steps, cfg.memory_snapshot, cfg.steps, cfg.warmup, device.type)
    # Before the group exists: the unused-parameter probe runs a CPU forward, and FLAVA's
    # contrastive loss all-gathers whenever a group exists. An NCCL/RCCL group serves
    # only GPU tensors ("No backend type associated with device type cpu"); gloo serves
    # both, so only the order keeps this off the GPU path (rung.unused_params.unused_parameter_names).
    # A family that freezes nothing (Family.freezes_unused) has nothing to probe.
    from scaleladder.rung.unused_params import unused_parameter_names

    if family.freezes_unused:
        unused_parameter_names(family.name)
    launch.init(env, device)
    CLOCK.mark("group")
    try:
        return _run_rank(RankContext(cfg, env, device))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def placement(env: DistEnv, device: torch.device, hosts: list[str]) -> dict[str, Any]:
    """Where the rung ran, as record attributes: the same keys in ok and oom records."""
    from scaleladder.results.record import Placement as P
    from scaleladder.rung.device_peak import device_name

    return {
        P.device_name: device_name(device),
        P.hosts: hosts,
        P.ranks_per_node: env.local_world,
        P.gpus_per_node: env.local_world if device.type == "cuda" else 0,  # one rank per GPU (GCD)
        P.launcher: env.source,
    }


@dataclass(frozen=True)
class RankContext:
    """One rank's run: the rung, this rank's place in the world, its device."""

    cfg: RunConfig
    env: DistEnv
    device: torch.device


def _run_rank(ctx: RankContext) -> int:
    from scaleladder.rung import provenance
    from scaleladder.rung.loop import OOMDuringStep, is_oom, oom_line

    cfg, env = ctx.cfg, ctx.env
    # Gathered before anything can run out of memory, so an OOM record names the hosts too.
    # ... and every rank's host, address, node index and local rank, with the rendezvous used
    where = {**placement(env, ctx.device, provenance.hosts()), **provenance.rank_placement(env)}
    try:
        return _train_and_record(ctx, where)
    except Exception as e:
        if not (isinstance(e, OOMDuringStep) or is_oom(e)):
            raise
        step = getattr(e, "step", -1)
        event = {"rank": env.rank, "world": env.world, "step": step, "error": oom_line(e), "host": os.uname().nodename, **where}
        if env.world == 1:
            write_oom_record(cfg, [event], world=1)
            print(f"scaleladder run: {cfg.spec.path}: out of memory at step {step}; recorded as status 'oom' in {cfg.out}", file=sys.stderr)
            return 0
        marker = oom_marker(cfg.out, env.rank)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(event))
        print(f"scaleladder run: rank {env.rank}: out of memory at step {step}", file=sys.stderr)
        sys.stderr.flush()
        # Other ranks are blocked in a collective this rank will never join; exiting
        # hard lets the launcher (torchrun, srun --kill-on-bad-exit) stop them.
        os._exit(EXIT_OOM)


def build_wrapped(cfg: RunConfig, init: str, device: torch.device, prec: PrecisionPolicy) -> tuple[torch.nn.Module, WrapReport, int]:
    """The model of ``cfg`` on ``device``, through apply_strategy: (wrapped, wrap report, params)."""
    import torch

    from scaleladder.models.build import build_model, count_parameters
    from scaleladder.models.init import make_param_init_fn, materialize
    from scaleladder.rung.parallelize import apply_strategy

    spec, flavor = cfg.spec, cfg.flavor
    family = family_of(flavor)
    torch.manual_seed(cfg.seed)  # same weights on every rank, whatever the strategy
    param_init_fn = None
    if init == "meta":
        model = build_model(flavor, "meta", flava_impl=cfg.flava_impl)
        loaded = _codebook_state(model, family.codebook_prefix, cfg.codebook_weights)  # copied in as each module is allocated
        if spec.strategy.is_fsdp:  # both generations materialise per unit, just before sharding it
            param_init_fn = make_param_init_fn(model, device, loaded, family.reset_parameters)
        else:
            materialize(model, device, loaded, family.reset_parameters)
    else:
        model = build_model(flavor, device, cfg.codebook_weights, cfg.flava_impl)
    params = count_parameters(model)
    if prec.storage_dtype != torch.float32:
        model = model.to(dtype=prec.storage_dtype)
    wrapped, report = apply_strategy(model, spec.strategy, spec.knobs, prec, device, param_init_fn,
                                     cfg.compile_backend or "inductor")
    return wrapped, report, params


def _codebook_state(model: Any, prefix: str, weights: str | None) -> dict[str, torch.Tensor] | None:
    """The local codebook weights under their names in ``model`` (None without a file): the
    encoder of the codebook at ``prefix`` (the family's ``codebook_prefix``; run_config refuses
    ``--codebook-weights`` for a family without one)."""
    if not weights:
        return None
    from scaleladder.models.build import read_codebook_state

    state = read_codebook_state(model.get_submodule(prefix.rstrip(".")), Path(weights))
    return {f"{prefix}encoder.{k}": v for k, v in state.items()}


@dataclass
class Built:
    """What the build step made for the loop: the wrapped model, its optimizer and batches."""

    flavor: Flavor
    prec: PrecisionPolicy
    init: str  # "device" or "meta"
    source: SyntheticBatches | DeviceFeed  # a DeviceFeed carries the loader's wait and rate
    data_attrs: dict[str, Any]  # what the record says about the data beyond --data
    wrapped: torch.nn.Module
    report: WrapReport  # what wrapping did
    params: int
    optimizer: RungOptimizer
    scaler: torch.amp.GradScaler | None  # fp16-mixed only (FSDP1's sharded scaler is a GradScaler too)
    flops: FlopCount  # FLOPs per sample, model and hardware
    batches: Iterator[Batch]  # the source again, its first batch peeked at and put back


def _train_and_record(ctx: RankContext, where: dict[str, Any]) -> int:
    built = _build(ctx)
    m, profiled, steps_done = _measure(ctx, built)
    if ctx.env.rank != 0:
        return 0
    return _record(ctx, built, m, profiled, where, steps_done)


def _build(ctx: RankContext) -> Built:
    """Data source, model (through apply_strategy), optimizer and scaler; the first batch's FLOPs."""
    from scaleladder.rung.optim import make_optimizer, make_scaler
    from scaleladder.rung.precision import policy

    cfg, spec, flavor = ctx.cfg, ctx.cfg.spec, ctx.cfg.flavor
    prec = policy(spec.precision)
    prec.apply_backend_flags()
    batch = int(spec.batch)
    source, data_attrs = _batches(ctx, flavor, batch, prec.storage_dtype)

    init = _init_mode(ctx, flavor)
    if ctx.env.rank == 0:  # a big model builds, shards and warms up for minutes before its first step
        _log.info(f"scaleladder run: {spec.path}: building {spec.model} ({init} init) on {world_text(ctx.env, ctx.device)} ...")
    wrapped, report, params = build_wrapped(cfg, init, ctx.device, prec)
    optimizer = make_optimizer(wrapped.parameters(), cfg.lr, spec.precision)
    scaler = make_scaler(spec.precision, spec.strategy, ctx.device)
    CLOCK.mark("build")

    first, batches = _peek(source)
    CLOCK.mark("first_batch")
    flops = _flops(flavor, spec, batch * ctx.env.world, first, cfg.flava_impl)
    return Built(flavor, prec, init, source, data_attrs, wrapped, report, params, optimizer, scaler, flops, batches)


def _measure(ctx: RankContext, built: Built) -> tuple[Measurement, dict[str, Any], float]:
    """The loop: (its measurements, the profiler's record attributes, when the last step ended)."""
    from scaleladder.rung.loop import train_loop
    from scaleladder.rung.profiling import StepProfiler

    cfg, spec, device = ctx.cfg, ctx.cfg.spec, ctx.device
    wrapped, optimizer, batches, prec, scaler = built.wrapped, built.optimizer, built.batches, built.prec, built.scaler
    # off by default: a trace of steps after warm-up, an allocator snapshot (rung/profiling.py)
    with StepProfiler(cfg.trace_steps, cfg.memory_snapshot, cfg.warmup, cfg.out, device, ctx.env.rank) as profiler:
        m = train_loop(wrapped, optimizer, profiler.wrap(batches), steps=cfg.steps, warmup=cfg.warmup, prec=prec,
                       device=device, scaler=scaler, compiled=spec.strategy.compile, label=spec.path,
                       progress_s=cfg.progress_s)
    return m, profiler.attrs(), time.monotonic()


def ok_attrs(ctx: RankContext, built: Built, m: Measurement, where: dict[str, Any]) -> dict[str, Any]:
    """The ok record's attributes from the loop's measurements (names: results/record.py)."""
    from scaleladder.results.record import Build, Compile, Memory, Peak, Placement, Record, Throughput
    from scaleladder.results.stats import within_run
    from scaleladder.rung import provenance
    from scaleladder.rung.device_peak import rank_device_peak_flops
    from scaleladder.rung.loop import host_attrs
    from scaleladder.rung.what_ran import sharding_ran

    cfg, spec, world, report = ctx.cfg, ctx.cfg.spec, ctx.env.world, built.report
    samples_per_s = int(spec.batch) * world * m.measured_steps / m.window_s
    items_per_sample = family_of(built.flavor).items_per_sample
    peak = rank_device_peak_flops(ctx.device, spec.precision, cfg.peak_tflops)
    per_device = built.flops.model * samples_per_s / world
    measured = m.step_time_s[cfg.warmup:]
    attrs: dict[str, Any] = {
        Record.status: "ok",
        **cfg.attrs(),
        Build.world_size: world,
        Build.params: built.params,
        Build.frozen_unused_params: report.frozen_unused_params,
        Build.fsdp_units: report.fsdp_units,
        Build.fsdp_layer_units: report.fsdp_layer_units,
        Build.ac_layers: report.ac_layers,
        Build.compiled_layers: report.compiled_layers,
        # what the wrapper actually did, read from the wrapped model (FSDP1 at world size 1
        # is NO_SHARD whatever the spec says: rung.what_ran.sharding_ran)
        **sharding_ran(built.wrapped),
        Build.init: built.init,
        **built.data_attrs,
        **provenance.collect(where[Placement.device_name]),
        **provenance.peak_attrs(ctx.device, spec.precision, cfg.peak_tflops),
        **where,
        Throughput.flops_per_sample: built.flops.model,
        Throughput.hardware_flops_per_sample: built.flops.hardware,
        Throughput.samples_per_s: samples_per_s,
        Throughput.items_per_s: samples_per_s * items_per_sample,
        Throughput.items_per_sample: items_per_sample,
        Throughput.window_s: m.window_s,
        Throughput.step_time_mean_s: float(measured.mean()),
        Throughput.step_time_median_s: float(np.median(measured)),
        Throughput.step_time_p90_s: float(np.percentile(measured, 90)),
        # the interval of items_per_s over the window's steps (results/stats.py, docs/metrics.md)
        **within_run(m.step_time_s, cfg.warmup, samples_per_s * items_per_sample),
        Throughput.tflops_per_device: per_device / 1e12,
        Peak.peak_tflops_per_device: peak / 1e12,
        Throughput.mfu: per_device / peak,
        Throughput.hfu: built.flops.hardware * samples_per_s / world / peak,
        Throughput.final_loss: float(m.loss[-1]),
        Memory.peak_active_gib: float(m.peak_active_bytes.max()) / 2**30,
        Memory.peak_reserved_gib: float(m.peak_reserved_bytes.max()) / 2**30,
        Memory.peak_device_used_gib: float(m.peak_device_used_bytes.max()) / 2**30,
        Memory.device_total_gib: float(m.device_total_bytes.max()) / 2**30,
        Memory.alloc_retries: int(m.alloc_retries.sum()),
        Memory.ooms: int(m.ooms.sum()),
    }
    if spec.strategy.compile:  # absent, not NaN, on eager rungs: they compiled nothing
        attrs[Compile.compile_s] = m.compile_s
        attrs[Compile.compile_graphs] = m.compile_graphs
    attrs.update(host_attrs(m, cfg.warmup))  # GPU rungs: host-boundness (absent on the CPU)
    return attrs


def _tensorboard(cfg: RunConfig, attrs: Mapping[str, object], datasets: Mapping[str, np.ndarray]) -> None:
    """The record's per-step scalars as TensorBoard events (results/trackers/tensorboard_events.py),
    after the record is written: a tracker that fails (a full disk) costs one warning line, never the result."""
    from scaleladder.results.trackers import tensorboard_events

    try:
        where = tensorboard_events.write(str(cfg.tensorboard), cfg.spec.path, attrs, datasets)
    except Exception as e:  # any failure of the tracker: the record is already safe
        print(f"scaleladder run: warning: TensorBoard events not written ({type(e).__name__}: {e}); the record is written", file=sys.stderr)
        return
    print(f"scaleladder run: TensorBoard events -> {where}", file=sys.stderr)


def _record(ctx: RankContext, built: Built, m: Measurement, profiled: dict[str, Any], where: dict[str, Any], steps_done: float) -> int:
    """Rank 0: the ok record (attributes and per-step datasets), written atomically, and its line."""
    from scaleladder.results.record import Memory, Throughput
    from scaleladder.results.store import write_record
    from scaleladder.rung.feed import DeviceFeed

    cfg = ctx.cfg
    # the trace / snapshot files written next to the record, when asked for
    attrs = {**ok_attrs(ctx, built, m, where), **profiled}
    datasets = {
        "step_time_s": m.step_time_s,
        "loss": m.loss,
        "memory/peak_active_bytes": m.peak_active_bytes,
        "memory/peak_reserved_bytes": m.peak_reserved_bytes,
        "memory/num_alloc_retries": m.alloc_retries,
        "memory/num_ooms": m.ooms,
        "memory/warmup_peak_active_bytes": m.warmup_peak_active_bytes,
        "memory/peak_device_used_bytes": m.peak_device_used_bytes,
        "host_issue_s": m.host_issue_s,  # per step: the host's time to issue it (docs/metrics.md)
    }
    if isinstance(built.source, DeviceFeed):
        datasets["loader_wait_s"] = built.source.wait_s
        attrs.update(built.source.record_attrs(m.step_time_s[cfg.warmup:], cfg.warmup))  # loader rate, input_bound
    attrs.update(CLOCK.attrs(teardown_s=time.monotonic() - steps_done))  # docs/metrics.md, "Start-up"
    write_record(cfg.out, attrs, datasets)
    if cfg.tensorboard:
        _tensorboard(cfg, attrs, datasets)
    print(
        f"{cfg.spec.path}: {attrs[Throughput.items_per_s]:.1f} items/s, step {attrs[Throughput.step_time_mean_s] * 1e3:.1f} ms, "
        f"MFU {attrs[Throughput.mfu]:.3f}, peak active {attrs[Memory.peak_active_gib]:.2f} GiB, "
        f"loss {attrs[Throughput.final_loss]:.4f} -> {cfg.out}",
        file=sys.stderr,
    )
    return 0


def world_text(env: DistEnv, device: torch.device) -> str:
    return f"{env.world} rank(s), {device.type}"


def _init_mode(ctx: RankContext, flavor: Flavor) -> str:
    cfg, device = ctx.cfg, ctx.device
    if cfg.init != "auto":
        return cfg.init
    # FSDP1 and FSDP2 both materialise a meta model one unit at a time (rung.parallelize).
    if device.type != "cuda" or not cfg.spec.strategy.is_fsdp:
        return "device"
    import torch

    from scaleladder.models.build import meta_parameter_count

    # Build on meta when the unsharded fp32 model would take over a quarter of the GPU.
    fp32_bytes = 4 * meta_parameter_count(flavor)
    return "meta" if fp32_bytes > 0.25 * torch.cuda.get_device_properties(device).total_memory else "device"


def _batches(ctx: RankContext, flavor: Flavor, batch: int, dtype: torch.dtype) -> tuple[SyntheticBatches | DeviceFeed, dict[str, Any]]:
    """The rank's batches, and what the record should say about them beyond --data."""
    cfg, env, device = ctx.cfg, ctx.env, ctx.device
    if cfg.data == "synthetic":
        from scaleladder.rung.batches import SyntheticBatches

        return SyntheticBatches(flavor, batch, env.rank, cfg.steps, cfg.seed, device, dtype=dtype), {}
    from scaleladder.data.cores import loader_workers
    from scaleladder.data.loader import make_loader
    from scaleladder.rung.feed import DeviceFeed

    # Loader batches stay uint8 (or JPEG bytes) in pinned host memory; DeviceFeed copies them
    # one step ahead on a side stream, where the loader's device transform normalises them in
    # fp32 and the feed casts to the rung's dtype (rung/feed.py, data/devnorm.py).
    workers, worker_cores, core_attrs = loader_workers(cfg.workers, env.local_rank, env.local_world, cfg.decode, env.rank == 0)
    loader = make_loader(cfg.data, flavor, batch, env.rank, env.world, cfg.steps, workers, cfg.seed, pin_memory=device.type == "cuda",
                         decode=cfg.decode, transport=cfg.transport, worker_cores=worker_cores)
    loader.extra_attrs.update(core_attrs)
    return DeviceFeed(loader, device, dtype, cfg.steps, decoder=loader.device_transform(device)), loader.record_attrs()


def _peek(batches: Iterable[Batch]) -> tuple[Batch, Iterator[Batch]]:
    import itertools

    it = iter(batches)
    first = next(it)
    return first, itertools.chain([first], it)


def _flops(flavor: Flavor, spec: RunSpec, global_batch: int, first: Batch, flava_impl: str) -> FlopCount:
    """FLOPs per sample: the family's own count (an analytic one: models/flops.py), else counted by
    FlopCounterMode on the first batch, on a copy of the model built on meta (models/flops.py's
    ``counted_flops`` says what is counted)."""
    import torch

    from scaleladder.models.flops import counted_flops

    # HFU counts a recomputed forward under -ac/-ac-reentrant; -sac keeps every matmul's output
    # and recomputes only elementwise work, which no FLOP count here includes.
    recompute = spec.strategy.ac and not spec.strategy.selective
    family = family_of(flavor)
    options = {"flava_impl": flava_impl}
    found = family.flops(flavor, recompute, first, global_batch, options)
    if found is not None:
        return found
    with torch.random.fork_rng(devices=[]):  # a build may draw from the RNG: the rung's stays as it was
        model = family.build(flavor, "meta", options)
    return counted_flops(model, [b for stack in family.stacks(model) for b in stack], first, recompute, flavor.name)
