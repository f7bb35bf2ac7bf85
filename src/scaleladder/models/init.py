"""Materialise a model built on the meta device, one module at a time.

Why: an FSDP rung of FLAVA-10B (41 GB in fp32) must never exist unsharded on one
40 GB A100, nor 8 copies of ViT-15B (58 GB) in a node's host memory. We build on
``meta`` and give FSDP a ``param_init_fn`` that allocates each module on the GPU
just before its unit is flattened and sharded.

Traps handled:
* ``Module.to_empty`` replaces a tied parameter in each owner separately and so
  silently unties it (FLAVA ties each MLM head's ``bias`` to its decoder's bias).
  We allocate per *parameter object* and put the new tensor in every owner.
* Modules without ``reset_parameters`` (class tokens, position embeddings, the
  DALL-E convolutions, ``logit_scale``) get an explicit rule below.
* Every rank visits modules in the same order with the same seeded RNG, so all
  ranks hold identical weights without a broadcast.
* Weights loaded from a file (FLAVA's DALL-E codebook, ``--codebook-weights``) cannot be
  loaded into a meta model — they would land nowhere — and must not be overwritten by
  the random init. They are passed as ``loaded`` (root-qualified names) and copied into
  each parameter right after it is allocated, inside the same per-unit call, so the
  codebook is real before FSDP flattens and shards its unit.
* A library model (a models-file entry: models/sources/) is built with only its parameters on
  meta: its buffers are what the library computed (RoPE frequencies, position ids), so they
  are moved to the device, never zeroed, and each module is initialised by its family's
  ``reset_parameters`` (``reset``: the library's own init), not by the rules below.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn


def make_param_init_fn(
    root: nn.Module, device: torch.device, loaded: Mapping[str, Tensor] | None = None,
    reset: Callable[[nn.Module], None] | None = None,
) -> Callable[[nn.Module], None]:
    """``loaded`` maps names in ``root.state_dict()`` to tensors that replace the random init;
    ``reset`` initialises a module whose parameters were just allocated (its family's
    ``reset_parameters``; default: :func:`default_reset`)."""
    reset_fn = reset or default_reset
    owners: dict[int, list[tuple[nn.Module, str]]] = defaultdict(list)
    for module in root.modules():
        for name, p in module._parameters.items():
            if p is not None:
                owners[id(p)].append((module, name))
    # Module objects, not names: activation checkpointing renames modules before FSDP calls us.
    prefixes = {id(m): f"{name}." if name else "" for name, m in root.named_modules()}
    loaded = dict(loaded or {})

    def init(module: nn.Module) -> None:
        fresh = False
        for p in list(module._parameters.values()):
            if p is None or not p.is_meta:
                continue
            new = nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
            for owner, owner_name in owners[id(p)]:
                owner._parameters[owner_name] = new
            fresh = True
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_meta:
                module._buffers[name] = torch.zeros_like(b, device=device)
            elif b is not None and b.device != device:  # a real buffer (a library model's): moved, kept
                module._buffers[name] = b.to(device)
        if fresh:
            reset_fn(module)
        if loaded:
            _load(module, prefixes.get(id(module)), loaded)

    return init


@torch.no_grad()
def _load(module: nn.Module, prefix: str | None, loaded: Mapping[str, Tensor]) -> None:
    if prefix is None:
        return
    for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        if prefix + name in loaded:
            t.copy_(loaded[prefix + name])


@torch.no_grad()
def default_reset(module: nn.Module) -> None:
    """A module materialised from meta, initialised by the seeds' rules (the default Family.reset_parameters)."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()
        return
    for name, p in module.named_parameters(recurse=False):
        if name == "logit_scale":
            p.fill_(math.log(1 / 0.07))  # CLIP/FLAVA's initial temperature
        elif p.dim() == 1:
            p.zero_()  # biases
        elif "token" in name or "embedding" in name:
            nn.init.trunc_normal_(p, std=0.02)  # ViT convention for CLS/mask tokens and positions
        else:
            p.normal_(std=1 / math.sqrt(p[0].numel()))  # fan-in scaling (the DALL-E convolutions)


def materialize(root: nn.Module, device: torch.device, loaded: Mapping[str, Tensor] | None = None,
                reset: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """Materialise every meta parameter of ``root`` on ``device`` (non-FSDP path)."""
    init = make_param_init_fn(root, device, loaded, reset)
    for module in list(root.modules()):
        init(module)
    return root


def materialize_empty(root: nn.Module, device: torch.device | str) -> nn.Module:
    """Each meta parameter and buffer of ``root`` replaced by an EMPTY tensor on ``device``: for
    fake-tensor runs (FLOP counts, memory traces), made inside ``FakeTensorMode``, where values
    do not matter and init functions such as ``trunc_normal_`` would raise.

    TRAP: ``to_empty``/``to`` go through ``Module._apply``, which must swap fake parameters and
    fails ("Couldn't swap Conv2d.weight"). And a tied parameter (FLAVA's MLM/MIM head biases)
    must stay one parameter, or FSDP1 meets a unit mixing frozen and trainable ones."""
    made: dict[int, nn.Parameter] = {}
    for m in root.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            if id(p) not in made:
                made[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
            setattr(m, name, made[id(p)])
        for name, b in list(m.named_buffers(recurse=False)):
            # by shape, not empty_like: a meta or real tensor is not a fake mode's input
            m._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)
    return root

