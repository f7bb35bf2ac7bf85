"""What a reader sees: the figures of the source studies and more (``plots``: the registry
and the ``scaleladder plots`` command; one module per figure: ``throughput_by_model``,
``max_batch``, ``fsdp_knobs``, ``weak_scaling``, ``pareto``; what they share: ``rungs``,
``style``, ``bars``), the planner's charts (``plan_plots``) and the report (``report``).
Imports from: results, planner, models, spec.
"""
