"""``source: timm``: an image classifier from timm, by name, with random weights.

Built with ``timm.create_model(name, pretrained=False, **kwargs)`` (``num_classes`` from the
entry when its kwargs give none). Its blocks are what timm's own parameter grouping calls
blocks: the modules whose names ``model.group_matcher(coarse=False)["blocks"]``'s repeated
patterns match whole (ConvNeXt: ``stages.<i>.blocks.<j>``, ViT: ``blocks.<i>``). Its loss:
cross-entropy of the logits against the labels.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn

from scaleladder.errors import SpecError
from scaleladder.flavors import Flavor
from scaleladder.models.family import Inputs
from scaleladder.models.sources.common import LibraryFamily, LibraryModule, classification_loss, first_line, no_blocks


class TimmClassifier(LibraryModule):
    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        logits = self.model(batch["image"])
        if isinstance(logits, (tuple, list)):  # distilled models in training mode: (head, distillation head)
            logits = logits[0]
        return classification_loss(logits, batch["label"])


class TimmFamily(LibraryFamily):
    name: ClassVar[str] = "timm"
    inputs: ClassVar[Inputs] = "image"

    def __init__(self, entry: Mapping[str, Any]) -> None:
        super().__init__(entry)
        import timm

        model_name = str(entry["name"])
        if not timm.is_model(model_name.split(".")[0]):  # a ".tag" names a pretrained config of the architecture
            close = difflib.get_close_matches(model_name, timm.list_models(), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (timm.list_models() lists them)"
            raise SpecError(f"{self.where}: timm has no model {model_name!r}{hint}")
        self.model_name = model_name

    def make(self, flavor: Flavor) -> nn.Module:
        import timm

        kwargs = dict(self.entry.get("kwargs", {}))
        kwargs.setdefault("num_classes", flavor.num_classes)
        kwargs.pop("pretrained", None)  # false (models_file refuses true)
        try:
            model: nn.Module = timm.create_model(self.model_name, pretrained=False, **kwargs)
        except (TypeError, ValueError, AssertionError, KeyError) as e:
            raise SpecError(f"{self.where}: timm.create_model({self.model_name!r}, **{kwargs}) failed: "
                            f"{type(e).__name__}: {first_line(e)}") from None
        return model

    def wrap(self, flavor: Flavor, model: nn.Module) -> LibraryModule:
        return TimmClassifier(flavor, model)

    def find_blocks(self, model: nn.Module) -> set[type[nn.Module]]:
        return {type(m) for m in timm_blocks(model, self.where)}


def block_patterns(model: nn.Module) -> list[str]:
    """The regexes of ``group_matcher(coarse=False)["blocks"]`` that stand for repeated blocks
    (those with a fixed group number, as ConvNeXt's ``downsample`` or a final ``norm``, do not)."""
    matcher = getattr(model, "group_matcher", None)
    if not callable(matcher):
        return []
    blocks = matcher(coarse=False).get("blocks", [])
    if isinstance(blocks, str):
        return [blocks]
    return [p for p, fixed in blocks if fixed is None]


def timm_blocks(model: nn.Module, where: str) -> list[nn.Module]:
    """The block modules, in order: the outermost modules whose qualified names match a block pattern whole."""
    patterns = [re.compile(p) for p in block_patterns(model)]
    found: list[nn.Module] = []
    taken: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        if name and any((m := p.match(name)) is not None and m.end() == len(name) for p in patterns):
            found.append(module)
            taken.append(name)
    if not found:
        rule = (f"group_matcher(coarse=False)['blocks'] patterns {', '.join(p.pattern for p in patterns)} match no module"
                if patterns else "it has no group_matcher with block patterns")
        raise no_blocks(where, model, rule)
    return found
