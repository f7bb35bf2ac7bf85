"""Which FLAVA implementation a rung builds, by name (torch-free: ``run``'s argument parsing
and the workflow read it without importing torch).

* ``sdpa`` (the default): TorchMultimodal's FLAVA with its layers' attention on
  ``torch.nn.functional.scaled_dot_product_attention``, LayerNorms without redundant casts and
  losses that never wait for the device (``models/flava_attention.py``, ``flava_norm.py``,
  ``flava_losses.py``). Same parameters, same state_dict keys, the same loss.
* ``torchmultimodal``: the installed package's own modules, untouched (for comparison and parity).

Both build the same parameters: checkpoints, initialisation, FSDP units and the planner's
stored layouts do not depend on the choice (docs/models.md, "FLAVA implementations").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scaleladder.errors import SpecError

if TYPE_CHECKING:
    from scaleladder.models.family import Family

SDPA = "sdpa"
TORCHMULTIMODAL = "torchmultimodal"
FLAVA_IMPLS = (SDPA, TORCHMULTIMODAL)
DEFAULT = SDPA


def parse_flava_impl(value: str) -> str:
    """``value`` if it names an implementation; else one line naming it (SpecError, exit 2)."""
    if value not in FLAVA_IMPLS:
        raise SpecError(f"--flava-impl {value!r}: unknown FLAVA implementation; known: {', '.join(FLAVA_IMPLS)}")
    return value


def recorded(family: Family, impl: str) -> str:
    """What a rung's record says in ``flava_impl``: the implementation for a family it applies to
    (``Family.uses_flava_impl``: FLAVA), else "" (ViT: one torchmultimodal ViT exists; a value
    there would invite a false condition in compare)."""
    return impl if family.uses_flava_impl else ""
