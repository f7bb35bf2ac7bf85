"""The campaign: rungs started, searched and checked as a site's ladder runs them.

- ``supervise``: ``scaleladder launch`` / ``finalize``: a rung under a launcher, an OOM recorded as a result.
- ``maxbatch``: ``scaleladder maxbatch``: the largest local batch that trains, then the rung at it.
- ``converge``: ``scaleladder converge``: a rung trained to a held-out accuracy (time-to-train).
- ``cost``: what a ladder costs before submission: a time model per rung, and node-hours.
- ``timelimit``: the time a rung's batch job asks for, and a rung predicted past the site's limit shortened or refused.
- ``packing``: packs: the rungs of one node count in one batch job, filled up to the site's time limit.
- ``pack``: ``scaleladder pack``: a pack's rungs one after another inside its batch job, each under its own timeout.
- ``plan_check``: the planner held against torch's memory trackers on fake CPU tensors (``plan --check``).
- ``plan_trace``: the traced memory model: what ``plan`` predicts for a model without an analytic one (``plan --traced``).
- ``rehearse``: ``scaleladder rehearse``: every rung built and wrapped at its world size on fake tensors, one of each kind traced.
- ``unit_tracker``: torch's FSDP2 memory tracker made to see FSDP units of several blocks (knobs ``-u<k>``).
- ``probe``: ``scaleladder doctor --probe``: what one tiny job sees on a compute node, per rank.
- ``toolchain``: what a ``-compile`` rung builds with, proved by building a C and a C++ extension.

Imports from: rung, planner, results, and below.
"""
