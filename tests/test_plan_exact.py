"""Exact validation of the planner's static memory, on real tensors (CPU, gloo).

Two ranks build vit-debug and flava-debug, wrap them with the ladder's own
``rung.parallelize.apply_strategy`` (every strategy, three precisions), run one training
step with the runner's own optimizer (``optim.make_optimizer``: fused AdamW; under
bf16-true with fp32 master weights), and sum — per rank — the bytes of the
parameters' storage, of the gradients and of the optimizer's state (moments, masters,
the 0-dim ``step`` counters). ``plan.static_bytes_per_rank`` must match to the byte.

The same run checks the one FSDP behaviour the planner's FLAVA numbers rest on:
FLAVA runs each encoder layer twice per step, and FSDP1 cannot reshard a layer unit
until BOTH passes have been through backward — so the unimodal layer units pile up,
all-gathered, between the masked and the unmasked pass's backward; with and without
(non-reentrant) activation checkpointing.

A second, four-rank run checks HYBRID's padding: with groups of 2 out of 4 ranks, FSDP
pads each flat parameter to the shard group, not to the world (two ranks cannot tell
the two apart: there the group is the world).

This file is also the worker (run under torchrun by the test), so it needs no
helper module outside the planner's own test files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.process]  # two processes (still run in CI, and by default)

FLAVORS = ("vit-debug", "flava-debug")
STRATEGIES = ("ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "fsdp-hybrid1", "fsdp-hybrid2", "fsdp-full-ac",
              "fsdp-hybrid2-ac")
PRECISIONS = ("fp32", "bf16-mixed", "bf16-true")
# Every (flavor, strategy, precision) takes well under a second on two CPU ranks once the
# processes are up; SCALELADDER_EXACT_FULL=1 runs the full 48-case matrix. By default every
# strategy once, spread so that together they still cover each code path: unsharded vs sharded
# vs NO_SHARD-padded-to-the-world (no-shard, hybrid1), both alignments (4 elements with fp32,
# 8 with a bf16 param dtype), bf16 storage, a frozen unit (the codebook) and a mixed
# frozen/trained root (FLAVA), AC with and without sharding across the group.
CASES = [
    ("vit-debug", "ddp", "fp32"), ("vit-debug", "fsdp-full", "bf16-mixed"), ("vit-debug", "fsdp-no-shard", "bf16-true"),
    ("flava-debug", "ddp", "bf16-mixed"), ("flava-debug", "fsdp-full", "fp32"), ("flava-debug", "fsdp-full-ac", "bf16-true"),
    ("flava-debug", "fsdp-grad-op", "bf16-mixed"), ("vit-debug", "fsdp-hybrid1", "fp32"),
    ("flava-debug", "fsdp-hybrid2", "bf16-true"), ("vit-debug", "fsdp-hybrid2-ac", "bf16-mixed"),
    # -ac-reentrant keeps use_orig_params (planner.static.fsdp1_use_orig_params): aligned, per-parameter state
    ("flava-debug", "fsdp-full-ac-reentrant", "bf16-mixed"),
]
# FSDP2 (fully_shard): per-parameter padded Shard(0) shards, trainable-only gradients.
FSDP2_STRATEGIES = ("fsdp2-full", "fsdp2-grad-op", "fsdp2-hybrid1", "fsdp2-hybrid2", "fsdp2-full-ac")
CASES += [
    ("vit-debug", "fsdp2-full", "bf16-mixed"), ("flava-debug", "fsdp2-full", "fp32"),
    ("flava-debug", "fsdp2-full-ac", "bf16-true"), ("vit-debug", "fsdp2-grad-op", "bf16-true"),
    ("flava-debug", "fsdp2-grad-op", "bf16-mixed"), ("vit-debug", "fsdp2-hybrid1", "fp32"),
    ("flava-debug", "fsdp2-hybrid2", "bf16-mixed"),
]
if os.environ.get("SCALELADDER_EXACT_FULL"):
    CASES = [(f, s, p) for f in FLAVORS for s in STRATEGIES + FSDP2_STRATEGIES for p in PRECISIONS]
# Four ranks, HYBRID groups of two: the padding that tells the group from the world.
CASES_4 = [("vit-debug", "fsdp-hybrid2", "fp32"), ("flava-debug", "fsdp-hybrid2-ac", "bf16-mixed")]
# FSDP2 on four ranks: ceil(rows/4)-row padded shards (rows not divisible by 4 pad every rank),
# and HSDP sharded over 2 of 4.
CASES2_4 = [("vit-debug", "fsdp2-full", "fp32"), ("flava-debug", "fsdp2-hybrid2-ac", "bf16-mixed")]
GATHER_STRATEGIES = ("fsdp-full", "fsdp-full-ac")
GATHER_STRATEGIES_2 = ("fsdp2-full", "fsdp2-full-ac")


# -- the worker (one process per rank) ------------------------------------------------------


def _measure(flavor_name: str, strategy_name: str, precision: str) -> dict[str, int]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from scaleladder.flavors import get_flavor
    from scaleladder.models.build import build_model
    from scaleladder.rung.batches import synthetic_batch
    from scaleladder.rung.optim import make_optimizer
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy
    from scaleladder.spec import default_knobs, parse_strategy

    flavor = get_flavor(flavor_name)
    prec = policy(precision)
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = build_model(flavor, device)
    if prec.storage_dtype != torch.float32:
        model = model.to(dtype=prec.storage_dtype)  # as rung.run._train_and_record does
    strategy = parse_strategy(strategy_name)
    wrapped, _ = apply_strategy(model, strategy, default_knobs(strategy), prec, device)
    opt = make_optimizer(wrapped.parameters(), 1e-3, precision)  # as the runner builds it
    batch = synthetic_batch(flavor, 10, dist.get_rank(), 0, 0)
    if prec.storage_dtype != torch.float32:
        batch = {k: v.to(prec.storage_dtype) if v.is_floating_point() else v for k, v in batch.items()}
    with prec.autocast(device):
        loss = wrapped(batch)
    loss.backward()
    opt.step()  # measured before zero_grad: gradients are still there

    from torch.distributed.tensor import DTensor

    def nbytes(tensors: Any) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            if isinstance(t, DTensor):
                t = t.to_local()  # FSDP2: the local shard (a narrow of its padded storage)
            if t is not None and t.untyped_storage().nbytes() > 0:
                st = t.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())

    if isinstance(wrapped, FSDP):
        from torch.distributed.fsdp._traversal_utils import _get_fsdp_handles

        flats = [h.flat_param for h in _get_fsdp_handles(wrapped)]
        params, grads = nbytes(flats), nbytes(fp.grad for fp in flats)
        # The original parameters are views into the flat parameters: no storage of their own.
        assert nbytes(wrapped.parameters()) <= params
    else:
        params = nbytes(wrapped.parameters())
        grads = nbytes(p.grad for p in wrapped.parameters())
    # Fused AdamW keeps each `step` counter, a 0-dim fp32 tensor, on the parameter's device: counted
    # (4 bytes each: storage; the planner's timeline counts the GPU allocator's 512-byte block).
    # bf16-true's MasterWeightAdamW also owns an fp32 master of every trainable (local) parameter.
    state = [v.to_local() if isinstance(v, DTensor) else v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert all(t.dtype == torch.float32 for t in state)
    optim = nbytes([*state, *getattr(opt, "masters", [])])
    return {"params": params, "grads": grads, "optimizer": optim}


def _count_gathered_units(flavor_name: str, strategy: str, flava_impl: str = "torchmultimodal") -> dict[str, int]:
    """Max number of FSDP units all-gathered at once during a FULL_SHARD backward (and of them, frozen)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._traversal_utils import _get_fsdp_handles

    from scaleladder.flavors import get_flavor
    from scaleladder.models.build import build_model
    from scaleladder.rung.batches import synthetic_batch
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy
    from scaleladder.spec import Knobs, parse_strategy

    flavor = get_flavor(flavor_name)
    torch.manual_seed(0)
    model = build_model(flavor, "cpu", flava_impl=flava_impl)
    wrapped, _ = apply_strategy(model, parse_strategy(strategy), Knobs(), policy("fp32"), torch.device("cpu"))
    handles = _get_fsdp_handles(wrapped)
    frozen = [h for h in handles if not h.flat_param.requires_grad]

    def gathered(among: Any = handles) -> int:
        n = 0
        for h in among:
            full = getattr(h.flat_param, "_full_param_padded", None)
            n += int(full is not None and full.untyped_storage().size() > 0)
        return n

    seen: list[int] = []
    seen_frozen: list[int] = []

    def count(m: Any, g: Any) -> None:  # TRAP: a backward pre-hook that returns a value replaces grad_output
        seen.append(gathered())
        seen_frozen.append(gathered(frozen))

    for mod in wrapped.modules():
        if isinstance(mod, model.layer_cls):
            mod.register_full_backward_pre_hook(count)
    wrapped(synthetic_batch(flavor, 10, dist.get_rank(), 0, 0)).backward()
    return {"max_gathered_in_backward": max(seen), "after_backward": gathered(), "frozen_in_backward": seen_frozen}


