# Stage 3: merge the rungs into results/ladder.h5, draw the figures, write the report.
# These are light and run where snakemake runs (localrules), not as cluster jobs.
# Which figures, their captions and categories: the figure table, figures/registry.py.

import scaleladder.figures.registry as figtable

localrules:
    aggregate,
    export,
    plots,
    plan_plots,
    report,


# Rebuilds the whole file from the rung files each time (HDF5 Group.copy into a
# temporary file, then an atomic rename): running it twice gives the same groups.
rule aggregate:
    input:
        LADDER.rung_files,
    output:
        update("results/ladder.h5"),  # kept while it is rebuilt, restored if that fails (a full disk)
    log:
        "results/logs/aggregate.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        provenance=swf.provenance_json(LADDER),
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} aggregate --out {output:q} --provenance {params.provenance:q} "
        "{input:q} > {log:q} 2>&1"


# The ladder as one tidy table, one row per rung of any status (docs/results.md); failed
# attempts come from the notes under results/failed/, which the ladder does not hold.
rule export:
    input:
        "results/ladder.h5",
    output:
        table=report("results/rungs.csv", caption="../report/tables/rungs.rst", category="Tables"),
        columns="results/rungs.columns.csv",
    log:
        "results/logs/export.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} export --ladder {input:q} --out {output.table:q} > {log:q} 2>&1"


rule plots:
    input:
        "results/ladder.h5",
    output:
        # the figure table (src/scaleladder/figures/registry.py): a PNG with its caption in
        # Snakemake's report, and a PDF, per figure `scaleladder plots` draws
        **{name: report(png, caption=caption, category=category) if caption else png
           for name, png, caption, category in figtable.snakemake_outputs("plots")},
        **{f"{name}_pdf": f"results/plots/{name}.pdf" for name in figtable.names("plots")},
    log:
        "results/logs/plots.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} plots --ladder {input:q} --out-dir {params.outdir:q} > {log:q} 2>&1"


rule plan_plots:
    input:
        "results/ladder.h5",
    output:
        # the planner's figures of the table; each is drawn by its own `plan` command below
        **{name: report(png, caption=caption, category=category) if caption else png
           for name, png, caption, category in figtable.snakemake_outputs("plan")},
        **{f"{name}_pdf": f"results/plots/{name}.pdf" for name in figtable.names("plan")},
    log:
        "results/logs/plan_plots.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        chart=swf.plan_chart_args(LADDER),
        device=SETTINGS.site.plan_device,
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "({params.env}{params.scaleladder} plan --fits-chart {output.fits:q} {params.chart} && "
        "{params.scaleladder} plan --fits-chart {output.fits_pdf:q} {params.chart} && "
        "{params.scaleladder} plan --vs-measured {output.predicted_vs_measured:q} --device {params.device} --ladder {input:q} && "
        "{params.scaleladder} plan --vs-measured {output.predicted_vs_measured_pdf:q} --device {params.device} --ladder {input:q}) > {log:q} 2>&1"


rule report:
    input:
        ladder="results/ladder.h5",
        plots=rules.plots.output,
        plan_plots=[f"results/plots/{f}.png" for f in swf.plan_figures(SETTINGS.site)],
        converge=CONVERGE_TARGETS,  # empty unless converge.enabled (workflow/rules/converge.smk)
    output:
        html="results/report.html",
        md="results/report.md",
    log:
        "results/logs/report.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        plotdir=lambda wildcards, input: os.path.dirname(input.plots[0]),
        converge=(" --converge " + " ".join(CONVERGE_RECORDS)) if CONVERGE_RECORDS else "",
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} report --ladder {input.ladder:q} --plots {params.plotdir:q} "
        "--html {output.html:q} --md {output.md:q}{params.converge} > {log:q} 2>&1"
