"""Harness overhead: scaleladder's timed loop against a bare training loop.

Same model, batch, precision and data, in ONE process, interleaved (bare, harness,
bare, harness, ...) so drift and thermal effects hit both equally. Prints the
ratio of mean step times, harness / bare. Target on a GPU: <= 1.02.

    python benchmarks/bench_rung.py --model vit-debug --batch 32 --steps 30 --repeats 3
    python benchmarks/bench_rung.py --model vit-base --precision bf16-mixed --batch 64   # on a GPU

The harness here is the real one: the process group, the ladder's `single`
strategy (unwrapped, like the bare loop), synthetic batches, the per-step events
or timers, and the per-step device-side loss record.

Both loops are timed the same way, by the harness's own definition of its window
(docs/metrics.md): one device sync after the warm-up step, wall time to one sync
after the last step, divided by the measured steps. Timing the bare loop per step
with a sync before and after each step (as this script once did) would charge it
GPU idle gaps the harness never has, and flatter the harness.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from scaleladder.rung import launch
from scaleladder.rung.batches import SyntheticBatches
from scaleladder.rung.loop import train_loop
from scaleladder.models.build import build_model
from scaleladder.flavors import get_flavor
from scaleladder.rung.parallelize import apply_strategy
from scaleladder.rung.unused_params import unused_parameter_names
from scaleladder.rung.optim import make_optimizer
from scaleladder.rung.precision import policy
from scaleladder.spec import Knobs, parse_strategy


def bare(model, opt, batches, prec, device, warmup: int) -> float:
    """The loop a user would write: no events, no loss record. Mean step time after
    ``warmup`` steps, wall clock between two device syncs (the harness's window)."""
    model.train()  # as train_loop does (FLAVA keeps its codebook in eval either way)
    t0 = 0.0
    n = 0
    for step, batch in enumerate(batches):
        if step == warmup:
            _sync(device)
            t0 = time.perf_counter()
        with prec.autocast(device):
            loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        n += 1
    _sync(device)
    return (time.perf_counter() - t0) / (n - warmup)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit-debug")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    env = launch.detect()
    device = launch.pick_device(env)
    flavor, prec = get_flavor(a.model), policy(a.precision)
    unused_parameter_names(flavor.family)  # before the group, as the runner does (rung/unused_params.py)
    launch.init(env, device)
    prec.apply_backend_flags()
    torch.manual_seed(0)
    model = build_model(flavor, device).to(dtype=prec.storage_dtype)
    model, _ = apply_strategy(model, parse_strategy("single"), Knobs(), prec, device)
    opt = make_optimizer(model.parameters(), 1e-4, a.precision)  # the runner's optimizer
    batches = SyntheticBatches(flavor, a.batch, 0, a.steps, 0, device, dtype=prec.storage_dtype)
    warmup = 1
    bare_t, harness_t = [], []
    for _ in range(a.repeats):
        bare_t.append(bare(model, opt, batches, prec, device, warmup))
        m = train_loop(model, opt, batches, steps=a.steps, warmup=warmup, prec=prec, device=device)
        harness_t.append(m.window_s / m.measured_steps)
    b, h = float(np.median(bare_t)), float(np.median(harness_t))
    print(f"device={device} model={a.model} precision={a.precision} batch={a.batch} steps={a.steps} repeats={a.repeats}")
    print(f"bare mean step {b * 1e3:.2f} ms | harness mean step {h * 1e3:.2f} ms | harness/bare = {h / b:.3f} "
          f"(median of {a.repeats} repeats; each: window between device syncs / measured steps)")


if __name__ == "__main__":
    main()
