"""``source: python``: the user's own family, ``factory: "module:function"`` returning a Family.

The entry's ``path`` (absolute by now: models_file resolved it against the models file) goes
on ``sys.path`` first; ``factory(**kwargs)`` must return a
:class:`~scaleladder.models.family.Family` that defines ``build``, ``block_classes`` and
``synthetic_sample`` (the rest has defaults). It is used through :class:`Checked`, which says in
one line what is wrong with it (a build that is no module, blocks it does not find) and fills
a built module's ``flavor`` and ``layer_cls`` when the user's code leaves them out.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleladder.errors import SpecError
from scaleladder.models.family import Family
from scaleladder.models.sources.common import entry_where, first_line

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from scaleladder.flavors import Flavor
    from scaleladder.models.flops import FlopCount
    from scaleladder.models.train_module import TrainModule

#: What a user's family must define itself (models/family.py's docstring)
REQUIRED = ("build", "block_classes", "synthetic_sample")


class Checked(Family):
    """The user's family, each answer checked where a wrong one would fail far from its cause."""

    def __init__(self, inner: Family, where: str) -> None:
        self.inner, self.where = inner, where

    def build(self, flavor: Flavor, device: str | torch.device, options: Mapping[str, Any]) -> TrainModule:
        from torch import nn

        module = self.inner.build(flavor, device, options)
        if not isinstance(module, nn.Module):
            raise SpecError(f"{self.where}: build() returned {type(module).__name__}, not a TrainModule (an nn.Module whose forward(batch) is the loss)")
        blocks = self.inner.block_classes(module)
        if not blocks or not any(isinstance(m, tuple(blocks)) for m in module.modules()):
            named = ", ".join(sorted(c.__name__ for c in blocks)) or "none"
            raise SpecError(f"{self.where}: no blocks found: block_classes() names {named}, and the built model holds no "
                            "instance of them; return the class of its repeated layer")
        if getattr(module, "flavor", None) is None:
            module.flavor = flavor
        if getattr(module, "layer_cls", None) is None:
            module.layer_cls = min(blocks, key=lambda c: c.__name__)
        return module

    def block_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        return self.inner.block_classes(model)

    def extra_unit_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        return self.inner.extra_unit_classes(model)

    def stacks(self, model: nn.Module) -> list[list[nn.Module]]:
        return self.inner.stacks(model)

    def reset_parameters(self, module: nn.Module) -> None:
        self.inner.reset_parameters(module)

    def synthetic_sample(self, flavor: Flavor, g: torch.Generator, global_index: int) -> dict[str, Tensor]:
        return self.inner.synthetic_sample(flavor, g, global_index)

    def flops(self, flavor: Flavor, recompute: bool, first: Mapping[str, Tensor], global_batch: int,
              options: Mapping[str, Any]) -> FlopCount | None:
        return self.inner.flops(flavor, recompute, first, global_batch, options)


def python_family(entry: Mapping[str, Any]) -> Family:
    """The family ``entry``'s factory returns, checked (one-line SpecErrors naming the culprit)."""
    where = entry_where(entry)
    factory = str(entry["factory"])
    module_name, _, function = factory.partition(":")
    path = entry.get("path")
    if path is not None:
        if not Path(path).is_dir():
            raise SpecError(f"{where}: path {path!r} is not a folder")
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SpecError(f"{where}: factory {factory!r}: module {module_name!r} cannot be imported ({e}); "
                        "is `path:` the folder that holds it?") from None
    except Exception as e:  # the user's module failed while importing: name it, one line
        raise SpecError(f"{where}: factory {factory!r}: importing {module_name!r} raised {type(e).__name__}: {first_line(e)}") from None
    make = getattr(module, function, None)
    if not callable(make):
        raise SpecError(f"{where}: factory {factory!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no function {function!r}")
    kwargs = dict(entry.get("kwargs", {}))
    try:
        family = make(**kwargs)
    except Exception as e:  # the user's factory: name it and what it raised, one line
        raise SpecError(f"{where}: factory {factory!r}(**{kwargs}) raised {type(e).__name__}: {first_line(e)}") from None
    if not isinstance(family, Family):
        raise SpecError(f"{where}: factory {factory!r} returned {type(family).__name__}, not a scaleladder.models.family.Family")
    missing = [m for m in REQUIRED if getattr(type(family), m) is getattr(Family, m)]
    if missing:
        raise SpecError(f"{where}: factory {factory!r}'s family {type(family).__name__} does not define {', '.join(missing)}")
    checked = type(f"Checked{type(family).__name__}", (Checked,), {
        "name": family.name or str(entry.get("model", "python")), "inputs": family.inputs,
        "items_per_sample": family.items_per_sample, "analytic": family.analytic,
    })
    result: Family = checked(family, where)
    return result
