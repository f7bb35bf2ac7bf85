"""`scaleladder run`: one rung, on every rank. Spec → model → ladder → loop → HDF5.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# TRAP: no torch at import time. `launch`, `finalize` and `maxbatch` import this module for
# RunConfig and its arguments, and only spawn the ranks: importing torch there cost every
# rung seconds (docs/performance.md, "Start-up"). The rank-side functions import it
# themselves; tests/test_startup.py checks that importing this module loads no torch.
from scaleladder.log import get_logger
from scaleladder.models.flavors import Flavor, get_flavor
from scaleladder.rung import startup
from scaleladder.spec import (
    COMPILE_BACKENDS,
    RunSpec,
    SpecError,
    default_knobs,
    parse_batch,
    parse_knobs,
    parse_nonnegative,
    parse_positive,
    parse_precision,
    parse_steps_warmup,
    parse_strategy,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import torch

    from scaleladder.models.flops import FlopCount
    from scaleladder.rung.batches import SyntheticBatches
    from scaleladder.rung.feed import Batch, DeviceFeed
    from scaleladder.rung.parallelize import WrapReport
    from scaleladder.rung.launch import DistEnv
    from scaleladder.rung.loop import Measurement, RungOptimizer
    from scaleladder.rung.precision import PrecisionPolicy

_log = get_logger(__name__)
EXIT_OOM = 3
CLOCK = startup.StartupClock()  # this rank's start-up phases (rung/startup.py)


@dataclass(frozen=True)
class RunConfig:
    """A rung plus how long to run it and where its data and result live."""

    spec: RunSpec
    steps: int
    warmup: int
    data: str  # "synthetic", a manifest path, or the shard directory holding manifest.json
    workers: int | str  # a count, or "auto" (resolved on each rank from its cores: data/cores.py)
    seed: int
    lr: float
    out: Path
    device: str
    codebook_weights: str | None
    peak_tflops: float | None
    init: str
    compile_backend: str = ""  # the torch.compile backend of a -compile rung ("" otherwise)
    decode: str = "cpu"  # --data rungs: JPEG decode in the loader workers ("cpu") or on the device ("gpu")
    trace_steps: int = 0  # torch.profiler trace of this many steps after warm-up (rung/profiling.py)
    memory_snapshot: bool = False  # CUDA allocator memory snapshot of the loop (rung/profiling.py)
    flava_impl: str = "sdpa"  # FLAVA's implementation (models/flava_impl.py); ignored by ViT rungs
    transport: str = "uint8"  # --data rungs, decode cpu: the workers' images as uint8 (normalised on the device) or float32
    # The spec's flavor, resolved once here (RunSpec has checked the name): not an argument,
    # so argv and the constructor are unchanged, and dataclasses.replace resolves it again.
    flavor: Flavor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flavor", get_flavor(self.spec.model))  # frozen: set once, here

    def argv(self, **override: Any) -> list[str]:
        """The `run` arguments that reproduce this config (used by launch and maxbatch)."""
        spec = override.get("spec", self.spec)
        out = override.get("out", self.out)
        args = ["--spec", spec.path, "--steps", str(override.get("steps", self.steps)), "--warmup", str(override.get("warmup", self.warmup)),
                "--data", self.data, "--workers", str(self.workers), "--seed", str(self.seed), "--lr", repr(self.lr),
                "--out", str(out), "--device", self.device, "--init", self.init]
        if self.codebook_weights:
            args += ["--codebook-weights", self.codebook_weights]
        if self.peak_tflops is not None:
            args += ["--peak-tflops", repr(self.peak_tflops)]
        if self.decode != "cpu":
            args += ["--decode", self.decode]
        if self.compile_backend:
            args += ["--compile-backend", self.compile_backend]
        if self.trace_steps:
            args += ["--trace-steps", str(self.trace_steps)]
        if self.memory_snapshot:
            args += ["--memory-snapshot"]
        if self.flava_impl != "sdpa":
            args += ["--flava-impl", self.flava_impl]
        if self.transport != "uint8":
            args += ["--transport", self.transport]
        return args

    def attrs(self) -> dict[str, Any]:
        """The spec and these settings as record attributes (results/record.py: Spec, Settings)."""
        from scaleladder.models.flava_impl import recorded
        from scaleladder.results.record import Settings as S

        return {**self.spec.as_attrs(), S.steps: self.steps, S.warmup: self.warmup, S.data: self.data, S.seed: self.seed,
                S.lr: self.lr, S.compile_backend: self.compile_backend,
                S.flava_impl: recorded(self.flavor.family, self.flava_impl)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the rung (either --spec, or the parts)")
    g.add_argument("--spec", help="model/strategy/precision/knobs/n<nodes>/b<batch>, e.g. vit-base/fsdp-full/bf16-mixed/pre-lag/n1/b32")
    g.add_argument("--model")
    g.add_argument("--strategy", default=None,
                   help="single|ddp|fsdp-{full,grad-op,no-shard,hybrid<g>}|fsdp2-{full,grad-op,hybrid<g>}, then [-ac], then [-compile] (not fsdp-*)")
    g.add_argument("--precision", default=None, help="fp32|tf32|bf16-mixed|fp16-mixed|bf16-true (default fp32; bf16 is read as bf16-mixed)")
    g.add_argument("--knobs", default=None,
                   help="FSDP1: <pre|post|none>-<lag|nolag>[-fwd] (default pre-lag); FSDP2: pf0|pf1|pf2 (default pf0)")
    g.add_argument("--nodes", default=None, help="nodes the run spans (default 1; checked against the launcher)")
    g.add_argument("--batch", default=None, help="local (per-rank) batch")
    p.add_argument("--steps", default="1000", help="steps in all, warm-up included (default 1000, the FLAVA seed's)")
    p.add_argument("--warmup", default="100", help="first steps excluded from every figure (default 100)")
    p.add_argument("--data", default="synthetic", help="'synthetic' (batches made on the device), a shard manifest.json, or its directory")
    p.add_argument("--workers", default="4", help="data-loader workers per rank, or 'auto': from the rank's cores "
                   "(sched_getaffinity, Slurm's binding) and the measured per-worker rate (data/cores.py); recorded")
    p.add_argument("--transport", default=os.environ.get("SCALELADDER_LOADER_TRANSPORT", "uint8"), choices=["uint8", "float32"],
                   help="--data rungs: the workers' images cross to the rank as uint8 and are normalised on the device "
                        "(default), or float32, normalised in the workers (the reference); --decode gpu ships JPEGs")
    p.add_argument("--decode", default=os.environ.get("SCALELADDER_DECODE", "cpu"),
                   help="--data rungs: 'cpu' (JPEG decode + transforms in the workers) or 'gpu' "
                   "(workers pass encoded JPEGs; nvJPEG decode and transforms on the device; refused without a GPU); "
                   "default: $SCALELADDER_DECODE (a site profile's loader.decode) or cpu")
    p.add_argument("--seed", default="0", help="integer >= 0: weights, synthetic batches, data order")
    p.add_argument("--lr", default="1e-4", help="AdamW learning rate")
    p.add_argument("--out", required=True, help="result .h5 (written atomically by rank 0)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--init", default="auto", choices=["auto", "device", "meta"], help="build on the device, or on meta then materialise per FSDP unit")
    p.add_argument("--codebook-weights", default=None, help="local DALL-E encoder weights for FLAVA (default: random init)")
    from scaleladder.models.flava_impl import DEFAULT as FLAVA_IMPL
    from scaleladder.models.flava_impl import FLAVA_IMPLS

    p.add_argument("--flava-impl", default=FLAVA_IMPL, choices=list(FLAVA_IMPLS),
                   help="FLAVA rungs: 'sdpa' (fused attention, sync-free losses; the default) or "
                   "'torchmultimodal' (the package's own modules, for comparison); the same parameters and loss (docs/models.md)")
    p.add_argument("--peak-tflops", default=None, type=float, help="peak TFLOP/s of one rank's device, for a device not in the table")
    p.add_argument("--compile-backend", default=None, choices=list(COMPILE_BACKENDS),
                   help="torch.compile backend of a -compile rung (default inductor; aot_eager captures graphs without code generation)")
    from scaleladder.rung.profiling import env_memory_snapshot

    p.add_argument("--trace-steps", default=None,
                   help="torch.profiler trace of this many steps right after the warm-up, to <out>.trace.json (rank 0; default "
                        "$SCALELADDER_TRACE_STEPS, a profile's profiling.trace_steps, or 0: off)")
    p.add_argument("--memory-snapshot", action="store_true", default=env_memory_snapshot(),
                   help="CUDA allocator memory history of the loop, to <out>.memory.pickle (rank 0; GPU only; default "
                        "$SCALELADDER_MEMORY_SNAPSHOT, a profile's profiling.memory_snapshot)")


def config_from_args(a: argparse.Namespace) -> RunConfig:
    """The one place where `run`-style arguments become a RunSpec."""
    parts = (a.model, a.strategy, a.precision, a.knobs, a.nodes, a.batch)
    if a.spec:
        if any(x is not None for x in parts):
            raise SpecError("give either --spec or --model/--strategy/..., not both")
        spec = RunSpec.from_path(a.spec)
    else:
        if a.model is None or a.strategy is None or a.batch is None:
            raise SpecError("--model, --strategy and --batch are required without --spec")
        strategy = parse_strategy(a.strategy)
        spec = RunSpec(a.model, strategy, parse_precision(a.precision or "fp32"),
                       parse_knobs(a.knobs) if a.knobs else default_knobs(strategy),
                       parse_positive("nodes", a.nodes or 1), parse_batch(a.batch))
    steps, warmup = parse_steps_warmup(a.steps, a.warmup)
    if spec.strategy.compile and warmup < 1:
        raise SpecError(f"{spec.strategy} needs --warmup >= 1: its first step compiles, and compile time must stay out of the measured window")
    if a.compile_backend and not spec.strategy.compile:
        raise SpecError(f"--compile-backend applies to -compile strategies only, not {str(spec.strategy)!r}")
    backend = (a.compile_backend or "inductor") if spec.strategy.compile else ""
    if a.data != "synthetic":
        from scaleladder.data.manifest import MANIFEST_FILE, resolve  # the loader's own rule: file, or the directory holding it

        if not resolve(a.data).is_file():
            why = f"a directory with no {MANIFEST_FILE}" if Path(a.data).is_dir() else "no such manifest file or shard directory (or use 'synthetic')"
            raise SpecError(f"--data {a.data!r}: {why}")
    from scaleladder.models.flava_impl import parse_flava_impl

    flava_impl = parse_flava_impl(getattr(a, "flava_impl", None) or "sdpa")
    if a.codebook_weights and not Path(a.codebook_weights).is_file():
        raise SpecError(f"--codebook-weights {a.codebook_weights!r}: no such file")
    if a.codebook_weights and get_flavor(spec.model).family != "flava":
        raise SpecError(f"--codebook-weights applies to FLAVA flavors only, not {spec.model}")
    try:
        lr = float(a.lr)
    except ValueError:
        raise SpecError(f"lr must be a number, got {a.lr!r}") from None
    if a.peak_tflops is not None and not a.peak_tflops > 0:
        raise SpecError(f"--peak-tflops must be > 0, got {a.peak_tflops}")
    out = Path(a.out)
    if out.suffix != ".h5":
        raise SpecError(f"--out {a.out!r} must end in .h5")
    from scaleladder.rung.profiling import check_profiling, env_trace_steps

    given = getattr(a, "trace_steps", None)
    trace_steps = parse_nonnegative("trace-steps", given if given is not None else env_trace_steps())
    if given is None:  # a profile's default for every rung: a short rung (a max-batch probe) traces what it has
        trace_steps = min(trace_steps, max(0, steps - warmup))
    memory_snapshot = bool(getattr(a, "memory_snapshot", False))
    check_profiling(trace_steps, memory_snapshot, steps, warmup, "cpu" if a.device == "cpu" else None)
    workers: int | str = "auto" if str(a.workers) == "auto" else parse_nonnegative("workers", a.workers)
    return RunConfig(spec, steps, warmup, a.data, workers, parse_nonnegative("seed", a.seed),
                     lr, out, a.device, a.codebook_weights, a.peak_tflops, a.init, backend, a.decode, trace_steps, memory_snapshot,
                     flava_impl, transport=getattr(a, "transport", "uint8"))


def oom_marker(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.oom-rank{rank}.json")


def write_oom_record(cfg: RunConfig, events: list[dict[str, Any]], world: int, status: str = "oom",
                     extra: dict[str, Any] | None = None) -> None:
    """A result for a rung that did not fit (attributes: results.oom), written atomically.

    Called by the rank itself in a one-rank run, and by the supervisor (campaign) from
    the markers of a multi-rank one, or for a rung the planner says cannot fit.
    """
    from scaleladder.models.build import meta_parameter_count
    from scaleladder.results.oom import oom_attrs
    from scaleladder.results.store import write_record
    from scaleladder.rung import provenance

    attrs = oom_attrs(cfg.attrs(), cfg.spec.nodes, events, world, meta_parameter_count(cfg.flavor),
                      provenance.collect(""), status, extra)
    write_record(cfg.out, attrs)


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
    startup.import_rank_modules(cfg.flavor.family)
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
    from scaleladder.rung.unused_params import unused_parameter_names

    unused_parameter_names(cfg.flavor.family)
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
    """The model of ``cfg`` on ``device``, through the ladder: (wrapped, ladder report, params)."""
    import torch

    from scaleladder.models.build import build_model, count_parameters
    from scaleladder.models.init import make_param_init_fn, materialize
    from scaleladder.rung.parallelize import apply_strategy

    spec, flavor = cfg.spec, cfg.flavor
    torch.manual_seed(cfg.seed)  # same weights on every rank, whatever the strategy
    param_init_fn = None
    if init == "meta":
        model = build_model(flavor, "meta", flava_impl=cfg.flava_impl)
        loaded = _codebook_state(model, cfg.codebook_weights)  # copied in as each module is allocated
        if spec.strategy.is_fsdp:  # both generations materialise per unit, just before sharding it
            param_init_fn = make_param_init_fn(model, device, loaded)
        else:
            materialize(model, device, loaded)
    else:
        model = build_model(flavor, device, cfg.codebook_weights, cfg.flava_impl)
    params = count_parameters(model)
    if prec.storage_dtype != torch.float32:
        model = model.to(dtype=prec.storage_dtype)
    wrapped, report = apply_strategy(model, spec.strategy, spec.knobs, prec, device, param_init_fn,
                                     cfg.compile_backend or "inductor")
    return wrapped, report, params


def _codebook_state(model: Any, weights: str | None) -> dict[str, torch.Tensor] | None:
    """The local codebook weights under their names in ``model`` (None without a file)."""
    if not weights:
        return None
    from scaleladder.models.build import CODEBOOK_ENCODER, read_codebook_state

    state = read_codebook_state(model.flava.image_codebook, Path(weights))
    return {CODEBOOK_ENCODER + k: v for k, v in state.items()}


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
    """Data source, model (through the ladder), optimizer and scaler; the first batch's FLOPs."""
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
                       device=device, scaler=scaler, compiled=spec.strategy.compile, label=spec.path)
    return m, profiler.attrs(), time.monotonic()


