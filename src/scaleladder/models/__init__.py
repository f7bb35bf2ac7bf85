"""The models: every flavor (``flavors.py``) built as a module whose ``forward(batch)`` is the loss.

- ``family``: the model family interface (``Family``): build, blocks, init, batches, FLOPs.
- ``families``: the families by name (``family_of(flavor)``) and the built-in ones, a module each.
- ``train_module``: ``TrainModule``, what every family builds: ``forward(batch) -> loss``.
- ``build``: a flavor built through its family (``build_model``); the built-in families' modules (ViT, FLAVA).
- ``init``: a model built on the meta device, materialised one module (FSDP unit) at a time.
- ``flops``: analytic FLOPs per trained sample, from a flavor's dimensions alone.
- ``batch_layout``: what a synthetic batch holds, as numbers (torch-free: the planner reads it).
- ``table``: ``scaleladder models``: every flavor with its parameter count, built on the meta device.
- ``models_file``: a models file (the user's models: timm, transformers, python entries) read torch-free, as flavors.
- ``sources``: the family of a models-file entry, by its source (timm, transformers, the user's python).
- ``flava_impl``: which FLAVA implementation a rung builds, by name (torch-free).
- ``flava_attention``: FLAVA's transformer layers on fused attention, over the same parameters.
- ``flava_losses``: FLAVA's pretraining losses without a host-device sync.
- ``flava_norm``: FLAVA's LayerNorms in fp32 without the casts that change nothing.
- ``flava_passes``: FLAVA's twin encoder passes (plain and masked input) as one batch.

Imports from: spec and below.
"""
