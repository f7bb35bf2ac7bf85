"""``--data synthetic``: random batches made before the timed loop.

This mode exists permanently because it separates compute from the input
pipeline: a rung on synthetic data measures the model and the strategy alone.

Two properties matter and are tested:

* **World-size invariance.** Sample ``i`` of the global batch at step ``s`` is
  drawn from its own generator seeded by ``(seed, s, i)``. Rank ``r`` of ``w``
  takes samples ``r·b … r·b+b-1``, so the global batch is the same whatever the
  world size: the basis of the loss-parity test.
* **Equal per-rank counts for FLAVA** (its family's sample: models/families/flava.py).
  FLAVA's masked losses are means over the masked tokens of positive pairs *on each rank*;
  DDP/FSDP then average ranks.
  That equals the single-process mean only if every rank holds the same number
  of masked tokens and positives, so every sample masks exactly the same number
  of text tokens and patches, and ITM negatives sit at every 10th global index.

The generator is not timed: ``pool`` distinct batches (``SYNTHETIC_POOL`` by default)
are made up front and cycled (``step % pool``), on the device, before the first step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from scaleladder.flavors import Flavor
from scaleladder.models.batch_layout import SYNTHETIC_POOL
from scaleladder.models.families import family_of


def synthetic_batch(flavor: Flavor, local_batch: int, rank: int, step: int, seed: int) -> dict[str, Tensor]:
    """Rank ``rank``'s slice of the global batch of ``step`` (on the CPU): each sample is the
    family's (``Family.synthetic_sample``), from its own generator."""
    family = family_of(flavor)
    samples = []
    for j in range(local_batch):
        i = rank * local_batch + j
        g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_000_033 + i) % 2**62)
        samples.append(family.synthetic_sample(flavor, g, i))
    return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class SyntheticBatches:
    """Yields ``steps`` batches on ``device``, cycling a pool made up front."""

    def __init__(
        self, flavor: Flavor, local_batch: int, rank: int, steps: int, seed: int, device: torch.device,
        dtype: torch.dtype = torch.float32, pool: int = SYNTHETIC_POOL,
    ):
        self.steps = steps
        self.pool = [
            {k: v.to(device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in synthetic_batch(flavor, local_batch, rank, s, seed).items()}
            for s in range(min(pool, steps))
        ]

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        for s in range(self.steps):
            yield self.pool[s % len(self.pool)]

    def __len__(self) -> int:
        return self.steps
