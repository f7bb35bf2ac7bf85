"""FSDP1's host work per step at one rank, counted, not timed (issue 30, part 3).

What a vit-debug ``fsdp-full`` step costs the host over a ``single`` step is FSDP1's own
per-unit work (benchmarks/bench_host.py; docs/performance.md, "Where FSDP1's host time goes"):
its hooks, the flat parameter's views re-made in each forward, the one-rank all-reduce of
NO_SHARD. Timings on a shared CPU move by ±30%; these counts do not move, so a regression in
how we drive FSDP1 (``use_orig_params=True`` back: 575 top-level aten ops a step instead of
310; a MixedPrecision policy at fp32: a cast per unit; a hook of ours on every unit) fails here
whatever the machine's load.

TRAP: the bounds are torch's FSDP1 (2.14) as it is. A torch upgrade that moves them is read
in the failure's numbers: a rise is more work per step, look before raising the bound.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers.gloo import one_rank_group
from scaleladder.models.build import build_model
from scaleladder.models.flavors import get_flavor
from scaleladder.rung.batches import synthetic_batch
from scaleladder.rung.ladder import FSDP1_UNSAFE_SETATTR, apply_strategy
from scaleladder.rung.optim import backward_and_step, make_optimizer
from scaleladder.rung.precision import policy
from scaleladder.spec import default_knobs, parse_strategy

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

CPU = torch.device("cpu")
# Measured at 2.14.1 (dev-cpu): top-level aten ops a step, single 249 / fsdp-full 310 (the
# 61 more: a view per parameter in each forward and its reshape in backward, the flat
# parameter's split/cat/slices, `.data` swaps, one expand_as per unit; the optimizer steps 3
# flat parameters instead of 32); Python calls a step, single 873 / fsdp-full 2,432 (3,008
# with nn.Module's checked setattr for the views: rung.ladder._fsdp1_plain_setattr).
MAX_EXTRA_OPS = 70
MAX_PY_CALLS_PER_UNIT = 600  # 520 today (3 units); 712 with the checked setattr, 2,070 with use_orig_params


def _step(model: nn.Module, optimizer: Any, batch: dict[str, torch.Tensor]) -> None:
    backward_and_step(model(batch), optimizer, None)


def _counts(strategy: str, tmp: Path) -> tuple[nn.Module, float, float]:
    """(wrapped model, top-level aten ops of one traced step, Python calls a step) of vit-debug b4 fp32."""
    from bench_host import top_level_ops

    torch.manual_seed(0)
    flavor = get_flavor("vit-debug")
    s = parse_strategy(strategy)
    model, _ = apply_strategy(build_model(flavor), s, default_knobs(s), policy("fp32"), CPU)  # type: ignore[arg-type]
    optimizer = make_optimizer(model.parameters(), 1e-4, "fp32")
    batch = synthetic_batch(flavor, 4, 0, 0, 0)
    for _ in range(2):  # lazy init, optimizer state
        _step(model, optimizer, batch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _step(model, optimizer, batch)
    trace = tmp / f"{strategy}.json"
    prof.export_chrome_trace(str(trace))
    ops, _ = top_level_ops(json.loads(trace.read_text())["traceEvents"])
    calls = [0]

    def count(_frame: Any, event: str, _arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(count)
    try:
        for _ in range(3):
            _step(model, optimizer, batch)
    finally:
        sys.setprofile(None)
    return model, float(ops), (calls[0] - 1) / 3  # the setprofile(None) call itself


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[nn.Module, float, float]]:
    tmp = tmp_path_factory.mktemp("host_fsdp1")
    with torch.inference_mode(False), one_rank_group():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # bench_host's setting; counts do not depend on it, but stay alike
        try:
            return {s: _counts(s, tmp) for s in ("single", "fsdp-full")}
        finally:
            torch.set_num_threads(threads)


def test_fsdp1_adds_few_aten_ops_a_step(counted: dict[str, tuple[nn.Module, float, float]]) -> None:
    single, fsdp = counted["single"][1], counted["fsdp-full"][1]
    assert fsdp - single <= MAX_EXTRA_OPS, f"fsdp-full {fsdp:.0f} top-level aten ops a step against single's {single:.0f}"


def test_fsdp1_python_work_a_step_stays_per_unit(counted: dict[str, tuple[nn.Module, float, float]]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model, _, calls = counted["fsdp-full"]
    units = sum(isinstance(m, FSDP) for m in model.modules())
    assert units == 3  # root + one per layer (vit-debug has 2): the seeds' wrapping
    extra = (calls - counted["single"][2]) / units
    assert extra <= MAX_PY_CALLS_PER_UNIT, f"FSDP1 adds {extra:.0f} Python calls per unit a step"


def test_fsdp1_at_fp32_has_no_cast_and_no_hook_of_ours(counted: dict[str, tuple[nn.Module, float, float]]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = counted["fsdp-full"][0]
    units = [m for m in model.modules() if isinstance(m, FSDP)]
    # No MixedPrecision at fp32: FSDP1 would cast each unit's flat parameter every forward.
    assert all(u._handle is not None and not u._handle._uses_param_mixed_precision for u in units)
    assert all(not u._use_orig_params for u in units)  # the seeds' flat parameters (planner.static)
    # Views set by plain attribute writes (torch's switch, read when the units were made) ...
    from torch.distributed.fsdp._flat_param import _unsafe_setattr_tensor

    assert all(u._handle._setattr_tensor is _unsafe_setattr_tensor for u in units)
    assert FSDP1_UNSAFE_SETATTR not in os.environ  # ... and only then: nothing else sees it
    # FSDP1 runs its own hooks from FSDP.forward and autograd: a module hook is someone else's.
    assert not [n for n, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]
