"""The module every family builds: ``forward(batch)`` returns the training loss.

Its own module, below ``models/family.py`` and ``models/build.py``: the family interface names it
and ``build.py`` builds through the families, so neither may import the other for it.
"""

from __future__ import annotations

from torch import nn

from scaleladder.flavors import Flavor


class TrainModule(nn.Module):
    """``forward(batch) -> scalar loss``; ``layer_cls`` names the transformer layer class (a built-in
    family's ``block_classes``)."""

    layer_cls: type[nn.Module]
    flavor: Flavor
