"""Loss parity: the core correctness test of every strategy.

Same global batch, same seed, fp32: a single process and every distributed
strategy (2 gloo ranks), FSDP1 and FSDP2, with and without activation checkpointing,
must give the same per-step losses within a relative 1e-5. Hybrid sharding is also run on
4 ranks, where its replicate dimension is > 1 (on 2 ranks, hybrid2 is one replica).

Compiled rungs (``-compile``) are held to COMPILE_RTOL, against the same eager
single-process reference. Why looser, and why this much: a compiler may reorder
floating-point sums (inductor fuses LayerNorm, softmax and matmul epilogues into
kernels of its own, vectorised and tiled its own way; AOTAutograd's partitioner may
recompute instead of saving), so a compiled rung is not bitwise the eager one. On
these flavors the measured difference is about 1e-7 relative (fp32's epsilon is
1.2e-7) and stays there over the 4 steps; 1e-4 leaves three orders of magnitude of
margin for other CPUs and compilers while still failing every fault this test exists
for: a rung that skips gradient synchronisation leaves the reference by more than 1e-3
at the second step (raw-hybrid1 below), and one that skips or doubles an update by far more.

Each flavor runs all its strategies in ONE torchrun launch per world size (start-up and
import dominate a debug rung): the 1-rank launch holds every reference the flavor needs
(ONE_RANK: each AC form, compiled, and for FLAVA both implementations over IMPL_STEPS and the
4-rank test's global batch). ViT compiles with inductor, what a rung runs by default.
FLAVA compiles with aot_eager: Dynamo's capture, AOTAutograd's joint graph and partition
(AC included) and the wrappers around the compiled blocks are the same, without
inductor's code generation, which costs 60-90 s per FLAVA variant on the 2-core CI machine
with a cold cache (its three encoders are three graphs per batch size); inductor's numerics
are covered on ViT, and a FLAVA rung compiled with inductor ran once by hand (docs/strategies.md).

FLAVA's two implementations (models/flava_impl.py): the ladder builds ``sdpa``, so every strategy
above runs it and is held to the single process at RTOL. ``sdpa`` itself must reproduce
TorchMultimodal's own FLAVA (``torchmultimodal``) over IMPL_STEPS = 20 steps of a single process
within IMPL_RTOL = 1e-5, and every 2-rank strategy's losses must match the torchmultimodal
reference within its own tolerance plus IMPL_RTOL. Why 1e-5: the two compute the same function in
another order (SDPA's fused softmax against matmul, divide and softmax; a cross entropy over every
token with ignore labels against one over the selected tokens; one batched pass per encoder
against two), which moves each loss by about fp32's epsilon: measured at most 1.7e-7 relative over
the 20 steps (2-core VM, 2026-11-27), so 1e-5 leaves a 60-fold margin, while a wrong mask, label
or pass moves the loss by far more (an ITM negative's tokens left in the MMM losses: 4.6e-3 at the
first step, planted by hand). Running 20 steps of EVERY strategy under
both implementations would add about six minutes on the 2-core VM (0.8 s a strategy-step under
load, measured); chaining the two checks costs 40 steps of FLAVA's 1-rank launch.

Cost, 2-core VM (2026-11-23): this file 184 s with a warm inductor cache (/tmp/torchinductor_$USER),
about 250 s cold (the ViT tests 121 s instead of 59 s); the FSDP1-only file it grew from took 79 s.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
FSDP1 = ["fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "fsdp-hybrid1", "fsdp-hybrid2"]
FSDP2 = ["fsdp2-full", "fsdp2-grad-op", "fsdp2-hybrid1", "fsdp2-hybrid2"]
STRATEGIES = ["ddp", *FSDP1, *FSDP2]
ALL = STRATEGIES + [s + "-ac" for s in STRATEGIES]
# Compile composes with each wrapper (DDP, FSDP2) and with AC (AC, then compile, then shard);
# pf2 puts FSDP2's explicit prefetch under test too (it must not change the numbers).
COMPILED = ["ddp-compile", "fsdp2-full-compile", "fsdp2-full-ac-compile"]
PREFETCH = ["fsdp2-full:pf2", "fsdp2-full-ac:pf1"]
# The FLAVA seed's AC form (FSDP1 only): each unit inside its checkpoint wrapper, recomputed
# through the unit. FLAVA is the case that matters: its encoders run twice per step, and the
# other nesting recomputes one pass on freed parameters (rung/parallelize.py wrap_fsdp).
REENTRANT = ["fsdp-full-ac-reentrant", "fsdp-grad-op-ac-reentrant", "fsdp-hybrid2-ac-reentrant"]
# Selective AC (-sac, rung/sac.py) on each wrapper: the recompute of LayerNorm, GELU and softmax
# around the kept matmul outputs must give the same losses as -ac and as no AC.
SAC = ["ddp-sac", "fsdp-full-sac", "fsdp-hybrid2-sac", "fsdp2-full-sac"]
BACKEND = {"vit-debug": "inductor", "flava-debug": "aot_eager"}
STEPS = 4
RTOL = 1e-5
COMPILE_RTOL = 1e-4
IMPL_RTOL = 1e-5  # sdpa FLAVA against TorchMultimodal's own (module docstring)
IMPL_STEPS = 20
SINGLE = ["single", "single-ac", "single-ac-reentrant", "single-sac", "single-compile"]
# flavor -> (global batch, every 1-rank run it needs), in ONE launch (a launch costs more than
# a strategy): `name*N` runs N steps, `name=B` takes global batch B (helpers/parity_worker.py).
ONE_RANK = {"vit-debug": (8, SINGLE),
            "flava-debug": (20, [*SINGLE, f"single*{IMPL_STEPS}", f"single@torchmultimodal*{IMPL_STEPS}", "single=40"])}


@functools.cache
def _one_rank(flavor: str) -> dict[str, list[float]]:
    global_batch, runs = ONE_RANK[flavor]
    return _torchrun(1, flavor, global_batch, runs)


def _reference(flavor: str, global_batch: int) -> np.ndarray:
    """The single process's losses at this global batch, from the flavor's 1-rank launch."""
    name = "single" if global_batch == ONE_RANK[flavor][0] else f"single={global_batch}"
    return np.array(_one_rank(flavor)[name])


def _torchrun(nproc: int, flavor: str, global_batch: int, strategies: list[str]) -> dict[str, list[float]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(HERE / "helpers" / "parity_worker.py"), flavor, str(global_batch), str(STEPS), ",".join(strategies), BACKEND[flavor]]
    # (FLAVA's 1-rank launch, 68 steps, took 900 s at a load average of 38 on the 2-core VM)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("PARITY "))
    groups = next(ln for ln in out.stdout.splitlines() if ln.startswith("GROUPS "))
    GROUPS[(nproc, flavor)] = json.loads(groups[len("GROUPS "):])
    RUNS[(nproc, flavor, global_batch)] = json.loads(line[len("PARITY "):])
    return RUNS[(nproc, flavor, global_batch)]


GROUPS: dict[tuple[int, str], dict[str, list[int]]] = {}  # (ranks, flavor) -> hybrid strategy -> [replicas, shard size]
RUNS: dict[tuple[int, str, int], dict[str, list[float]]] = {}  # (ranks, flavor, global batch) -> the last launch's losses


def _check(got: dict[str, list[float]], ref: np.ndarray, what: str) -> None:
    for s, losses in got.items():
        if s == "raw-hybrid1":
            continue
        rtol = COMPILE_RTOL if "-compile" in s else RTOL
        np.testing.assert_allclose(losses, ref, rtol=rtol, err_msg=f"{what} {s}")


# ITM negatives sit at every 10th global index: a local batch of 10 gives each rank one.
@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("flavor,global_batch", [("vit-debug", 8), ("flava-debug", 20)])
def test_every_strategy_reproduces_the_single_process_loss(flavor: str, global_batch: int) -> None:
    reference = _one_rank(flavor)
    ref = _reference(flavor, global_batch)
    assert np.all(np.isfinite(ref)) and len(ref) == STEPS
    assert not np.allclose(ref, ref[0]), "the loss never changed: the optimizer is not stepping"
    np.testing.assert_allclose(reference["single-ac"], ref, rtol=RTOL)
    np.testing.assert_allclose(reference["single-ac-reentrant"], ref, rtol=RTOL)
    np.testing.assert_allclose(reference["single-sac"], ref, rtol=RTOL)
    np.testing.assert_allclose(reference["single-compile"], ref, rtol=COMPILE_RTOL)
    got = _torchrun(2, flavor, global_batch, ALL + COMPILED + PREFETCH + REENTRANT + SAC + ["raw-hybrid1"])
    assert set(got) == {*ALL, *COMPILED, *PREFETCH, *REENTRANT, *SAC, "raw-hybrid1"}
    _check(got, ref, f"{flavor} on 2 ranks:")
    # Why fsdp-hybrid1 runs as NO_SHARD: upstream HYBRID_SHARD with 1-rank shard groups never
    # synchronises gradients, so its loss leaves the reference after the first update.
    # If this ever fails, torch fixed the trap and rung.parallelize.wrap_fsdp can drop its workaround.
    # (FSDP2's fsdp2-hybrid1, a (world, 1) mesh, needs no workaround: it is in ALL above.)
    raw = np.array(got["raw-hybrid1"])
    assert raw[0] == pytest.approx(ref[0], rel=1e-5) and not np.allclose(raw[1:], ref[1:], rtol=1e-3)


@pytest.mark.process
@pytest.mark.slow
def test_flava_implementations_agree_on_every_strategy() -> None:
    impls = _one_rank("flava-debug")
    original, fused = np.array(impls[f"single@torchmultimodal*{IMPL_STEPS}"]), np.array(impls[f"single*{IMPL_STEPS}"])
    assert len(original) == IMPL_STEPS and not np.allclose(original, original[0])
    np.testing.assert_allclose(fused, original, rtol=IMPL_RTOL, err_msg="sdpa FLAVA against TorchMultimodal's, single process")
    # The 2-rank launch of the test above (run here if that test did not run in this session).
    if (2, "flava-debug", 20) not in RUNS:
        test_every_strategy_reproduces_the_single_process_loss("flava-debug", 20)
    for s, losses in RUNS[(2, "flava-debug", 20)].items():
        if s != "raw-hybrid1":
            rtol = (COMPILE_RTOL if "-compile" in s else RTOL) + IMPL_RTOL
            np.testing.assert_allclose(losses, original[:STEPS], rtol=rtol, err_msg=f"flava-debug on 2 ranks: {s} against TorchMultimodal")


# 4 ranks on 2 cores are slow: ViT carries both generations and a compiled HSDP rung; FLAVA
# (87 s with all five, 2-core VM) the two FSDP2 ones its FSDP1 counterparts never had.
HYBRID_4 = {"vit-debug": ["fsdp-hybrid2", "fsdp-hybrid2-ac", "fsdp2-hybrid2", "fsdp2-hybrid2-ac", "fsdp2-hybrid2-compile"],
            "flava-debug": ["fsdp2-hybrid2", "fsdp2-hybrid2-ac"]}


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("flavor,global_batch", [("vit-debug", 8), ("flava-debug", 40)])
def test_hybrid_sharding_with_two_replicas_reproduces_the_single_process_loss(flavor: str, global_batch: int) -> None:
    # 4 ranks as a 2 x 2 mesh (replicate, shard): gradients are reduce-scattered within each
    # shard group AND all-reduced across the two replicas — the path 2 ranks never take.
    # FLAVA takes a global batch of 40 here, so each of the 4 ranks holds an ITM negative.
    # (both references come from the flavor's 1-rank launch, cached: ViT's at 8, FLAVA's at 40)
    ref = _reference(flavor, global_batch)
    hybrid = HYBRID_4[flavor]
    got = _torchrun(4, flavor, global_batch, hybrid)
    assert GROUPS[(4, flavor)] == {s: [2, 2] for s in hybrid}  # really 2 replicas of 2 shards
    _check(got, ref, f"{flavor} on 4 ranks:")
