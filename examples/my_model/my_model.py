"""A family of your own (docs/your-model.md): a tiny MLP-Mixer that classifies images."""
import torch
from torch import nn

from scaleladder.models.family import Family
from scaleladder.models.train_module import TrainModule


def mlp(n: int) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(n), nn.Linear(n, 2 * n), nn.GELU(), nn.Linear(2 * n, n))


class MixerBlock(nn.Module):  # the block: an FSDP unit, what -ac checkpoints and -compile compiles
    def __init__(self, tokens: int, width: int) -> None:
        super().__init__()
        self.tokens, self.channels = mlp(tokens), mlp(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(x.transpose(1, 2)).transpose(1, 2)
        return x + self.channels(x)


class Mixer(TrainModule):  # forward(batch) -> the loss
    def __init__(self, flavor, width: int, depth: int, patch: int) -> None:
        super().__init__()
        self.flavor, self.layer_cls = flavor, MixerBlock
        self.embed = nn.Conv2d(3, width, patch, patch)
        self.blocks = nn.Sequential(*(MixerBlock((flavor.image_size // patch) ** 2, width) for _ in range(depth)))
        self.head = nn.Linear(width, flavor.num_classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self.blocks(self.embed(batch["image"]).flatten(2).transpose(1, 2))
        return nn.functional.cross_entropy(self.head(x.mean(1)).float(), batch["label"])


class MixerFamily(Family):
    name, inputs = "mixer", "image"  # it trains on labelled images

    def __init__(self, width: int = 64, depth: int = 4, patch: int = 8) -> None:
        self.dims = (width, depth, patch)

    def build(self, flavor, device, options):
        with torch.device(device):
            return Mixer(flavor, *self.dims)

    def block_classes(self, model):
        return {MixerBlock}

    def synthetic_sample(self, flavor, g, global_index):  # drawn from g alone: the same at any world size
        s = flavor.image_size
        return {"image": torch.randn(3, s, s, generator=g), "label": torch.randint(flavor.num_classes, (), generator=g)}


make = MixerFamily  # the factory the models file names (my_model:make): make(**kwargs) returns the Family
