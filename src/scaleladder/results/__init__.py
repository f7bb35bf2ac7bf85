"""What a rung leaves behind, and what is read back from it.

- ``record``: the one definition of every record attribute: name, unit, meaning, record kinds.
- ``store``: result files: one HDF5 per rung, written atomically.
- ``oom``: the OOM record's attributes (a rung that did not fit, or was predicted not to).
- ``aggregate``: ``scaleladder aggregate``: the per-rung files merged into one ladder file.
- ``stats``: how sure a throughput is: its interval within one run and between runs.
- ``model_entries``: a models-file model known to its reader from the entry its record carries.
- ``export``: ``scaleladder export``: every rung of a ladder as one tidy table (and its steps).
- ``outputs``: the table formats (CSV, JSON Lines, Parquet), one module per format.
- ``trackers``: the opt-in trackers (TensorBoard events per rung, ``scaleladder mlflow``).
- ``compare``: ``scaleladder compare BASE NEW``: what changed between two ladders, with noise.

Imports from: spec and models only, so every stage above can write or read results.
"""
