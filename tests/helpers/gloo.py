"""A real one-rank gloo process group inside the test process, for code that calls
collectives (the ladder, the timed loop) without paying for a torchrun launch."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

# TRAP: the autograd collectives here (torchmultimodal's contrastive loss uses all_gather)
# take `group=group.WORLD` as a default argument, evaluated when the module is imported.
# Imported while a group exists, they keep that group object forever, and the next group
# in this process fails with "not initialized in the world group map". Imported first,
# with no group yet, the default is None: "whatever the current group is".
import torch.distributed.nn.functional  # noqa: F401


@contextmanager
def one_rank_group() -> Iterator[None]:
    if dist.is_initialized():  # a caller already made one: leave it to them
        yield
        return
    # As the runner does: the unused-parameter probes run before any group exists
    # (rung.unused_params.unused_parameter_names refuses to run inside one; NCCL would fail there).
    from scaleladder.rung.unused_params import unused_parameter_names

    for family in ("vit", "flava"):
        unused_parameter_names(family)
    # An in-process store: no port to pick, nothing left behind if a test fails.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
