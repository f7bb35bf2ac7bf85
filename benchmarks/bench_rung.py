"""Harness overhead: scaleladder's timed loop against a bare training loop.

Same model, batch, precision and data, in ONE process, interleaved (bare, harness,
bare, harness, ...) so drift and thermal effects hit both equally. Prints the
ratio of median step times, harness / bare. Target on a GPU: <= 1.02.

    python benchmarks/bench_rung.py --model vit-debug --batch 32 --steps 30 --repeats 3
    python benchmarks/bench_rung.py --model vit-base --precision bf16-mixed --batch 64   # on a GPU

The harness here is the real one: the process group, the ladder's `single`
strategy (unwrapped, like the bare loop), synthetic batches, the per-step events
or timers, and the per-step device-side loss record.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from scaleladder import launch
from scaleladder.batches import SyntheticBatches
from scaleladder.bench import train_loop
from scaleladder.models.build import build_model
from scaleladder.models.flavors import get_flavor
from scaleladder.parallel import apply_strategy
from scaleladder.precision import policy
from scaleladder.spec import Knobs, parse_strategy


def bare(model, opt, batches, prec, device, steps: int) -> float:
    """The loop a user would write: no events, no loss record. Median step time."""
    times = []
    for batch in batches:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        with prec.autocast(device):
            loss = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t)
    return float(np.median(times[1:]))


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
    launch.init(env, device)
    flavor, prec = get_flavor(a.model), policy(a.precision)
    prec.apply_backend_flags()
    torch.manual_seed(0)
    model = build_model(flavor, device).to(dtype=prec.storage_dtype)
    model, _ = apply_strategy(model, parse_strategy("single"), Knobs(), prec, device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batches = SyntheticBatches(flavor, a.batch, 0, a.steps, 0, device, dtype=prec.storage_dtype)
    bare_t, harness_t = [], []
    for _ in range(a.repeats):
        bare_t.append(bare(model, opt, batches, prec, device, a.steps))
        m = train_loop(model, opt, batches, a.steps, 1, prec, device)
        harness_t.append(float(np.median(m.step_time_s[1:])))
    b, h = float(np.median(bare_t)), float(np.median(harness_t))
    print(f"device={device} model={a.model} precision={a.precision} batch={a.batch} steps={a.steps} repeats={a.repeats}")
    print(f"bare median step {b * 1e3:.2f} ms | harness median step {h * 1e3:.2f} ms | harness/bare = {h / b:.3f}")


if __name__ == "__main__":
    main()
