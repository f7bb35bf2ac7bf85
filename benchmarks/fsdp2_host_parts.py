"""Where FSDP2's host work per step goes, at one rank on the CPU: the
diagnosis behind docs/performance.md's "Where FSDP2's host time goes".

vit-debug b4 fp32, one gloo rank, one thread; ``single`` and ``fsdp2-full`` built by the ladder
as a rung builds them (``apply_strategy``, ``make_optimizer``), timed by the training thread's
CPU time in blocks of 10 steps, the builds in turn (A, B, A, B, ...), as bench_host does. Two
readings:

- **parts**: FSDP2's hook functions (``FSDPState`` / ``FSDPParamGroup``) wrapped with a CPU-time
  accumulator (inclusive ms a step; ``of which`` rows are inside the row above them), the
  cyclic GC off while timed (a rare full collection lands in whichever function allocates).
- **ablation** (``--ablate``): torch patched IN THIS PROCESS ONLY, for diagnosis, never in a
  rung: FSDP2 without its ``record_function`` annotations, without the ``torch._dynamo.disable``
  wrapper it builds around every hook call (torch offers no switch for it: ``_fsdp_common.
  _dynamo_disable`` calls ``torch._dynamo.disable(func)`` on each call), and, through FSDP2's
  public ``set_reshard_after_forward(False)``, with the last layer kept gathered from forward
  into backward (torchtitan's default; NOT what ``fsdp2-full`` means, so not a rung's).

    python benchmarks/fsdp2_host_parts.py --blocks 15 --ablate
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

# TRAP: FSDPState._pre_forward/_post_forward are bound into module hooks when fully_shard runs, so
# wrapping them afterwards times nothing; the param group's pre_forward/post_forward, looked up
# on every call, are wrapped instead (the state hooks add the dynamo wrapper around them).
STATE_HOOKS = ("_pre_backward", "_root_post_backward_final_callback")
GROUP_PARTS = ("pre_forward", "wait_for_unshard", "post_forward", "reshard", "post_backward")


def _build(strategy: str, keep_last: bool = False) -> Callable[[], None]:
    import torch

    from scaleladder.models.build import build_model
    from scaleladder.flavors import get_flavor
    from scaleladder.rung.batches import synthetic_batch
    from scaleladder.rung.parallelize import apply_strategy
    from scaleladder.rung.optim import backward_and_step, make_optimizer
    from scaleladder.rung.precision import policy
    from scaleladder.spec import default_knobs, parse_strategy

    torch.manual_seed(0)
    flavor, s = get_flavor("vit-debug"), parse_strategy(strategy)
    model, _ = apply_strategy(build_model(flavor), s, default_knobs(s), policy("fp32"), torch.device("cpu"))  # type: ignore[arg-type]
    if keep_last:
        [m for m in model.modules() if isinstance(m, model.layer_cls)][-1].set_reshard_after_forward(False)  # type: ignore[arg-type,operator]
    optimizer = make_optimizer(model.parameters(), 1e-4, "fp32")
    batch = synthetic_batch(flavor, 4, 0, 0, 0)

    def step() -> None:
        backward_and_step(model(batch), optimizer, None)

    for _ in range(3):  # lazy init, optimizer state
        step()
    return step


def _median_ms(step: Callable[[], None]) -> float:
    times = []
    for _ in range(10):
        t0 = time.thread_time()
        step()
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def interleaved(steps: dict[str, Callable[[], None]], blocks: int) -> dict[str, float]:
    """Median over ``blocks`` of each build's median step (ms), the builds in turn."""
    got: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(blocks):
        for k, step in steps.items():
            got[k].append(_median_ms(step))
    return {k: statistics.median(v) for k, v in got.items()}


def parts(step: Callable[[], None], n: int) -> dict[str, float]:
    """Inclusive host ms a step of FSDP2's hooks and their main parts, over ``n`` steps."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param_group as pg, _fsdp_state as st

    acc: collections.Counter[str] = collections.Counter()
    patched: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, label: str) -> None:
        real = getattr(owner, name)

        @functools.wraps(real)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                acc[label] += time.thread_time() - t0
        patched.append((owner, name, real))
        setattr(owner, name, timed)

    for name in STATE_HOOKS:
        wrap(st.FSDPState, name, name)
    for name in GROUP_PARTS:
        wrap(pg.FSDPParamGroup, name, "FSDPParamGroup." + name)
    wrap(pg, "foreach_reduce", "foreach_reduce")
    assert _fsdp_collectives  # foreach_reduce is looked up in the param group's module
    gc.disable()
    try:
        t0 = time.thread_time()
        for _ in range(n):
            step()
        total = time.thread_time() - t0
    finally:
        gc.enable()
        for owner, name, real in patched:
            setattr(owner, name, real)
    return {"step": total / n * 1e3, **{k: v / n * 1e3 for k, v in acc.items()}}


def ablated(step: Callable[[], None], annotations: bool, dynamo: bool) -> Callable[[], None]:
    """``step`` with FSDP2's annotations and/or dynamo wrappers made no-ops while it runs."""
    import contextlib

    import torch
    import torch._dynamo
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    real = (pg.record_function, torch.profiler.record_function, torch._dynamo.disable)

    def no_disable(fn: Any = None, recursive: bool = True, **_: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    def run() -> None:
        if annotations:
            pg.record_function = torch.profiler.record_function = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
        if dynamo:
            torch._dynamo.disable = no_disable  # type: ignore[assignment]
        try:
            step()
        finally:
            pg.record_function, torch.profiler.record_function, torch._dynamo.disable = real  # type: ignore[assignment]
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=15, help="interleaved blocks of 10 steps per build")
    ap.add_argument("--ablate", action="store_true", help="also time FSDP2 without annotations / dynamo wrappers / last reshard")
    a = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401  (before any group: tests/helpers/gloo.py)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        builds = {"single": _build("single"), "fsdp2-full": _build("fsdp2-full")}
        for k, v in parts(builds["fsdp2-full"], 10 * a.blocks).items():
            print(f"parts: {k:40s} {v:7.2f} ms a step")
        if a.ablate:
            f = builds["fsdp2-full"]
            builds |= {"no annotations": ablated(f, True, False), "no dynamo wrappers": ablated(f, False, True),
                       "neither": ablated(f, True, True), "last layer kept gathered": _build("fsdp2-full", keep_last=True)}
        got = interleaved(builds, a.blocks)
        for k, v in got.items():
            print(f"{k:28s} {v:7.2f} ms  {v / got['single']:.2f}x single")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
