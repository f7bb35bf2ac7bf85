"""`make gpu-check`'s parts: ``config`` (what runs, at what sizes), ``rows`` (a command and a rung's row),
``machine`` (the environment probe), ``runner`` (the budget and the subprocesses), ``sections`` (what
each section runs), ``figures`` and ``report``. The entry point is benchmarks/gpu_check.py."""
