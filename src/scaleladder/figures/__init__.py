"""What a reader sees: the figures of the source studies and more (``plots``), the
planner's charts (``plan_plots``) and the report (``report``).
Imports from: results, planner, models, spec.
"""
