# Stage 1: the data every rung reads, written once as WebDataset shards.


rule shard:
    output:
        "results/shards/{px}px/manifest.json",
    log:
        "results/logs/shard/{px}px.log",
    params:
        env=swf.env_exports(SITE),
        scaleladder=SCALELADDER,
        # the shard directory is the manifest's folder (a function, not a hardcoded prefix)
        outdir=lambda wildcards, output: os.path.dirname(output[0]),
        samples=config["data"]["samples"],
        per_shard=config["data"]["per_shard"],
        seed=config["data"]["seed"],
        sources=swf.shard_sources(config),
    conda:
        "../envs/scaleladder.yaml"
    shell:
        "{params.env}{params.scaleladder} shard --out {params.outdir} --samples {params.samples} "
        "--per-shard {params.per_shard} --image-size {wildcards.px} --seed {params.seed} --overwrite --quiet {params.sources}"
        " > {log} 2>&1"
