# Stage 2: one job per rung (and per repeat), each writing results/rungs/<run spec>.h5.
#
# An OOM is a result, not a failure: `scaleladder launch`/`finalize`/`maxbatch` turn it
# into an HDF5 record with status 'oom' (exit 0), so the ladder goes on. Any other
# failure exits non-zero and leaves no file; the result is written atomically, so a rung
# killed mid-run (Slurm at its time limit) leaves nothing behind and the next
# `snakemake` runs exactly the rungs that are missing.
#
# TRAP: do not give these rules a `container:`. A rule's container wraps its WHOLE
# command, so srun would run inside the image, where there is no Slurm. A multi-node
# rung starts `srun ... apptainer exec ...` itself, through the site's launcher.
#
# The jobs are benchmarks: `bench_slot` keeps two of them off one workstation at once
# (a SLURM site gives each its own allocation).
#
# The commands themselves are built in one place, scaleladder.site.commands.rung_shell: the rung's
# arguments (RUNG_ARGS) are the same in each. Each rule adds the params its own command reads to RUNG_PARAMS.
# `device` carries every other option of the rung: --device and each setting of every rung (the
# schema's run_arg rows, only where the config differs from the rung's default); its name is the
# template's, which must not change (swf.rung_options says why).
#
# update(): Snakemake keeps a rung's previous result while the job runs (it would delete it
# first), and puts it back if the job fails: a forced rerun that fails never costs the good
# result. The runner writes the new one atomically, so no half-written file stands in between.

RUNG = "{model}/{strategy}/{precision}/{knobs}/n{nodes}/b{batch}"
# `repeats: R` runs a measured rung R times, each a job of its own in fresh processes:
# repeat 0 is <spec>.h5 as ever ({rep} empty), repeat k is <spec>.r<k>.h5 (scaleladder.site.ladder.rung_path).
# Every repeat runs the same command with the same seed: what differs is only the run.
REP = "{rep}"

# Each rung's job asks for its own time (`runtime`, minutes) where the site has a batch system
# (site.time_limit_min): the time model's prediction for that rung with budget.margin and
# budget.slack_s, at most the limit (scaleladder.site.schedule; common.smk's rung_runtime). A
# profile's set-resources `runtime` for these rules would override it: the shipped profiles give
# none. A workstation asks for no time.
RUNG_TIME = {"runtime": rung_runtime} if SCHEDULE else {}


if SETTINGS.site.supervise == "launch":

    # `scaleladder launch` runs the launcher itself: torchrun on a workstation or inside
    # a single-node container, or srun where scaleladder lives on the batch node.
    rule rung:
        input:
            data=rung_data,
        output:
            update(f"results/rungs/{RUNG}{REP}.h5"),
        log:
            f"results/logs/rungs/{RUNG}{REP}.log",
        wildcard_constraints:
            batch=r"\d+",
        params:
            env=swf.env_exports(SETTINGS.site),
            scaleladder=SCALELADDER,
            launcher=launcher,
            ranks=ranks_arg,
            device=rung_device,
            **RUNG_PARAMS,  # what swf.RUNG_ARGS reads (common.smk)
        resources:
            bench_slot=1,
            **RUNG_TIME,
        conda:
            "../envs/scaleladder.yaml"
        shell:
            swf.rung_shell("launch")

else:

    # An Apptainer-only site: scaleladder lives only in the image, so it cannot call srun.
    # The rule starts the ranks (`<launcher> run`), then `scaleladder finalize --rc`
    # does launch's second half. `&& rc=0 || rc=$?` because Snakemake runs shell
    # commands under `set -e`, which would otherwise stop at the failing srun.
    # TRAP: OOM markers left by an earlier attempt that Slurm killed between a rank's
    # OOM and `finalize` would turn this run's good result into 'oom': remove them first
    # (`launch` does the same in the other branch).
    rule rung:
        input:
            data=rung_data,
        output:
            update(f"results/rungs/{RUNG}{REP}.h5"),
        log:
            f"results/logs/rungs/{RUNG}{REP}.log",
        wildcard_constraints:
            batch=r"\d+",
        params:
            env=swf.env_exports(SETTINGS.site),
            prologue=prologue,
            scaleladder=SCALELADDER,
            launcher=launcher,
            device=rung_device,
            **RUNG_PARAMS,  # what swf.RUNG_ARGS reads (common.smk)
        resources:
            bench_slot=1,
            **RUNG_TIME,
        conda:
            "../envs/scaleladder.yaml"
        shell:
            swf.rung_shell("finalize")


