"""What the library sources share: the build (on meta: parameters only, the library's init
replayed per module), the synthetic samples by input kind, the text ids, and CLIP's loss gathered
over the ranks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

import scaleladder.models.sources.meta_init as meta_init
from scaleladder.errors import SpecError
from scaleladder.flavors import Flavor
from scaleladder.models.batch_layout import FIRST_WORD
from scaleladder.models.family import Family
from scaleladder.models.models_file import BOS_ID, EOS_ID, PAD_ID
from scaleladder.models.train_module import TrainModule

# The project tokenizer's special ids (models_file.py says why these).
BOS = BOS_ID  # [CLS]
EOS = EOS_ID  # [SEP]
TEXT_IDS: Mapping[str, int] = {"pad_token_id": PAD_ID, "bos_token_id": BOS, "eos_token_id": EOS}


def entry_where(entry: Mapping[str, Any]) -> str:
    """How a one-line error names an entry: its model name and source."""
    return f"model {entry.get('model', '?')!r} ({entry.get('source', '?')} entry)"


class LibraryModule(TrainModule):
    """A library model as a TrainModule: the model under ``model``, its block classes found at build."""

    block_types: frozenset[type[nn.Module]]

    def __init__(self, flavor: Flavor, model: nn.Module) -> None:
        super().__init__()
        self.flavor = flavor
        self.model = model


class LibraryFamily(Family):
    """A model a library builds (timm, transformers): one object per models-file entry.

    ``build`` on ``meta`` puts only the parameters there and records the library's init
    (sources/meta_init.py); ``reset_parameters`` replays it on a materialised module. On a real
    device the library builds and initialises as it always does."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.entry = dict(entry)
        self.where = entry_where(entry)

    # -- what a source defines -------------------------------------------------------------
    def make(self, flavor: Flavor) -> nn.Module:
        """The library's model, on the current device."""
        raise NotImplementedError

    def wrap(self, flavor: Flavor, model: nn.Module) -> LibraryModule:
        """The model as a TrainModule: ``forward(batch) -> loss``."""
        raise NotImplementedError

    def find_blocks(self, model: nn.Module) -> set[type[nn.Module]]:
        """The block classes by the library's own rule (the entry's ``blocks`` come first)."""
        raise NotImplementedError

    # -- the Family interface ---------------------------------------------------------------
    def build(self, flavor: Flavor, device: str | torch.device, options: Mapping[str, Any]) -> TrainModule:
        on_meta = torch.device(device).type == "meta"
        # the caller's default device is not ours: on meta, only the parameters go there
        where = torch.device("cpu") if on_meta else torch.device(device)
        if on_meta:
            model = meta_init.build_on_meta(lambda: self.make(flavor))
        else:
            with where:
                model = self.make(flavor)
        declared = self.entry.get("blocks")
        classes = declared_blocks(model, declared, self.where) if declared else self.find_blocks(model)
        with where:
            module = self.wrap(flavor, model)
        module.flavor = flavor
        module.block_types = frozenset(classes)
        module.layer_cls = min(classes, key=lambda c: c.__name__)
        return module

    def block_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        found = _find_attr(model, "block_types")
        if found is None:
            raise SpecError(f"{self.where}: block_classes() asked of a module this family did not build ({type(model).__name__})")
        return set(found)

    def reset_parameters(self, module: nn.Module) -> None:
        from scaleladder.models.init import default_reset

        meta_init.replay(module, _module_reset_or(default_reset))

    def synthetic_sample(self, flavor: Flavor, g: torch.Generator, global_index: int) -> dict[str, Tensor]:
        return synthetic_sample(self.inputs, flavor, g)


def _module_reset_or(default: Any) -> Any:
    def reset(module: nn.Module) -> None:
        own = getattr(module, "reset_parameters", None)
        if callable(own):
            own()
        else:
            default(module)

    return reset


def _find_attr(model: nn.Module, name: str) -> Any:
    """``model.<name>``, looking through wrappers (DDP's ``module``, FSDP's and AC's wrapped module)."""
    seen = 0
    current: Any = model
    while current is not None and seen < 8:
        found = current.__dict__.get(name)
        if found is not None:
            return found
        current = current.__dict__.get("_modules", {}).get("module") or current.__dict__.get("_modules", {}).get(
            "_fsdp_wrapped_module") or current.__dict__.get("_modules", {}).get("_checkpoint_wrapped_module")
        seen += 1
    return None


