# Accuracy kept: the convergence rungs (docs/metrics.md, "Convergence rungs"), on when
# config `converge.enabled` is true. Each rung (strategy x precision x seed) trains
# `converge.model` through the real shard -> loader path until the held-out accuracy
# reaches `converge.target` or `converge.steps` run out, and records time-to-target
# (`scaleladder converge`). A rung that misses is a recorded, FAILING result, shown in
# the report; the job still succeeds.
#
#   snakemake --profile profiles/local --config 'converge={"enabled": true}'
#
# Data: `converge.train`/`converge.test` = "digits" (the default) exports scikit-learn's
# handwritten digits and shards them with `scaleladder shard`, as any folder would be;
# otherwise they name shard manifests (a real ViT flavor on a larger set, on a GPU).
#
# Wildcards are prefixed `c` so that the ladder's global wildcard constraints (model,
# strategy, precision, ...) do not restrict these rules.

import scaleladder.site.converge_rungs as cvr

CONVERGE = SETTINGS.converge
CONVERGE_RECORDS = cvr.records(CONVERGE)
CONVERGE_TARGETS = CONVERGE_RECORDS + (["results/plots/convergence.png"] if CONVERGE_RECORDS else [])


localrules:
    digits,
    converge_plots,


rule digits:
    output:
        "results/converge/digits/digits.json",
    log:
        "results/logs/converge/digits.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} digits --out {params.outdir:q} --overwrite > {log:q} 2>&1"


rule digits_shard:
    input:
        "results/converge/digits/digits.json",
    output:
        update(os.path.join(cvr.SHARDS, "{csplit}", "manifest.json")),  # as the ladder's shards (data.smk)
    log:
        "results/logs/converge/shard-{csplit}.log",
    wildcard_constraints:
        csplit="train|test",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        images=lambda wildcards, input: os.path.join(os.path.dirname(input[0]), wildcards.csplit),
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} shard --images {params.images:q} --out {params.outdir:q} --per-shard 128 "
        "--seed 0 --overwrite --quiet > {log:q} 2>&1"


rule converge_rung:
    input:
        train=ancient(cvr.data_path(CONVERGE, "train")),  # as the ladder's rungs (common.smk, rung_data)
        test=ancient(cvr.data_path(CONVERGE, "test")),
    output:
        update("results/converge/rungs/{cstrategy}/{cprecision}/s{cseed}.h5"),
    log:
        "results/logs/converge/{cstrategy}/{cprecision}/s{cseed}.log",
    wildcard_constraints:
        cseed=r"\d+",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        spec=lambda wildcards: cvr.rung_spec(CONVERGE, wildcards.cstrategy, wildcards.cprecision, RPN).path,
        launcher=lambda wildcards: cvr.launcher_arg(
            wildcards.cstrategy, swf.launcher(SETTINGS.site, RPN, cvr.rung_spec(CONVERGE, wildcards.cstrategy, wildcards.cprecision, RPN))
        ),
        device=RUNG_OPTIONS,
        # TRAP: the config's dict, not the typed block: Snakemake's params trigger compares each
        # param's repr (a dataclass has none it stores), and the template reads {params.cv[steps]}.
        cv=LADDER.config["converge"],
    resources:
        bench_slot=1,
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} converge --spec {params.spec:q} --steps {params.cv[steps]} --warmup 0 "
        "--lr {params.cv[lr]} --seed {wildcards.cseed} --target {params.cv[target]} --eval-every {params.cv[eval_every]} "
        "--data {input.train:q} --test-data {input.test:q} --workers 0{params.device}{params.launcher} --out {output:q} > {log:q} 2>&1"


rule converge_plots:
    input:
        CONVERGE_RECORDS,
    output:
        png=report("results/plots/convergence.png", caption="../report/convergence.rst", category="Figures"),
        pdf="results/plots/convergence.pdf",
    log:
        "results/logs/converge/plots.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        outdir=lambda wildcards, output: os.path.dirname(output.png),
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} converge-plots --out-dir {params.outdir:q} {input:q} > {log:q} 2>&1"
