"""One rank of tests/test_sources.py's CLIP parity check, started by torch.multiprocessing (gloo, CPU).

Each rank builds the models-file entry it is given from the same seed, wraps it in DDP, takes
its half of the global batch, and saves its loss and its (averaged) gradients for the test to
hold against a single process's on the whole batch.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from scaleladder.models.families import family_of
from scaleladder.models.models_file import register_entry


def global_batch(family: object, flavor: object, size: int) -> dict[str, torch.Tensor]:
    """The same global batch in every process: sample i from its own generator."""
    samples = [family.synthetic_sample(flavor, torch.Generator().manual_seed(1000 + i), i) for i in range(size)]  # type: ignore[attr-defined]
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


def rank_main(rank: int, world: int, name: str, entry: str, size: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{Path(out) / 'store'}", rank=rank, world_size=world)
    try:
        flavor = register_entry(name, entry)
        family = family_of(flavor)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(family.build(flavor, "cpu", {}))
        batch = global_batch(family, flavor, size)
        local = size // world
        loss = model({k: v[rank * local:(rank + 1) * local] for k, v in batch.items()})
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.module.named_parameters() if p.grad is not None}
        torch.save({"loss": loss.detach(), "grads": grads}, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