def declared_blocks(model: nn.Module, declared: list[str], where: str) -> set[type[nn.Module]]:
    """The classes the entry's ``blocks`` name, each found in the model."""
    by_name: dict[str, type[nn.Module]] = {type(m).__name__: type(m) for m in model.modules()}
    missing = [n for n in declared if n not in by_name]
    if missing:
        raise SpecError(f"{where}: blocks {', '.join(missing)} name no module class of {type(model).__name__} "
                        f"(classes it holds: {', '.join(sorted(by_name)[:12])}{'...' if len(by_name) > 12 else ''})")
    return {by_name[n] for n in declared}


def first_line(e: BaseException) -> str:
    """An exception's message, its first line only (errors here are one line)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def no_blocks(where: str, model: nn.Module, rule: str) -> SpecError:
    """The error for a model whose blocks the source's rule does not find: what to declare."""
    return SpecError(f"{where}: no blocks found in {type(model).__name__} ({rule}); declare its repeated layer class "
                     "in the entry, e.g. `blocks: [MyLayer]` (docs/your-model.md)")


# -- samples --------------------------------------------------------------------------------


def text_ids(flavor: Flavor, g: torch.Generator) -> Tensor:
    """``text_len`` ids: [CLS], words, [SEP] (the end of text last, as the shards' captions end)."""
    ids = torch.randint(FIRST_WORD, flavor.vocab_size, (flavor.text_len,), generator=g)
    ids[0], ids[-1] = BOS, EOS
    return ids


def synthetic_sample(inputs: str, flavor: Flavor, g: torch.Generator) -> dict[str, Tensor]:
    """One sample of ``--data synthetic`` for a model that trains on ``inputs``, drawn from ``g``.

    image: ``image`` float [3,S,S] and ``label`` int64; text: ``input_ids`` int64 [L];
    image-text: ``image`` and ``input_ids``."""
    out: dict[str, Tensor] = {}
    s = flavor.image_size
    if inputs in ("image", "image-text"):
        out["image"] = torch.randn(3, s, s, generator=g)
    if inputs == "image":
        out["label"] = torch.randint(flavor.num_classes, (), generator=g)
    if inputs in ("text", "image-text"):
        out["input_ids"] = text_ids(flavor, g)
    return out


# -- losses ---------------------------------------------------------------------------------


def classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.float(), labels)


def causal_lm_loss(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Next-token cross-entropy, padding ignored: a mean per sample, then over the samples.

    Per sample first, so that a rank's loss does not depend on how many padded tokens its
    samples hold: the mean over ranks (what DDP and FSDP average) is the single process's
    mean over the global batch whatever the padding."""
    targets = input_ids[:, 1:]
    per_token = nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, reduction="none")
    real = (targets != PAD_ID).to(per_token.dtype)
    return ((per_token * real).sum(1) / real.sum(1).clamp(min=1)).mean()


def gathered_contrastive_loss(image: Tensor, text: Tensor, logit_scale: Tensor) -> Tensor:
    """CLIP's symmetric contrastive loss over the GLOBAL batch, on every rank.

    transformers' CLIP computes it over the rank's own samples: at world 2 each rank's
    negatives are half of single's, so its loss is not single's. Here each rank gathers every
    rank's embeddings (an all-gather that passes gradients back, as FLAVA's loss does) and
    computes the same global loss. The gradient is right under DDP and FSDP: the all-gather's
    backward sums the world's identical losses' gradients (world x single's) and the wrapper
    averages over the world."""
    image = nn.functional.normalize(image.float(), dim=-1)
    text = nn.functional.normalize(text.float(), dim=-1)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        from torch.distributed.nn.functional import all_gather

        # group passed explicitly: all_gather's default is bound when it is first imported
        image = torch.cat(all_gather(image, group=dist.group.WORLD))
        text = torch.cat(all_gather(text, group=dist.group.WORLD))
    logits_per_text = logit_scale.float().exp() * text @ image.t()
    labels = torch.arange(len(text), device=text.device)
    return (nn.functional.cross_entropy(logits_per_text, labels) + nn.functional.cross_entropy(logits_per_text.t(), labels)) / 2


DEFAULT_LOGIT_SCALE = math.log(1 / 0.07)  # CLIP's initial temperature
