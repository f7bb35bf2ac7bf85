"""A model family: everything scaleladder needs to know about one kind of model, behind one interface.

A :class:`~scaleladder.flavors.Flavor` is a model *size* (data: its name and dimensions); its
``family`` names the :class:`Family` that builds it. Every part of the house that differs by
model asks the family, never the family's name: the runner builds and wraps through it, the
synthetic and shard batches come from it, the FLOP count and the planner's facts too. The
built-in families are ``models/families/vit.py`` and ``models/families/flava.py``; a user's
model comes from a models file (``models/models_file.py``) through one of the sources in
``models/sources/`` (timm, transformers, the user's own Python), each a :class:`Family`.

A family object is made once per process and is stateless: every method takes the flavor
(the size) it is asked about. Its module imports no torch at import time (the planner and
the workflow's process read families torch-free); torch is imported inside the methods.

What a family says, and who reads it:

* ``build(flavor, device, options)``: a :class:`~scaleladder.models.train_module.TrainModule`, whose
  ``forward(batch)`` returns the training loss (so "its loss" is the module's forward).
  ``device="meta"`` allocates nothing (counting, planning, a rung's per-unit init).
* ``block_classes(model)``: the classes whose outermost instances are the blocks: what FSDP
  wraps as units, AC checkpoints and ``-compile`` compiles. ``stacks(model)``: the blocks as
  ordered stacks (FLAVA: image, text, multimodal), for unit grouping and the wrap checks.
* ``extra_unit_classes(model)``: modules that are FSDP units of their own besides the blocks.
* ``reset_parameters(module)``: how a module materialised from meta is initialised (the
  library's own init for a library model; ``models/init.py``'s rules for the seeds' models).
* ``synthetic_sample(flavor, g, global_index)``: one sample of ``--data synthetic``.
* ``inputs``: what it trains on from shards: ``"image"``, ``"text"``, ``"image-text"`` or
  ``"masked-image-text"`` (FLAVA's: the image, its codebook image and patch mask, the text and its
  masked copy, the ITM label); ``data/loader.py`` keys its transform by it.
* ``flops(...)``: FLOPs per sample; ``None`` means "count them" (FlopCounterMode).
* ``analytic``: whether the planner has an analytic memory model; else it traces. An analytic
  family also answers the planner's questions (torch-free): ``layer_counts``, ``reduced``,
  ``layer_passes``, ``plan_flops``, ``input_bytes``, ``twin_passes``, and the ClassVars
  ``activations`` (which of the planner's activation models: planner/activations.py's
  ``MODELS``), ``unused_prefixes``, ``codebook_prefix``, ``ops_per_layer_pass``.
* ClassVars the rest of the house reads instead of a family's name: ``throughput_unit`` (the
  figures' axis), ``rank_modules`` (a rank's start-up imports), ``freezes_unused`` (the
  unused-parameter probe and freeze), ``uses_flava_impl`` (``--flava-impl`` applies),
  ``classifier`` (a convergence rung's held-out accuracy).

``options`` (``build``, ``flops`` and the planner's methods) are the rung's build settings by
name: ``codebook_weights`` (a local file for a family with a codebook) and ``flava_impl``
(models/flava_impl.py); a family reads the ones it knows and ignores the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from scaleladder.flavors import Flavor
    from scaleladder.models.flops import FlopCount
    from scaleladder.models.train_module import TrainModule

Inputs = Literal["image", "text", "image-text", "masked-image-text"]
#: A rung's build settings by name (``build``, ``flops`` and the planner's methods: see above).
Options: TypeAlias = Mapping[str, Any]


class Family:
    """The interface. Subclass it and override what differs; the defaults serve a plain model.

    A user's own family (``source: python`` in a models file) must override ``build``,
    ``block_classes`` and ``synthetic_sample``; everything else has a working default.
    """

    #: The family's name: what records, labels and ``scaleladder models`` show.
    name: ClassVar[str] = ""
    #: What it trains on from shards (the loader's transform; synthetic data is the family's own).
    inputs: ClassVar[Inputs] = "image"
    #: Items per sample in items/s (FLAVA: an image and a text, 2).
    items_per_sample: ClassVar[int] = 1
    #: Whether the planner has an analytic memory model for it (else it traces: docs/planner.md).
    analytic: ClassVar[bool] = False
    #: What its throughput counts, as the figures' axis names it (figures/style.py).
    throughput_unit: ClassVar[str] = "items/s"
    #: Modules a rank imports in its timed ``imports`` phase, beside torch and the runner's own (rung/startup.py).
    rank_modules: ClassVar[tuple[str, ...]] = ()
    #: Whether the parameters no training step reaches are frozen before wrapping (rung/unused_params.py:
    #: found once by a CPU step of the flavor ``<name>-debug``, so such a family has one).
    freezes_unused: ClassVar[bool] = False
    #: The planner's statement of that set: the unused parameters' name prefixes (planner/inventory.py).
    unused_prefixes: ClassVar[tuple[str, ...]] = ()
    #: Where a frozen codebook sits in the model ("": none): an FSDP unit of its own in the planner's
    #: inventory, and what ``--codebook-weights`` loads (its ``encoder.``).
    codebook_prefix: ClassVar[str] = ""
    #: Whether ``--flava-impl`` applies (models/flava_impl.py): recorded, planned and timed per implementation.
    uses_flava_impl: ClassVar[bool] = False
    #: A classifier whose logits a module named ``head`` gives: a convergence rung's held-out accuracy.
    classifier: ClassVar[bool] = False
    #: Image inputs from shards without labels get synthetic ones (recorded: ``label_source``), so a
    #: throughput can be measured on any images; False refuses such shards (ViT: the seed's classifier).
    synthetic_labels: ClassVar[bool] = True
    #: The planner's stated host work: top-level aten ops per layer pass (planner/steptime.py).
    ops_per_layer_pass: ClassVar[int] = 0
    #: The planner's activation model for it: a key of planner/activations.py's ``MODELS`` ("": none).
    activations: ClassVar[str] = ""

    def build(self, flavor: Flavor, device: str | torch.device, options: Mapping[str, Any]) -> TrainModule:
        raise NotImplementedError(f"family {self.name or type(self).__name__}: build() is not defined")

    def block_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        raise NotImplementedError(f"family {self.name or type(self).__name__}: block_classes() is not defined")

    def extra_unit_classes(self, model: nn.Module) -> set[type[nn.Module]]:
        return set()

    def stacks(self, model: nn.Module) -> list[list[nn.Module]]:
        """The blocks as ordered stacks: the outermost instances of ``block_classes``, a stack per
        parent module (a ``ModuleList`` of layers), in registration order."""
        classes = tuple(self.block_classes(model))
        out: dict[int, list[nn.Module]] = {}

        def walk(parent: nn.Module) -> None:
            for child in parent.children():
                if isinstance(child, classes):
                    out.setdefault(id(parent), []).append(child)
                else:
                    walk(child)

        walk(model)
        return list(out.values())

    def reset_parameters(self, module: nn.Module) -> None:
        from scaleladder.models.init import default_reset

        default_reset(module)

    def synthetic_sample(self, flavor: Flavor, g: torch.Generator, global_index: int) -> dict[str, Tensor]:
        raise NotImplementedError(f"family {self.name or type(self).__name__}: synthetic_sample() is not defined")

    def flops(self, flavor: Flavor, recompute: bool, first: Mapping[str, Tensor], global_batch: int,
              options: Mapping[str, Any]) -> FlopCount | None:
        """FLOPs per sample of one training step; ``None``: count them with FlopCounterMode."""
        return None

    # -- the analytic planner's facts (torch-free; asked only of an ``analytic`` family) ----------

    def _no_model(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"family {self.name or type(self).__name__}: no analytic planner model ({what})")

    def layer_counts(self, flavor: Flavor) -> list[int]:
        """The blocks of each stack (``stacks``' lengths), from the flavor's dimensions alone."""
        raise self._no_model("layer_counts")

    def reduced(self, flavor: Flavor) -> Flavor:
        """``flavor`` with one block per stack: what the planner's inventory builds on meta."""
        raise self._no_model("reduced")

    def layer_passes(self, flavor: Flavor, options: Options) -> list[tuple[str, float]]:
        """The forward's block passes in order: (block id, relative compute ~ tokens)."""
        raise self._no_model("layer_passes")

    def plan_flops(self, flavor: Flavor, ac: bool, global_batch: int, options: Options) -> FlopCount:
        """FLOPs per sample before any run (no batch to count on): the planner's and the budget's."""
        raise self._no_model("plan_flops")

    def input_bytes(self, flavor: Flavor, store: int) -> float:
        """Bytes of one sample of a synthetic batch on the device, its floats ``store`` bytes each."""
        raise self._no_model("input_bytes")

    def twin_passes(self, options: Options) -> bool:
        """Whether encoders run twice a step, once per input (TorchMultimodal's FLAVA: plain, then masked)."""
        return False
