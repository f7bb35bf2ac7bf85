"""FSDP1's host work per step at one rank, counted, not timed.

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

import os

import pytest

from helpers.host import StepCounts, count_steps
from scaleladder.rung.parallelize import FSDP1_UNSAFE_SETATTR

# Measured at 2.14.1 (dev-cpu): top-level aten ops a step, single 245 / fsdp-full 306 (bench_host's
# rung loop adds 4 to each: the loss kept; the 61 more: a view per parameter in each forward and its reshape in backward, the flat
# parameter's split/cat/slices, `.data` swaps, one expand_as per unit; the optimizer steps 3
# flat parameters instead of 32); Python calls a step, single 873 / fsdp-full 2,432 (3,008
# with nn.Module's checked setattr for the views: rung.parallelize._fsdp1_plain_setattr).
MAX_EXTRA_OPS = 70
MAX_PY_CALLS_PER_UNIT = 600  # 520 today (3 units); 712 with the checked setattr, 2,070 with use_orig_params


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StepCounts]:
    return count_steps(tmp_path_factory.mktemp("host_fsdp1"), ("single", "fsdp-full"))


def test_fsdp1_adds_few_aten_ops_a_step(counted: dict[str, StepCounts]) -> None:
    single, fsdp = counted["single"].aten_ops, counted["fsdp-full"].aten_ops
    assert fsdp - single <= MAX_EXTRA_OPS, f"fsdp-full {fsdp:.0f} top-level aten ops a step against single's {single:.0f}"


def test_fsdp1_python_work_a_step_stays_per_unit(counted: dict[str, StepCounts]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = sum(isinstance(m, FSDP) for m in counted["fsdp-full"].model.modules())
    assert units == 3  # root + one per layer (vit-debug has 2): the seeds' wrapping
    extra = (counted["fsdp-full"].py_calls - counted["single"].py_calls) / units
    assert extra <= MAX_PY_CALLS_PER_UNIT, f"FSDP1 adds {extra:.0f} Python calls per unit a step"


def test_fsdp1_at_fp32_has_no_cast_and_no_hook_of_ours(counted: dict[str, StepCounts]) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = counted["fsdp-full"].model
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
