"""What the GPU check runs, at which sizes, in which order, with which share of the budget."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_RUNG = REPO / "benchmarks" / "bench_rung.py"

ROLES = ("vit-base", "vit-huge", "flava-350m")  # the models the issue names; "role" = the GPU flavor a row stands for
STRATEGIES = ("single", "single-ac", "ddp", "ddp-ac", "fsdp-full", "fsdp-full-ac",
              # FSDP2 beside FSDP1, and one compiled rung; the planner does not
              # model compile, so its planner row says so
              "fsdp2-full", "fsdp2-full-ac", "single-compile")
# TRAP (torch FSDP1, _init_utils._init_core_state): at world size 1 FSDP1 replaces FULL_SHARD
# and SHARD_GRAD_OP by NO_SHARD with a warning only, so on one GPU fsdp-grad-op* and
# fsdp-no-shard* would measure fsdp-full*'s strategy again under other names.
# They are not run; fsdp-full* stands for all three, and every record says what ran
# (`sharding_ran`, read from the wrapped model). Rows that still ran the same strategy are
# marked (rows.same_as) and left out of the AC-cost and planner targets.
ONE_RANK_SAME = {"fsdp-grad-op": "fsdp-full", "fsdp-grad-op-ac": "fsdp-full-ac",
                 "fsdp-no-shard": "fsdp-full", "fsdp-no-shard-ac": "fsdp-full-ac"}
# The order the strategies section runs them: the rows the targets and the other
# sections lean on first, for every model: the AC pair, then the compiled rung (it removes most of
# the host work; last in the order, it never ran on the first H100), then FSDP's pair. Its share
# of an 18-minute check holds the three AC pairs and one compile at a GPU's start-up cost.
RUN_ORDER = ("single", "single-ac", "single-compile", "fsdp-full", "fsdp-full-ac", "ddp", "ddp-ac", "fsdp2-full",
             "fsdp2-full-ac")
# Each measuring section's share of the budget. A section may use what the sections
# before it left unused, never what the ones after it are owed: at a section's start it gets
# (time left) x its share / (the shares of it and the sections after it). Without shares, the
# strategies section's 27 fresh processes (3 inductor compiles) could fill an 18-minute budget
# at a GPU's start-up cost and skip max-batch, which the check exists for.
SHARES = {"strategies": 0.27, "harness": 0.11, "loader": 0.14, "precision": 0.08, "maxbatch": 0.40}
PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
SECTIONS = ("strategies", "harness", "loader", "precision", "maxbatch")  # measuring sections, in run order
# Only when asked for (`--sections host`: gpucheck/host.py), alone in about 6 minutes on one H100;
# asked for beside the others it runs last, with this share.
HOST_SECTION, HOST_SHARE = "host", 0.30
ALL_SECTIONS = (*SECTIONS, HOST_SECTION)
PRECISION = "bf16-mixed"
KNOBS = "pre-lag"  # FSDP1's default; FSDP2 rungs take theirs, pf0 (spec.default_knobs)
FSDP2_KNOBS = "pf0"

# The targets. Reported, never asserted (docs/performance.md, "make gpu-check").
TARGET_VIT_H_MFU = 0.50
TARGET_HARNESS = 1.02
TARGET_LOADER = 0.97
TARGET_AC_COST = 0.25
TARGET_PLANNER = 0.10
TARGET_STEP = 0.20  # a rung's predicted step time against its measured median

# What "ran out of memory" looks like in the log of a process that died of it without
# writing its record (the runner records the OOMs it catches itself, as status 'oom').
OOM_RE = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED|hipErrorOutOfMemory",
                    re.IGNORECASE)
GIB = 2**30


@dataclass(frozen=True)
class DeviceSizes:
    """Sizes for one kind of device: which flavor each role runs as, batches, steps."""

    flavors: dict[str, str]
    batches: dict[str, int]
    steps: int  # per rung, warm-up included (the runner's --steps)
    warmup: int
    maxbatch_caps: dict[str, int]
    probe_steps: int  # = the maxbatch rung's own steps, so the passing probe IS the rung (no extra run)
    probe_warmup: int
    harness: tuple[tuple[str, int, int, int], ...]  # (role, batch, steps, repeats)
    shard_samples: int
    shard_per_shard: int
    loader_steps: int
    loader_warmup: int
    # the loader-fed rungs' worker counts (each with CPU decode, and --decode gpu on a
    # GPU), and the sides of the shards' JPEGs: web-sized, not at the model's size
    loader_workers: tuple[int, ...] = (14, 6)
    loader_sides: tuple[int, int] = (300, 900)


# One H100 80GB: batches the planner puts at 10-21 GiB (`scaleladder plan ... --device h100-80gb`),
# far from the limit, so every strategy runs. Start-up (python, torch, CUDA context, NCCL,
# model build) dominates a rung's wall time, so a few tens of steps cost little more than a few.
GPU = DeviceSizes(
    flavors={r: r for r in ROLES},
    batches={"vit-base": 128, "vit-huge": 32, "flava-350m": 16},
    steps=40, warmup=10,
    # 8x the fixed batch; lowered further to the planner's own max batch when it predicts one
    # (see sections.maxbatch): the search's doubling and bisection cost ~log2(batch) probes.
    maxbatch_caps={"vit-base": 1024, "vit-huge": 256, "flava-350m": 128},
    probe_steps=4, probe_warmup=2,
    harness=(("vit-base", 128, 50, 3), ("vit-huge", 32, 30, 3)),
    shard_samples=2048, shard_per_shard=128,  # 16 shards: one per loader worker on a 16-core node
    loader_steps=60, loader_warmup=20,
)

# The CPU stand-in: the same commands on the debug flavors. vit-huge runs as vit-debug at a
# smaller batch so that its rungs are distinct files (and distinct rows) from vit-base's.
CPU = DeviceSizes(
    flavors={"vit-base": "vit-debug", "vit-huge": "vit-debug", "flava-350m": "flava-debug"},
    batches={"vit-base": 8, "vit-huge": 4, "flava-350m": 4},
    steps=4, warmup=2,
    maxbatch_caps={"vit-base": 2, "vit-huge": 2, "flava-350m": 2},  # a CPU never runs out of memory: the cap ends every search
    probe_steps=4, probe_warmup=2,
    harness=(("vit-base", 8, 6, 2), ("vit-huge", 4, 6, 2)),
    shard_samples=256, shard_per_shard=32,
    loader_steps=6, loader_warmup=2,
    loader_workers=(1,), loader_sides=(40, 96),
)


@dataclass(frozen=True)
class Selection:
    """Which rungs each section runs."""

    strategies: tuple[tuple[str, str], ...]  # (role, strategy)
    maxbatch: tuple[tuple[str, str], ...]
    harness_roles: tuple[str, ...]
    precisions: tuple[str, ...]


FULL = Selection(
    strategies=tuple((r, s) for s in RUN_ORDER if s in STRATEGIES for r in ROLES),
    # the seeds' claim (FSDP+AC allows ~3x DDP's batch) for every model first, then fsdp-full
    maxbatch=tuple((r, s) for s in ("ddp", "fsdp-full-ac", "fsdp-full") for r in ROLES),
    harness_roles=("vit-base", "vit-huge"),
    precisions=PRECISIONS,
)
# Every section, fewest rungs: an AC pair (single, single-ac) and one FSDP rung on FLAVA.
SMOKE = Selection(
    strategies=(("vit-base", "single"), ("vit-base", "single-ac"), ("flava-350m", "fsdp-full")),
    maxbatch=(("vit-base", "fsdp-full-ac"),),
    harness_roles=("vit-base",),
    precisions=("fp32", "bf16-mixed"),
)
