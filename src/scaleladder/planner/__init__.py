"""The analytic memory planner, split by idea (``scaleladder.plan`` is the front door).

* :mod:`.inventory`   which parameters exist, which FSDP unit owns each, in FSDP's flattening order
* :mod:`.static`      parameters, gradients and optimizer state per rank, exactly (padding included)
* :mod:`.activations` what one forward keeps alive, call by call, per sample
* :mod:`.memory`      the step replayed as a timeline of allocations: peak, breakdown, max batch
* :mod:`.devices`     the one device table: per chip its peaks, SMs, board power and memory variants

Nothing here touches a GPU; every number is computed from the flavor's dimensions and
the layout of a *reduced* copy of the model built on the meta device (one layer per
encoder, which has the same root and codebook parameters as the full model).
See ``docs/planner.md`` for the derivation of each term and the seed comparison.
"""
