"""The site's front doors: what a profile is, what it would run, and what it costs, before anything is queued.

- ``config``: the workflow's config checked once (schema, defaults, --config strings, data values).
- ``settings``: ``SiteConfig``, the validated config read once into frozen, typed fields (the rules read them);
  generated from the schema.
- ``settings_codegen``: writes ``settings`` and docs/settings.md from workflow/schemas/config.schema.yaml.
- ``settings_read``: how the generated ``settings`` reads a validated section (an unknown key named).
- ``ladder``: the ladder as run specs, the planner's routing, result paths, targets (:func:`ladder.prepare`).
- ``commands``: the site's strings and arguments in the rules' shell commands (``swf`` in the .smk files).
- ``converge_rungs``: the convergence rungs the workflow's ``converge`` config asks for, and their run specs.
- ``profiles``: a profile folder read as Snakemake and the job's shell read it (config, resources, site strings).
- ``site_check``: the settings a site cannot run without (``site.requires``), said while the DAG is built.
- ``doctor``: ``scaleladder doctor``, a profile's preflight on the login node.
- ``doctor_checks``: the doctor's checks, one unit each, registered with ``@check``.
- ``budget``: ``scaleladder budget``, the campaign's cost in node-hours before submission.
- ``schedule``: the ladder's batch jobs while the DAG is built: each rung's time and verdict under the limit, the packs.
- ``plan``: ``scaleladder plan``, per-GPU memory and max batch from the analytic planner.
- ``plan_time``: ``plan``'s step time: the site's figures, the calibration, the weak-scaling chart.
- ``failures``: a failed workflow job's one-line cause on the console (the Snakefile's ``onerror``).
"""