def ok_attrs(ctx: RankContext, built: Built, m: Measurement, where: dict[str, Any]) -> dict[str, Any]:
    """The ok record's attributes from the loop's measurements (names: results/record.py)."""
    from scaleladder.results.record import Build, Compile, Memory, Peak, Placement, Record, Throughput
    from scaleladder.results.stats import within_run
    from scaleladder.rung import provenance
    from scaleladder.rung.device_peak import rank_device_peak_flops
    from scaleladder.rung.what_ran import sharding_ran
    from scaleladder.rung.loop import host_attrs

    cfg, spec, world, report = ctx.cfg, ctx.cfg.spec, ctx.env.world, built.report
    samples_per_s = int(spec.batch) * world * m.measured_steps / m.window_s
    items_per_sample = 2 if built.flavor.family == "flava" else 1
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
    from scaleladder.models.flops import flava_flops, vit_flops

    # HFU counts a recomputed forward under -ac/-ac-reentrant; -sac keeps every matmul's output
    # and recomputes only elementwise work, which no FLOP count here includes.
    recompute = spec.strategy.ac and not spec.strategy.selective
    if flavor.family == "vit":
        return vit_flops(flavor, recompute)
    # FLAVA's heads' useful work is on the masked tokens of matched pairs: count them on the
    # first batch (one host sync, before the timed loop).
    pos = first["itm_labels"].ne(0)
    n = max(1, int(pos.sum()))
    text = float(first["mlm_labels"][pos].ne(-1).sum()) / n
    patches = float(first["image_patches_mask"][pos].sum()) / n
    # The sync-free (sdpa) heads run on every token: HFU counts that, MFU the useful work.
    return flava_flops(flavor, global_batch, text, patches, n / len(pos), recompute, heads_on_all_tokens=flava_impl == "sdpa")
