"""One rung on every rank: launch → device → parallelize (the strategy) → timed loop → record.

- ``run``: ``scaleladder run``, the per-rank program: spec → model → parallelize → loop → HDF5.
- ``run_config``: ``RunConfig``, the rung's one argument list (each field its ``run`` flag), torch-free.
- ``oom_record``: a rung that did not fit: the marker a rank leaves, and the record written from it.
- ``loop``: the timed window, and what every number in it means.
- ``parallelize``: ``apply_strategy``: activation checkpointing, compile, then DDP/FSDP.
- ``what_ran``: the wrapped model read back: its units and layers, and the sharding that runs.
- ``unused_params``: FLAVA's parameters no step trains, found by a CPU probe and frozen.
- ``precision``: what each precision name means, in one table.
- ``optim``: fused AdamW with no host sync in every precision, and the grad scaler.
- ``sac``: selective activation checkpointing (``-sac``): which ops' outputs a layer keeps.
- ``feed``: a loader's host batches put on the device one step ahead.
- ``batches``: ``--data synthetic``: random batches made before the timed loop.
- ``launch``: rank, world and master address (torchrun, Slurm or none), the device, the process group.
- ``spawn``: ``scaleladder spawn``: N ranks on this machine, without torch in the launcher.
- ``startup``: a rank's start-up as measured phases, before its first step and after its last.
- ``device_peak``: a rank's own device: its chip in the device table, and the peak its MFU is against.
- ``provenance``: where and with what a rung ran: what a reader needs to trust or redo it.
- ``profiling``: a ``torch.profiler`` trace of a few steps, and the allocator's memory snapshot.
- ``probe_cache``: the unused-parameter probe (``unused_params.unused_parameter_names``) kept on disk.

Imports from: spec, models, data, results, planner.
"""
