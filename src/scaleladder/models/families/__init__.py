"""The model families by name: :func:`family_of` (the family that builds a flavor) and the
built-in families, one module each (:data:`BUILT_IN` names them):

- ``vit``: ViT classification (TorchMultimodal's vision transformer, a linear head on CLS).
- ``flava``: FLAVA pretraining (TorchMultimodal's FLAVAForPreTraining and its DALL-E codebook).

Each module defines ``FAMILY``, a :class:`~scaleladder.models.family.Family`, and imports no
torch at import time (the planner and the workflow's process read them torch-free): the
modules themselves (``models/build.py``) and their FLOPs (``models/flops.py``) are imported
inside the methods that need them. The planner's activation formulas stay in the planner
(``planner/activations.py``), under the name a family's ``activations`` gives.

A models-file flavor's family is its source's (``models/sources/``). This lookup lives here,
not beside the interface in ``models/family.py``, because the sources' families subclass that
interface: the interface imports neither.

Imports from: models (family, sources, build, flops, flava_impl, batch_layout) and below.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from scaleladder.errors import SpecError
from scaleladder.models.family import Family

if TYPE_CHECKING:
    from scaleladder.flavors import Flavor



#: The built-in families by name: "module:attribute" of the family object, imported when asked.
BUILT_IN: Mapping[str, str] = {
    "vit": "scaleladder.models.families.vit:FAMILY",
    "flava": "scaleladder.models.families.flava:FAMILY",
}

_LOADED: dict[str, Family] = {}


def family_of(flavor: Flavor) -> Family:
    """The family that builds ``flavor``: a built-in one by name, or the one its models-file
    entry makes (``flavor.entry``)."""
    key = flavor.entry or flavor.family
    found = _LOADED.get(key)
    if found is None:
        if flavor.entry:
            from scaleladder.models.sources import family_for_entry

            found = family_for_entry(flavor)
        else:
            found = _load(flavor.family)
        _LOADED[key] = found
    return found


def built_in(name: str) -> Family | None:
    """The built-in family called ``name``; None for any other name (a models-file source's)."""
    return _load(name) if name in BUILT_IN else None


def _load(name: str) -> Family:
    where = BUILT_IN.get(name)
    if where is None:
        raise SpecError(f"unknown model family {name!r}; built in: {', '.join(BUILT_IN)}")
    module, attr = where.split(":")
    family: Family = getattr(importlib.import_module(module), attr)
    return family
