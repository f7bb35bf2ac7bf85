"""Check a shard set before the first batch, and make every rank agree on the verdict.

Why up front and not lazily, as each shard is first drawn: a corrupt shard found
mid-run stops the one rank that drew it while the others wait for it in a
collective, so the run hangs until the NCCL/gloo timeout and the rung records a
timeout instead of naming the shard. Checked before training, every rank fails at
once with the same one-line message.

Who hashes what. With resampling every rank can draw every shard, so every shard
must be hashed by someone. With a process group of this world, rank r hashes
``shards[r::world]`` (1/world of the bytes, the ranks in parallel) and one
``all_gather_object`` shares the verdicts. Without one (a single process, a test
building one rank's loader) the rank hashes every shard itself: it cannot learn
what the others found.

Cost: sha256 runs at about 1.5 GB/s per core on the dev VM (SHA-NI, files in the
page cache; measured by benchmarks/bench_data.py), so a rank's share of a 20 GB
set on 8 ranks takes about 2 s plus the reads. ``make_loader(..., verify=False)`` skips the hashing;
the sizes are always checked.

Trap: ``all_gather_object`` on NCCL pickles into CUDA tensors on the *current*
device, so ``torch.cuda.set_device`` must have been called (``launch.pick_device``
does); on gloo it uses CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from scaleladder.data.data_errors import DataError, one_line, set_speaker
from scaleladder.data.manifest import Manifest, ShardEntry, check_sizes, verify_shard

T = TypeVar("T")


def _shared(rank: int, world: int) -> bool:
    """Whether a process group of exactly this rank and world exists to share verdicts over."""
    return (world > 1 and dist.is_available() and dist.is_initialized()
            and dist.get_world_size() == world and dist.get_rank() == rank)


def shards_to_hash(shards: list[ShardEntry], rank: int, world: int) -> list[ShardEntry]:
    """This rank's share of the hashing: a 1/world slice with a group to share over, else all."""
    return shards[rank::world] if _shared(rank, world) else list(shards)


def check_shards(manifest: Manifest, rank: int, world: int, hash_shards: bool = True) -> None:
    """Every shard exists with its size; this rank's share of them matches its sha256."""
    check_sizes(manifest)
    if hash_shards:
        for entry in shards_to_hash(manifest.shards, rank, world):
            verify_shard(entry, manifest.path)


def agreed(step: Callable[[], T], rank: int, world: int) -> T:
    """Run ``step`` on every rank; if it failed on any, raise on every rank.

    The failing rank re-raises its own error; the others raise a DataError with the
    first failing rank's message. Without a group to share over, only this rank's
    own result counts.

    Every raised error is marked (``errors.set_speaker``) with whether this rank prints
    it: the lowest rank that found that very message does, the others exit silently.
    So a manifest fault all ranks find is printed once (rank 0) instead of once per rank
    (N copies, even run together on one line when the ranks write at once), while a
    shard only rank r hashed and found corrupt is printed by r, and the ranks that
    merely learned of it through the gather say nothing.
    """
    error: Exception | None = None
    try:
        result = step()
    except Exception as e:  # shared whatever it is: a rank left to train alone would hang
        error = e
    if _shared(rank, world):
        problems: list[str | None] = [None] * world
        mine = None if error is None else one_line(error)
        dist.all_gather_object(problems, mine)
        if error is None:
            found = next(((r, p) for r, p in enumerate(problems) if p is not None), None)
            if found is not None:
                learned = DataError(f"{found[1]} (found by rank {found[0]})")
                set_speaker(learned, False)  # its finder prints it
                raise learned
        else:
            # Compared as one_line() gave them, as gathered: equal lines are the same fault.
            set_speaker(error, problems.index(mine) == rank)
    if error is not None:
        raise error
    return result