# The max-batch search probes several batches, each a full launch, so `scaleladder
# maxbatch` must be able to run the launcher itself (site.supervisor_can_launch; the
# config check refuses 'max' where it cannot).
rule rung_max:
    input:
        data=rung_data,
    output:
        update(f"results/rungs/{RUNG}{REP}.h5"),
    log:
        f"results/logs/rungs/{RUNG}{REP}.log",
    wildcard_constraints:
        batch="max",
    params:
        env=swf.env_exports(SETTINGS.site),
        prologue=prologue,
        scaleladder=SCALELADDER,
        launcher=launcher,
        plan=plan_args,
        cap=swf.maxbatch_args(SETTINGS),
        device=rung_device,
        **RUNG_PARAMS,  # what swf.RUNG_ARGS reads (common.smk)
    resources:
        bench_slot=1,
        **RUNG_TIME,
    conda:
        "../envs/scaleladder.yaml"
    shell:
        swf.rung_shell("maxbatch")


# A rung the memory planner predicts cannot fit (scaleladder.site.ladder decides while
# building the DAG, with site.plan_device) is recorded, not run: `launch --plan-only` writes its
# 'predicted-oom' record here in a second, on the machine that runs Snakemake, and the
# ladder takes it from results/predicted/ instead of results/rungs/. So no allocation is
# spent on a certain OOM. `--config run_predicted_oom=true` runs them all instead.
localrules:
    predicted_oom,


rule predicted_oom:
    input:
        data=rung_data,
    output:
        f"results/predicted/{RUNG}.h5",
    log:
        f"results/logs/predicted/{RUNG}.log",
    params:
        env=swf.env_exports(SETTINGS.site),
        scaleladder=SCALELADDER,
        plan=plan_args,
        **RUNG_PARAMS,  # what swf.RUNG_ARGS reads (common.smk)
    conda:
        "../envs/scaleladder.yaml"
    shell:
        swf.rung_shell("plan-only")


# Packs (site.pack): the rungs of one node count in one batch job each, filled up to the site's time
# limit (scaleladder.site.schedule, campaign/packing.py). The job runs `scaleladder pack`, which runs
# each of the pack's rungs still missing as its own inner `snakemake <rung file>` on the local
# executor, under a timeout of its own: each rung is the rung rule's job above, its command, its
# record and Snakemake's metadata for it, so no finished rung runs again when packing is turned on
# or off. Its output, the pack's record, exists once every rung of the pack has a result; it is a
# checkpoint: `rule all` asks for the packs first and for the ladder's files once they are done
# (LADDER_TARGETS), so that no rung of a pack is also asked for as a job of its own. Why not
# Snakemake's group jobs: docs/workflow.md, "Packs". The params are common.smk's pack_* functions.
if SCHEDULE and SCHEDULE.packs:

    checkpoint pack:
        input:
            data=pack_data,
        output:
            temp("results/packs/n{nodes}-p{k}.json"),
        log:
            "results/logs/packs/n{nodes}-p{k}.log",
        wildcard_constraints:
            nodes=r"\d+",
            k=r"\d+",
        params:
            python=sys.executable,  # the Python that runs Snakemake (and imports scaleladder) on the job's node
            rungs=pack_rungs,
            inner=pack_inner,
        resources:
            bench_slot=1,
            runtime=pack_runtime,
        # (for the linter; the driver runs in params.python whatever the deployment: it needs Snakemake
        # and the batch system's squeue and scancel, which no image or env of the rungs is asked to have)
        conda:
            "../envs/scaleladder.yaml"
        shell:
            "{params.python:q} -m scaleladder pack --pack n{wildcards.nodes}-p{wildcards.k} --limit-min {resources.runtime} "
            "{params.rungs} --out {output:q} -- {params.inner} > {log:q} 2>&1"


# What `rule all` asks for (the Snakefile): the ladder's files; with packs still to run, each pack
# first (in parallel), every rung outside the packs at once, and the ladder's files after the packs
# (a pack's output is a checkpoint's: asking for it waits until its job has finished).
LADDER_TARGETS = site_schedule.ladder_targets(
    LADDER, SCHEDULE, lambda pack: checkpoints.pack.get(nodes=pack.nodes, k=pack.k).output
)
