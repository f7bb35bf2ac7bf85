"""Run under torchrun with 2 gloo ranks: fp16-mixed optimizer steps through the runner's
scaler and optimizer (rung/optim.py) for each FSDP generation, where an inf reaches the
gradient shard of ONE rank (as when it falls in the shard FSDP gives rank 0) or of EVERY
rank (an overflow that reaches all of them). Prints, per case and rank, whether the update
was skipped, the scale after it and the optimizer's step counter. In every inf case both
ranks must skip, halve the scale and keep the counter at 0; in the clean case both step.

* FSDP1: the runner's sharded scaler on plain tensors (each rank's gradient stands for its
  shard of a flat parameter).
* FSDP2: a real fully_shard module: its 4-element parameter is split [0:2] on rank 0 and
  [2:4] on rank 1, and the reduce-scatter puts the inf of rank 0's input at index 1 into
  rank 0's shard only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from scaleladder.rung.optim import _local, backward_and_step, make_optimizer, make_scaler
from scaleladder.spec import parse_strategy


class Dot(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum()


def _input(case: str, rank: int) -> torch.Tensor:
    x = torch.ones(4)
    if case == "all-inf" or case == "one-inf" and rank == 0:
        x[1] = float("inf")
    return x


def run(generation: str, case: str, rank: int) -> str:
    if generation == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        module: nn.Module = fully_shard(Dot(), mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        strategy = parse_strategy("fsdp2-full")
    else:
        module, strategy = Dot(), parse_strategy("fsdp-full")
    w = module.w
    opt = make_optimizer([w], 1e-2, "fp16-mixed")
    scaler = make_scaler("fp16-mixed", strategy, device=torch.device("cpu"))
    before = _local(w).detach().clone()
    backward_and_step(module(_input(case, rank)), opt, scaler)
    skipped = bool(torch.equal(_local(w).detach(), before))
    finite = bool(torch.isfinite(_local(w)).all())
    step = float(opt.state[w]["step"])
    return f"CASE {generation} {case} RANK {rank} skipped={skipped} finite={finite} scale={float(scaler.get_scale())} step={step:g}"


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    lines = [run(generation, case, rank) for generation in ("fsdp1", "fsdp2") for case in ("one-inf", "all-inf", "clean")]
    # Rank 0 prints everyone's lines: two processes printing to one pipe can interleave mid-line.
    everyone: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, lines)
    if rank == 0:
        print("\n".join(line for per_rank in everyone for line in per_rank), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