def _count_gathered_units_fsdp2(flavor_name: str, strategy: str) -> dict[str, int]:
    """Max number of FSDP2 units (parameter groups) unsharded at once during backward."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from scaleladder.flavors import get_flavor
    from scaleladder.models.build import build_model
    from scaleladder.rung.batches import synthetic_batch
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.precision import policy
    from scaleladder.spec import default_knobs, parse_strategy

    flavor = get_flavor(flavor_name)
    torch.manual_seed(0)
    model = build_model(flavor, "cpu")
    strat = parse_strategy(strategy)
    wrapped, _ = apply_strategy(model, strat, default_knobs(strat), policy("fp32"), torch.device("cpu"))
    groups = [g for m in wrapped.modules() if isinstance(m, FSDPModule)
              for g in [m._get_fsdp_state()._fsdp_param_group] if g is not None]

    def gathered() -> int:
        return sum(int(g.is_unsharded) for g in groups)

    seen: list[int] = []
    for mod in wrapped.modules():
        if isinstance(mod, model.layer_cls):
            mod.register_full_backward_pre_hook(lambda m, g: seen.append(gathered()))
    wrapped(synthetic_batch(flavor, 10, dist.get_rank(), 0, 0)).backward()
    return {"max_gathered_in_backward": max(seen), "after_backward": gathered(), "units": len(groups)}


def _worker() -> None:
    import torch.distributed as dist

    from scaleladder.rung.unused_params import unused_parameter_names

    unused_parameter_names("flava")  # before the group, as the runner does (rung/unused_params.py)
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    four = dist.get_world_size() == 4
    for flavor, strategy, precision in CASES_4 + CASES2_4 if four else CASES:
        out[f"{flavor}/{strategy}/{precision}"] = _measure(flavor, strategy, precision)
    if not four:
        out["gathered"] = {s: _count_gathered_units("flava-debug", s) for s in GATHER_STRATEGIES}
        out["gathered_sdpa"] = {s: _count_gathered_units("flava-debug", s, "sdpa") for s in GATHER_STRATEGIES}
        out["gathered2"] = {s: _count_gathered_units_fsdp2("flava-debug", s) for s in GATHER_STRATEGIES_2}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, out)
    if dist.get_rank() == 0:
        print("EXACT " + json.dumps(everyone))
    dist.destroy_process_group()


# -- the test --------------------------------------------------------------------------------


def _knobs(strategy: str) -> str:
    from scaleladder.spec import default_knobs, parse_strategy

    return str(default_knobs(parse_strategy(strategy)))


def _run_ranks(n: int) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", str(Path(__file__))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("EXACT "))
    return json.loads(line[len("EXACT "):])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def measured() -> list[dict[str, Any]]:
    return _run_ranks(2)


@pytest.fixture(scope="module")
def measured_4() -> list[dict[str, Any]]:
    return _run_ranks(4)


@pytest.mark.parametrize("flavor,strategy,precision", CASES)
def test_static_bytes_match_real_tensors_per_rank(measured: list[dict[str, Any]], flavor: str, strategy: str, precision: str) -> None:
    from scaleladder.site.plan import static_bytes_per_rank
    from scaleladder.spec import RunSpec

    spec = RunSpec.from_path(f"{flavor}/{strategy}/{precision}/{_knobs(strategy)}/n1/b10")
    for rank, per_rank in enumerate(measured):
        got = per_rank[f"{flavor}/{strategy}/{precision}"]
        assert static_bytes_per_rank(spec, 2, rank) == got, f"rank {rank}"


def test_static_bytes_differ_between_ranks_and_none_means_the_largest(measured: list[dict[str, Any]]) -> None:
    # The padding sits in the last rank's chunk, so FSDP ranks can differ: the check above
    # is per rank, and rank=None must give the busiest one. They differ where AdamW holds the
    # original parameters' views (use_orig_params: -ac-reentrant), whose state skips the
    # padding; over FlatParameters (every other FSDP1 rung) every rank's state is a whole chunk.
    from scaleladder.site.plan import static_bytes_per_rank
    from scaleladder.spec import RunSpec

    spec = RunSpec.from_path("flava-debug/fsdp-full-ac-reentrant/bf16-mixed/pre-lag/n1/b10")
    per_rank = [static_bytes_per_rank(spec, 2, r) for r in (0, 1)]
    assert per_rank[0] != per_rank[1]
    assert static_bytes_per_rank(spec, 2) == max(per_rank, key=lambda d: sum(d.values()))
    flat = RunSpec.from_path("flava-debug/fsdp-full/bf16-mixed/pre-lag/n1/b10")
    assert static_bytes_per_rank(flat, 2, 0) == static_bytes_per_rank(flat, 2, 1)


@pytest.mark.parametrize("flavor,strategy,precision", CASES_4)
def test_hybrid_pads_to_the_shard_group_not_the_world(measured_4: list[dict[str, Any]], flavor: str, strategy: str,
                                                       precision: str) -> None:
    from scaleladder.planner.inventory import inventory
    from scaleladder.planner.static import aligned_numel, flat_layout
    from scaleladder.site.plan import static_bytes_per_rank
    from scaleladder.spec import RunSpec

    # The case discriminates: padded to the world (4), the root's chunk on 2 ranks would differ.
    root, align = inventory(flavor).root, aligned_numel(precision)
    assert flat_layout(root, align, 2).total != flat_layout(root, align, 4).total
    spec = RunSpec.from_path(f"{flavor}/{strategy}/{precision}/{_knobs(strategy)}/n1/b10")
    for rank, per_rank in enumerate(measured_4):
        assert static_bytes_per_rank(spec, 4, rank) == per_rank[f"{flavor}/{strategy}/{precision}"], f"rank {rank}"


@pytest.mark.parametrize("strategy", GATHER_STRATEGIES)
def test_flava_layer_units_stay_gathered_between_the_two_passes(measured: list[dict[str, Any]], strategy: str) -> None:
    from scaleladder.flavors import get_flavor

    f = get_flavor("flava-debug")
    g = measured[0]["gathered"][strategy]
    # The root, plus every image and text layer unit (both encoders' layers have been
    # reached by the masked pass's backward, none released by the unmasked pass's yet), plus
    # the two encoders' poolers: frozen units of their own under use_orig_params=False. TRAP:
    # FSDP1 registers a frozen unit's reshard-only hook once per FlatParameter, at its first
    # forward, so the second pass's backward regathers the pooler and only the first pass's
    # backward frees it again: it piles up between the passes as a layer does.
    assert g["max_gathered_in_backward"] == 1 + 2 * f.layers + 2
    assert g["after_backward"] == 0
    # The layer backwards in order (fusion, masked text, masked image, text, image): the frozen
    # poolers gathered beside each, as planner.timeline._PoolerPileUp takes and drops them.
    assert g["frozen_in_backward"] == [1] * f.mm_layers + [1] * (f.layers - 1) + [2] + [2] * f.layers + [1] * f.layers + [0] * f.layers


@pytest.mark.parametrize("strategy", GATHER_STRATEGIES)
def test_sdpa_flava_piles_nothing_up(measured: list[dict[str, Any]], strategy: str) -> None:
    # The sdpa FLAVA runs each encoder once (plain and masked inputs batched): a layer unit is
    # resharded after its one backward, and a frozen pooler is only FSDP1's backward prefetch of
    # the unit that ran before an encoder's first layer, freed at once (where the planner counts a
    # prefetched layer). In backward: the root, the running layer and one prefetched unit.
    g = measured[0]["gathered_sdpa"][strategy]
    assert g["max_gathered_in_backward"] <= 3 and g["after_backward"] == 0
    assert max(g["frozen_in_backward"]) <= 1




@pytest.mark.parametrize("strategy", GATHER_STRATEGIES_2)
def test_fsdp2_reshards_flava_layers_after_each_pass(measured: list[dict[str, Any]], strategy: str) -> None:
    # FSDP2 registers its post-backward hook per forward CALL: each backward pass of a layer
    # ends in a reshard (and a reduce-scatter). Unlike FSDP1, no pile-up between FLAVA's two
    # passes: in backward only the root, the running layer and the one prefetched ahead.
    g = measured[0]["gathered2"][strategy]
    print(strategy, g)
    assert g["max_gathered_in_backward"] <= 3
    assert g["after_backward"] == 0



@pytest.mark.parametrize("flavor,strategy,precision", CASES2_4)
def test_fsdp2_static_bytes_on_four_ranks(measured_4: list[dict[str, Any]], flavor: str, strategy: str,
                                          precision: str) -> None:
    from scaleladder.site.plan import static_bytes_per_rank
    from scaleladder.spec import RunSpec

    spec = RunSpec.from_path(f"{flavor}/{strategy}/{precision}/{_knobs(strategy)}/n1/b10")
    for rank, per_rank in enumerate(measured_4):
        assert static_bytes_per_rank(spec, 4, rank) == per_rank[f"{flavor}/{strategy}/{precision}"], f"rank {rank}"


if __name__ == "__main__":
    _worker()
