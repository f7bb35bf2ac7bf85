"""Run under torchrun with 2 gloo ranks: one fp16-mixed optimizer step through the runner's
scaler and optimizer (rung/optim.py) where ONLY rank 0's gradient holds an inf, as when the
inf falls in the shard FSDP gives rank 0. Prints, per rank, whether the update was
skipped and the scale after it. Both ranks must skip and halve the scale."""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaleladder.rung.optim import backward_and_step, make_optimizer, make_scaler


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    w = torch.nn.Parameter(torch.ones(4))
    opt = make_optimizer([w], 1e-2, "fp16-mixed")
    scaler = make_scaler("fp16-mixed", fsdp=True, device=torch.device("cpu"))
    x = torch.ones(4)
    if rank == 0:
        x[1] = float("inf")
    loss = (w * x).sum()
    backward_and_step(loss, opt, scaler)
    skipped = bool(torch.equal(w.detach(), torch.ones(4)))
    print(f"RANK {rank} skipped={skipped} scale={float(scaler.get_scale())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
