"""What a reader sees: the figures of the source studies and more, and the report.

* ``registry``            the one figure table: name, title, caption, what draws it, where it is shown
* ``plots``               ``scaleladder plots``: draws the table's ladder figures, PNG and PDF
* ``throughput_by_model``, ``max_batch``, ``fsdp_knobs``, ``weak_scaling``, ``pareto``: one module per figure
* ``convergence``         ``scaleladder converge-plots``: throughput beside time-to-accuracy, and its report section
* ``plan_plots``          the planner's charts (what fits where, predicted against measured, the step-time chart)
* ``rungs``, ``style``, ``bars``: what a rung says; labels, colours, OOM marks, the atomic save; grouped bars
* ``report``              ``scaleladder report``: one page with the figures and the table, HTML and Markdown

Imports from: results, planner, models, spec.
"""
