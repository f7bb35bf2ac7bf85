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
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import torch
from torch import nn


def make_param_init_fn(root: nn.Module, device: torch.device) -> Callable[[nn.Module], None]:
    owners: dict[int, list[tuple[nn.Module, str]]] = defaultdict(list)
    for module in root.modules():
        for name, p in module._parameters.items():
            if p is not None:
                owners[id(p)].append((module, name))

    def init(module: nn.Module) -> None:
        fresh = False
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_meta:
                continue
            new = nn.Parameter(torch.empty_like(p, device=device), requires_grad=p.requires_grad)
            for owner, owner_name in owners[id(p)]:
                owner._parameters[owner_name] = new
            fresh = True
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_meta:
                module._buffers[name] = torch.zeros_like(b, device=device)
        if fresh:
            _reset(module)

    return init


@torch.no_grad()
def _reset(module: nn.Module) -> None:
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
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


def materialize(root: nn.Module, device: torch.device) -> nn.Module:
    """Materialise every meta parameter of ``root`` on ``device`` (non-FSDP path)."""
    init = make_param_init_fn(root, device)
    for module in list(root.modules()):
        init(module)
    return root
