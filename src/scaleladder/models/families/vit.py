"""ViT classification: TorchMultimodal's vision transformer with a linear head on the CLS token,
trained with cross-entropy on class labels (the ORNL ViT-FSDP seed's model).

What differs from FLAVA, all of it here: one stack of blocks, one input (an image and its
label), one item per sample (throughput in images/s), no frozen or unused parameters, and
the planner's facts for one encoder pass (its activation formulas are ``planner/activations.py``'s
``vit_calls``, the model ``activations`` names).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, cast

from scaleladder.models.family import Family, Inputs, Options

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from scaleladder.flavors import Flavor
    from scaleladder.models.flops import FlopCount
    from scaleladder.models.train_module import TrainModule


class VitFamily(Family):
    name: ClassVar[str] = "vit"
    inputs: ClassVar[Inputs] = "image"
    items_per_sample: ClassVar[int] = 1
    analytic: ClassVar[bool] = True
    throughput_unit: ClassVar[str] = "images/s"  # the ViT seed counts images
    classifier: ClassVar[bool] = True
    synthetic_labels: ClassVar[bool] = False  # unlabelled shards are refused, as they always were
    ops_per_layer_pass: ClassVar[int] = 126  # stated: planner/steptime.py's docstring
    activations: ClassVar[str] = "vision-transformer"  # planner/activations.py: vit_calls

    def build(self, flavor: Flavor, device: str | torch.device, options: Options) -> TrainModule:
        import torch

        from scaleladder.models.build import ViTClassifier

        with torch.device(device):
            return ViTClassifier(flavor)

    def block_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        return {cast("TrainModule", model).layer_cls}

    def synthetic_sample(self, flavor: Flavor, g: torch.Generator, global_index: int) -> dict[str, Tensor]:
        """``image`` (standard normal, 3 x S x S) and ``label`` (a class index)."""
        import torch

        s = flavor.image_size
        return {"image": torch.randn(3, s, s, generator=g), "label": torch.randint(flavor.num_classes, (), generator=g)}

    def flops(self, flavor: Flavor, recompute: bool, first: Mapping[str, Tensor], global_batch: int,
              options: Options) -> FlopCount:
        from scaleladder.models.flops import vit_flops

        return vit_flops(flavor, recompute)

    # -- the analytic planner ---------------------------------------------------------------

    def layer_counts(self, flavor: Flavor) -> list[int]:
        return [flavor.layers]

    def reduced(self, flavor: Flavor) -> Flavor:
        return dataclasses.replace(flavor, layers=1, mm_layers=0)

    def layer_passes(self, flavor: Flavor, options: Options) -> list[tuple[str, float]]:
        return [(f"layer{i}", 1.0) for i in range(flavor.layers)]

    def plan_flops(self, flavor: Flavor, ac: bool, global_batch: int, options: Options) -> FlopCount:
        from scaleladder.models.flops import vit_flops

        return vit_flops(flavor, ac)

    def input_bytes(self, flavor: Flavor, store: int) -> float:
        s = flavor.image_size
        return 3 * s * s * store + 8  # the image, and an int64 label


FAMILY = VitFamily()
