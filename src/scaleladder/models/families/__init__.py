"""The built-in model families, one module each (``models/family.py``'s ``BUILT_IN`` names them):

- ``vit``: ViT classification (TorchMultimodal's vision transformer, a linear head on CLS).
- ``flava``: FLAVA pretraining (TorchMultimodal's FLAVAForPreTraining and its DALL-E codebook).

Each module defines ``FAMILY``, a :class:`~scaleladder.models.family.Family`, and imports no
torch at import time (the planner and the workflow's process read them torch-free): the
modules themselves (``models/build.py``) and their FLOPs (``models/flops.py``) are imported
inside the methods that need them. The planner's activation formulas stay in the planner
(``planner/activations.py``), under the name a family's ``activations`` gives.

Imports from: models (family, build, flops, flava_impl, batch_layout) and below.
"""
