"""One rung on every rank: launch → device → ladder (the strategy) → timed loop → record.

``run`` is the per-rank program (``scaleladder run``); ``loop`` is the timed window and
what every number means; ``ladder`` applies a strategy to a model; ``precision`` and
``optim`` say how it computes and steps; ``feed`` and ``batches`` put batches on the
device; ``launch`` and ``devices`` say where it runs and what its peak is; ``provenance``
records where and how. Imports from: spec, models, data, results.
"""
