# Stage 1: the data every rung reads, written once as WebDataset shards.
#
# data.slices = 1: one `scaleladder shard` job per image size. data.slices = N > 1: N
# `shard --slice K/N` jobs (each over one slice of the sorted input; on a Slurm profile
# each is a batch job, locally they run side by side up to --cores), then one
# `shard --gather N` job that writes the manifest and trains the tokenizer on every
# caption (or loads data.vocab). The shards do not depend on N (src/scaleladder/data/slices.py),
# and each slice's record is its own output, so a rerun after a killed job redoes only
# the missing slices.
#
# No --quiet: the log shows the job is alive (a progress line every 30 s, what the tokenizer is
# doing) and ends with the summary.
#
# update(): Snakemake keeps the manifest (and slice records) while a shard job runs and puts
# them back when it fails, instead of deleting them first. With the rungs' ancient() input
# (common.smk), a failed attempt with other data settings never makes the finished rungs run
# again once the settings are back (`shard` itself replaces the set atomically).

SHARD_SLICES = swf.shard_slices(SETTINGS)


if SHARD_SLICES == 1:

    rule shard:
        output:
            update("results/shards/{px}px/manifest.json"),
        log:
            "results/logs/shard/{px}px.log",
        params:
            env=swf.env_exports(SETTINGS.site),
            scaleladder=SCALELADDER,
            # the shard directory is the manifest's folder (a function, not a hardcoded prefix)
            outdir=lambda wildcards, output: os.path.dirname(output[0]),
            samples=SETTINGS.data.samples,
            per_shard=SETTINGS.data.per_shard,
            seed=SETTINGS.data.seed,
            sources=swf.shard_sources(SETTINGS),
        conda:
            "../envs/scaleladder.yaml"
        shell:
            "{params.env}{params.scaleladder} shard --out {params.outdir:q} --samples {params.samples} "
            "--per-shard {params.per_shard} --image-size {wildcards.px} --seed {params.seed} --overwrite {params.sources}"
            " > {log:q} 2>&1"

else:

    rule shard_slice:
        output:
            update("results/shards/{px}px.parts/slice-{k}-of-{n}.json"),
        log:
            "results/logs/shard/{px}px-slice-{k}-of-{n}.log",
        wildcard_constraints:
            k=r"\d{4}",
            n=r"\d{4}",
        threads: 2  # the reader threads overlap I/O; the work is one core's
        params:
            env=swf.env_exports(SETTINGS.site),
            scaleladder=SCALELADDER,
            parts=lambda wildcards, output: os.path.dirname(output[0]),
            slice=lambda wildcards: f"{int(wildcards.k)}/{int(wildcards.n)}",
            samples=SETTINGS.data.samples,
            per_shard=SETTINGS.data.per_shard,
            seed=SETTINGS.data.seed,
            sources=swf.shard_sources(SETTINGS),
        conda:
            "../envs/scaleladder.yaml"
        shell:
            "{params.env}{params.scaleladder} shard --parts {params.parts:q} --slice {params.slice} --samples {params.samples} "
            "--per-shard {params.per_shard} --image-size {wildcards.px} --seed {params.seed} {params.sources}"
            " > {log:q} 2>&1"

    rule shard:
        input:
            lambda wildcards: swf.shard_slice_records(wildcards.px, SHARD_SLICES),
        output:
            update("results/shards/{px}px/manifest.json"),
        log:
            "results/logs/shard/{px}px.log",
        params:
            env=swf.env_exports(SETTINGS.site),
            scaleladder=SCALELADDER,
            outdir=lambda wildcards, output: os.path.dirname(output[0]),
            parts=lambda wildcards, input: os.path.dirname(input[0]),
            slices=SHARD_SLICES,
            samples=SETTINGS.data.samples,
            per_shard=SETTINGS.data.per_shard,
            seed=SETTINGS.data.seed,
            sources=swf.shard_sources(SETTINGS),
        conda:
            "../envs/scaleladder.yaml"
        shell:
            "{params.env}{params.scaleladder} shard --parts {params.parts:q} --gather {params.slices} --out {params.outdir:q} "
            "--samples {params.samples} --per-shard {params.per_shard} --image-size {wildcards.px} --seed {params.seed} "
            "--overwrite {params.sources} > {log:q} 2>&1"


# A site whose partition allocates whole nodes (site.local_data: true, Frontier's batch) writes
# the shards where Snakemake runs: as a cluster job a few MB of shards cost a whole exclusive
# node in node-hours and hours in the queue. Elsewhere they stay jobs (data.slices spreads a
# large set over several).
if SETTINGS.site.local_data:

    localrules:
        shard,

    if SHARD_SLICES > 1:

        localrules:
            shard_slice,
