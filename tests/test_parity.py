"""Loss parity: the core correctness test of every strategy.

Same global batch, same seed, fp32: a single process and every distributed
strategy (2 gloo ranks), with and without activation checkpointing, must give
the same per-step losses within a relative 1e-5. Hybrid sharding is also run on
4 ranks, where its replicate dimension is > 1 (on 2 ranks, hybrid2 is one replica).
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
STRATEGIES = ["ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "fsdp-hybrid1", "fsdp-hybrid2"]
ALL = STRATEGIES + [s + "-ac" for s in STRATEGIES]
STEPS = 4


@functools.lru_cache(maxsize=None)
def _reference(flavor: str, global_batch: int) -> dict[str, list[float]]:
    return _torchrun(1, flavor, global_batch, ["single", "single-ac"])


def _torchrun(nproc: int, flavor: str, global_batch: int, strategies: list[str]) -> dict[str, list[float]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(HERE / "helpers" / "parity_worker.py"), flavor, str(global_batch), str(STEPS), ",".join(strategies)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(l for l in out.stdout.splitlines() if l.startswith("PARITY "))
    groups = next(l for l in out.stdout.splitlines() if l.startswith("GROUPS "))
    GROUPS[(nproc, flavor)] = json.loads(groups[len("GROUPS "):])
    return json.loads(line[len("PARITY "):])


GROUPS: dict[tuple[int, str], dict[str, list[int]]] = {}  # (ranks, flavor) -> hybrid strategy -> [replicas, shard size]


# ITM negatives sit at every 10th global index: a local batch of 10 gives each rank one.
@pytest.mark.slow
@pytest.mark.parametrize("flavor,global_batch", [("vit-debug", 8), ("flava-debug", 20)])
def test_every_strategy_reproduces_the_single_process_loss(flavor: str, global_batch: int) -> None:
    reference = _reference(flavor, global_batch)
    ref = np.array(reference["single"])
    assert np.all(np.isfinite(ref)) and len(ref) == STEPS
    assert not np.allclose(ref, ref[0]), "the loss never changed: the optimizer is not stepping"
    np.testing.assert_allclose(reference["single-ac"], ref, rtol=1e-5)
    got = _torchrun(2, flavor, global_batch, ALL + ["raw-hybrid1"])
    for s in ALL:
        np.testing.assert_allclose(got[s], ref, rtol=1e-5, err_msg=f"{flavor} {s}")
    # Why fsdp-hybrid1 runs as NO_SHARD: upstream HYBRID_SHARD with 1-rank shard groups never
    # synchronises gradients, so its loss leaves the reference after the first update.
    # If this ever fails, torch fixed the trap and rung.ladder.wrap_fsdp can drop its workaround.
    raw = np.array(got["raw-hybrid1"])
    assert raw[0] == pytest.approx(ref[0], rel=1e-5) and not np.allclose(raw[1:], ref[1:], rtol=1e-3)


@pytest.mark.slow
def test_hybrid_sharding_with_two_replicas_reproduces_the_single_process_loss() -> None:
    # 4 ranks as a 2 x 2 mesh (replicate, shard): gradients are reduce-scattered within each
    # shard group AND all-reduced across the two replicas — the path 2 ranks never take.
    ref = np.array(_reference("vit-debug", 8)["single"])
    got = _torchrun(4, "vit-debug", 8, ["fsdp-hybrid2", "fsdp-hybrid2-ac"])
    assert GROUPS[(4, "vit-debug")] == {"fsdp-hybrid2": [2, 2], "fsdp-hybrid2-ac": [2, 2]}  # really 2 replicas of 2 shards
    for s in got:
        np.testing.assert_allclose(got[s], ref, rtol=1e-5, err_msg=f"vit-debug {s} on 4 ranks")
