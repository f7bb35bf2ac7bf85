"""The analytic planner: memory and step time, split by idea (``scaleladder plan`` is the front door).

* :mod:`.inventory`   which parameters exist, which FSDP unit owns each, in FSDP's flattening order
* :mod:`.static`      parameters, gradients and optimizer state per rank, exactly (padding included)
* :mod:`.activations` what one forward keeps alive, call by call, per sample
* :mod:`.step_setup`  what the planner knows of a rung's step before it picks a batch
* :mod:`.timeline`    one training step replayed as a timeline of allocations; its highest point is the peak
* :mod:`.memory`      a rung's predicted memory on a device (:func:`predict`), and the max-batch search
* :mod:`.fits`        what fits where: the verdict for every model × strategy on one machine shape
* :mod:`.seeds`       the seeds' claims recomputed (tests/test_plan.py, docs/planner.md)
* :mod:`.devices`     the one device table: per chip its peaks, SMs, board power, memory variants and HBM bandwidth
* :mod:`.steptime`    a rung's step time before it runs: compute, host work, communication, overlap
* :mod:`.comm`        collectives as an alpha-beta model, and which link a group of ranks crosses
* :mod:`.overlap`     what a step's communication hides behind its compute
* :mod:`.rates`       how fast a device computes and its host issues work: the ``calibration/`` files
* :mod:`.calibration` the measured rates per device (JSON) and the measured host table

Nothing here touches a GPU; every number is computed from the flavor's dimensions and
the layout of a *reduced* copy of the model built on the meta device (one layer per
encoder, which has the same root and codebook parameters as the full model).
``docs/planner-internals.md`` derives each term; ``docs/planner.md`` holds the predictions against
measurement and the seeds' claims recomputed.
"""
