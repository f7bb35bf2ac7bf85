"""The model registry: every model scaleladder knows, by name, as a :class:`Flavor`.

A table, not a frozen list: :data:`FLAVORS` is a read-only view of it, :func:`get_flavor`
looks a name up (an unknown one is a ``SpecError`` listing the known), and :func:`register`
adds a row at run time, so that models declared elsewhere (a file of the user's, a
benchmark's skeletons) are known to the spec, the planner and the figures as the built-in
ones are. A registration lives in its process: a rank started as a process of its own knows
what its own start-up registers.

Torch-free data on the spec's floor (``spec.py`` reads it to check a run spec's model):
:class:`Flavor` holds dimensions only; building one is ``models/build.py``'s.

The built-in dimensions are copied from the source studies' tables (``shared/seeds``):
FLAVA from the TorchMultimodal blog's table, ViT from the ORNL ViT-FSDP table.
``seed_params_m`` is the parameter count the seed *publishes*; the count we print
is always computed from the dimensions (see ``docs/models.md`` for the one case,
ViT-5B, where the seed's own table disagrees with its dimensions).

The debug flavors are tiny on purpose: they are what the CPU tests train.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from scaleladder.errors import SpecError


@dataclass(frozen=True)
class Flavor:
    name: str
    family: str  # the Family that builds it (models/family.py): a built-in one, or a models-file source
    hidden: int = 0  # the dimensions below are the analytic families' (a models-file model has none)
    mlp: int = 0
    heads: int = 0
    layers: int = 0  # unimodal layers (FLAVA: image AND text encoder each) / ViT depth
    patch: int = 0
    image_size: int = 224  # the image side the data is resized to
    mm_layers: int = 0  # FLAVA multimodal fusion layers
    vocab_size: int = 30522  # FLAVA text vocabulary (BERT's by default)
    text_len: int = 77  # FLAVA padded text length (TorchMultimodal's default)
    image_vocab: int = 8192  # FLAVA MIM targets: the DALL-E codebook size
    codebook_hidden: int = 256  # DALL-E encoder width (n_hid); 256 is the real encoder
    num_classes: int = 1000  # ViT classification head
    seed_params_m: float | None = None  # what the seed's table says (millions)
    seed_size_gib: float | None = None  # FLAVA seed "Model size (fp32)": printed "GB", but it is GiB (see docs/models.md)
    debug: bool = False
    #: A models-file model's entry, as canonical JSON (models/models_file.py): its source, name and
    #: keyword arguments. Empty for a built-in flavor. Records carry it, so readers need no file.
    entry: str = ""

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch) ** 2 if self.patch else 0

    @property
    def codebook_image_size(self) -> int:
        # The DALL-E encoder downsamples by 8; FLAVA pairs 16-px patches with a
        # half-resolution codebook image so that both give the same token grid.
        return self.image_size // 2


def _flava(name: str, h: int, mlp: int, heads: int, uni: int, mm: int, gb: float, params_m: float) -> Flavor:
    return Flavor(name, "flava", h, mlp, heads, uni, 16, 224, mm_layers=mm, seed_size_gib=gb, seed_params_m=params_m)


def _vit(name: str, h: int, depth: int, mlp: int, heads: int, patch: int, params_m: float) -> Flavor:
    return Flavor(name, "vit", h, mlp, heads, depth, patch, 224, seed_params_m=params_m)


_TABLE: dict[str, Flavor] = {
    f.name: f
    for f in [
        # FLAVA seed table: hidden, MLP, heads, unimodal layers, multimodal layers, size (fp32)
        _flava("flava-350m", 768, 3072, 12, 12, 6, 1.33, 350),
        _flava("flava-900m", 1024, 4096, 16, 24, 12, 3.48, 900),
        _flava("flava-1.8b", 1280, 5120, 16, 32, 16, 6.66, 1800),
        _flava("flava-2.7b", 1408, 6144, 16, 40, 20, 10.3, 2700),
        _flava("flava-4.8b", 1664, 8192, 16, 48, 24, 18.1, 4800),
        _flava("flava-10b", 2048, 10240, 16, 64, 40, 38.0, 10000),
        # ViT seed table: width, depth, MLP, heads; patch 16 for Base, 14 otherwise
        _vit("vit-base", 768, 12, 3072, 12, 16, 87),
        _vit("vit-huge", 1280, 32, 5120, 16, 14, 635),
        _vit("vit-1b", 1536, 32, 6144, 16, 14, 914),
        _vit("vit-3b", 2816, 32, 11264, 32, 14, 3067),
        _vit("vit-5b", 1792, 56, 15360, 16, 14, 5349),
        _vit("vit-15b", 5040, 48, 20160, 48, 14, 14720),
        # Debug flavors: same code paths, seconds on a CPU.
        Flavor(
            "flava-debug", "flava", 32, 64, 2, 2, 16, 64, mm_layers=1, vocab_size=1024, text_len=16,
            image_vocab=64, codebook_hidden=8, debug=True,
        ),
        Flavor("vit-debug", "vit", 32, 64, 2, 2, 8, 32, num_classes=10, debug=True),
        # Wide and shallow, few tokens (32-px image, 16-px patches: 5 tokens): 17M parameters
        # whose gradients and gathers cost gloo far more than their compute costs a CPU rank,
        # so a CPU DDP/FSDP rung is communication-bound (docs/planner.md, "Two nodes").
        Flavor("vit-debug-wide", "vit", 1024, 2048, 16, 2, 16, 32, num_classes=10, debug=True),
    ]
}


#: Every known flavor by name, in registration order (the built-in ones first): a live,
#: read-only view; :func:`register` is the one way in.
FLAVORS: Mapping[str, Flavor] = MappingProxyType(_TABLE)


def get_flavor(name: str) -> Flavor:
    try:
        return _TABLE[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r}; known: {', '.join(_TABLE)}") from None


def register(flavor: Flavor, replace: bool = False) -> Flavor:
    """Add ``flavor`` to the table under its name and return it.

    The name is the first part of a run spec's path, so it may not be empty or hold a ``/``
    or white space. Registering the same flavor again is a no-op; another flavor under a
    known name is a ``SpecError`` unless ``replace``.
    """
    name = flavor.name
    if not name or "/" in name or any(c.isspace() for c in name):
        raise SpecError(f"model name {name!r}: a run spec's first part, so not empty, no '/', no white space")
    known = _TABLE.get(name)
    if known is not None and known != flavor and not replace:
        raise SpecError(f"model {name!r} is already registered with other dimensions (register(..., replace=True) to replace it)")
    _TABLE[name] = flavor
    return flavor
