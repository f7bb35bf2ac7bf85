"""Who is reading: a *reader* is one (rank, DataLoader worker) pair.

Shard assignment and every random stream (shard order, shuffle buffer, crops,
masks, ITM negatives) are keyed by the reader, so a run is reproducible for a
given ``(seed, world, workers)`` and no two readers produce the same stream.

Trap: the worker id is only known *inside* the worker process, so anything that
depends on it must be created lazily on first use there, never in ``__init__``
(which runs in the main process, before the DataLoader forks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch.utils.data


@dataclass(frozen=True)
class Reader:
    rank: int
    world: int
    worker: int
    workers: int  # DataLoader workers per rank (1 when loading in the main process)

    @property
    def index(self) -> int:
        return self.rank * self.workers + self.worker

    @property
    def count(self) -> int:
        return self.world * self.workers

    def rng(self, seed: int, stream: int) -> np.random.Generator:
        """An independent generator for one purpose (``stream``) of this reader."""
        return np.random.default_rng([seed, self.rank, self.worker, stream])


def current_reader(rank: int, world: int) -> Reader:
    """The reader of the calling process. Rank and world are passed in explicitly:
    webdataset's own helpers read them from the environment or torch.distributed,
    which is wrong for a loader built before ``init_process_group`` (and in tests)."""
    info = torch.utils.data.get_worker_info()
    if info is None:
        return Reader(rank, world, 0, 1)
    return Reader(rank, world, info.id, info.num_workers)


# Named random streams (arbitrary distinct constants).
SHARD_ORDER, SHUFFLE, IMAGE, TEXT = 1, 2, 3, 4
