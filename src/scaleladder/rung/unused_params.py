"""FLAVA's unused parameters: which parameters one training step never gives a gradient,
found once per family by a probe, and frozen before wrapping (in a family whose
``freezes_unused`` says so: models/family.py).

Frozen once, structurally, instead of DDP's ``find_unused_parameters`` (which searches the
autograd graph every step). The probe trains the family's debug flavor one step on the CPU,
so it runs before the rank's process group exists (``rung/run.py`` calls it first); its
answer is kept on disk (``rung/probe_cache.py``). ``rung/parallelize.py``'s
``apply_strategy`` calls :func:`freeze_unused` before it wraps anything.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from scaleladder.models.build import TrainModule
from scaleladder.models.families import family_of


def freeze_unused(model: TrainModule) -> int:
    """Freeze the parameters training never uses (FLAVA pretraining's heads and poolers), in a
    family that freezes them; return how many elements."""
    family = family_of(model.flavor)
    if not family.freezes_unused:
        return 0
    unused = unused_parameter_names(family.name)
    n = 0
    for name, p in model.named_parameters():
        if name in unused and p.requires_grad:
            p.requires_grad_(False)
            n += p.numel()
    return n


_UNUSED_CACHE: dict[str, frozenset[str]] = {}


def unused_parameter_names(family: str) -> frozenset[str]:
    """Parameter names that get no gradient in one training step, found once on the
    family's debug flavor ``<family>-debug`` (names are structural: heads and poolers, not layers).

    The probe is a forward and backward ON THE CPU, so it must run before the process
    group exists (rung.run._main calls this first). TRAP: FLAVA's contrastive loss
    all-gathers whenever a group exists; an NCCL/RCCL group serves only GPU tensors and
    fails on the probe's CPU tensors ("No backend type associated with device type
    cpu") before the rung's first step, for every strategy. gloo accepts CPU tensors,
    so on the CPU this ordering error is invisible: hence the refusal below, which a
    CPU test can see.
    """
    if family not in _UNUSED_CACHE:
        # refused before the disk cache is asked, so that a warm cache cannot hide a caller that
        # probes inside the group (which a cold cache, under NCCL, would then fail on)
        if dist.is_available() and dist.is_initialized():
            raise RuntimeError(f"the unused-parameter probe for {family} must run before the process group exists: "
                               "its CPU forward would issue collectives on CPU tensors, which NCCL/RCCL refuse")
        from scaleladder.rung import probe_cache

        cached = probe_cache.load(family)  # ~2 s saved per FLAVA rank (rung/probe_cache.py)
        if cached is not None:
            _UNUSED_CACHE[family] = cached
            return cached
        from scaleladder.flavors import get_flavor
        from scaleladder.models.build import build_model
        from scaleladder.rung.batches import synthetic_batch

        debug = get_flavor(f"{family}-debug")
        with torch.random.fork_rng():
            torch.manual_seed(0)
            probe = build_model(debug, "cpu")
        probe(synthetic_batch(debug, 10, 0, 0, 0)).backward()
        _UNUSED_CACHE[family] = frozenset(n for n, p in probe.named_parameters() if p.requires_grad and p.grad is None)
        probe_cache.store(family, _UNUSED_CACHE[family])
    return _UNUSED_CACHE[family]
