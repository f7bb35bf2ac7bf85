"""What a reader sees: the figures of the source studies and more, and the report.

* ``registry``            the one figure table: name, title, caption, what draws it, where it is shown
* ``plots``               ``scaleladder plots``: draws the table's ladder figures, PNG and PDF
* ``throughput_by_model`` throughput per model size and strategy, fixed and max batch (FLAVA seed, Figure 1)
* ``max_batch``           the largest local batch that trains, per model and strategy (FLAVA seed, Figure 2)
* ``fsdp_knobs``          sharding x backward prefetch x limit_all_gathers (ViT seed, Figure 1)
* ``weak_scaling``        throughput and peak memory per GPU against nodes (ViT seed, Figures 2-3)
* ``pareto``              throughput against peak memory, with the Pareto front (none of the seeds)
* ``convergence``         ``scaleladder converge-plots``: throughput beside time-to-accuracy, and its report section
* ``plan_plots``          the planner's charts (what fits where, predicted against measured, the step-time chart)
* ``rungs``               what a rung says, and which rungs a figure takes
* ``style``               labels and colours for any strategy, OOM marks, the atomic save
* ``bars``                the grouped bar chart both FLAVA-seed figures draw
* ``report``              ``scaleladder report``: one page with the figures and the table, HTML and Markdown

Imports from: results, planner, models, spec.
"""
