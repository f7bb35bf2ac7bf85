"""Host work of one training step, counted, not timed: what bench_host measures,
in figures that do not move with a shared CPU's load.

One vit-debug rung at b4, fp32, on the one-rank gloo group the caller holds
(:func:`helpers.gloo.one_rank_group`): the wrapped model, its optimizer, the top-level aten
ops of one traced step (benchmarks/bench_host.py's count) and the Python calls of a step
(``sys.setprofile``: every Python and C function call the step makes).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaleladder.flavors import get_flavor
from scaleladder.models.build import build_model
from scaleladder.rung.batches import synthetic_batch
from scaleladder.rung.optim import backward_and_step, make_optimizer
from scaleladder.rung.parallelize import apply_strategy
from scaleladder.rung.precision import policy
from scaleladder.spec import default_knobs, parse_strategy

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


@dataclass
class StepCounts:
    model: nn.Module
    optimizer: Any
    aten_ops: float  # top-level aten ops of one step
    py_calls: float  # Python calls a step (median of 3 steps' mean: they are identical)
    py_calls_optimizer: float  # of those, in optimizer.step() and zero_grad()


def python_calls(fn: Callable[[], None], setup: Callable[[], None] = lambda: None, repeats: int = 3) -> float:
    """Function calls (Python and C) ``fn`` makes, a call on average; ``setup`` runs uncounted before each."""
    calls = [0]

    def count(_frame: Any, event: str, _arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    for _ in range(repeats):
        setup()
        sys.setprofile(count)
        try:
            fn()
        finally:
            sys.setprofile(None)
    return (calls[0] - repeats) / repeats  # each setprofile(None) call itself


def step_counts(strategy: str, tmp: Path, flavor_name: str = "vit-debug", batch: int = 4) -> StepCounts:
    """Builds the rung as the runner does (apply_strategy, make_optimizer) and counts a step."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_host import top_level_ops

    torch.manual_seed(0)
    flavor = get_flavor(flavor_name)
    s = parse_strategy(strategy)
    model, _ = apply_strategy(build_model(flavor), s, default_knobs(s), policy("fp32"), CPU)  # type: ignore[arg-type]
    optimizer = make_optimizer(model.parameters(), 1e-4, "fp32")
    data = synthetic_batch(flavor, batch, 0, 0, 0)

    def step() -> None:
        backward_and_step(model(data), optimizer, None)

    for _ in range(2):  # lazy init, optimizer state
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    trace = tmp / f"{flavor_name}-{strategy}.json"
    prof.export_chrome_trace(str(trace))
    ops, _ = top_level_ops(json.loads(trace.read_text())["traceEvents"])
    calls = python_calls(step)

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    opt_calls = python_calls(optimizer_step, setup=lambda: model(data).backward())
    return StepCounts(model, optimizer, float(ops), calls, opt_calls)


def count_steps(tmp: Path, strategies: tuple[str, ...]) -> dict[str, StepCounts]:
    """:func:`step_counts` of each strategy, on a one-rank gloo group and one thread (bench_host's
    setting; the counts do not depend on it, but stay alike)."""
    from helpers.gloo import one_rank_group

    with torch.inference_mode(False), one_rank_group():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return {s: step_counts(s, tmp) for s in strategies}
        finally:
            torch.set_num_threads(threads)
