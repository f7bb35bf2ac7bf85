"""scaleladder: which distributed-training strategy trains this model size, at what batch, how fast.

The house (docs/design.md, "The house"; tests/test_layout.py holds it): the base below,
then the stages, each a package with its own docstring.

- ``errors``: ``SpecError``, the one error type of bad input (one line, exit 2).
- ``files``: the one atomic write; a write that fails is one line; a killed run's leftovers go.
- ``log``: progress and diagnostics through stdlib ``logging``, with the rank.
- ``markdown``: markdown tables, built one way.
- ``gitinfo``: which commit the code came from, asked one way.
- ``flavors``: the model registry: every model scaleladder knows, by name, in a table code may extend.
- ``spec``: the run spec, the one value that flows through scaleladder.
- ``cli``: ``scaleladder <command>``, the single entry point.
- ``__main__``: ``python -m scaleladder`` is ``scaleladder``.
- ``models``: every flavor built as a module whose forward is the loss.
- ``data``: ``scaleladder shard`` and the loader that feeds every rung.
- ``results``: the record's schema, the HDF5 files, the ladder file.
- ``planner``: the analytic memory and step-time planner.
- ``rung``: one rung on every rank.
- ``campaign``: rungs started, searched and checked as a site's ladder runs them.
- ``figures``: the figures and the report.
- ``site``: the site's front doors: profiles, the workflow's logic, doctor, budget, plan.
"""
