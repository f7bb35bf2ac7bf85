# scaleladder: one DAG from data shards to per-rung HDF5 files, the merged ladder,
# its figures and a report. Run it through a profile, which says where:
#
#   snakemake --profile profiles/local        # a workstation (the README's main command)
#   snakemake --profile profiles/frontier     # OLCF Frontier, srun + Apptainer (ROCm)
#   snakemake --profile profiles/a100         # a SLURM cluster of 8xA100 nodes, Apptainer (CUDA)
#
# The stages live in workflow/rules/; docs/workflow.md covers reruns and containers.

from snakemake.utils import min_version

min_version("9.0")


# Workflow-wide defaults (steps, data). The site and its ladder come from the profile's
# site.yaml, loaded on top of this file (--configfile in the profile).
configfile: "config/config.yaml"


# Without a profile, the workstation's site and ladder, so that a bare `snakemake -n`
# or `snakemake --lint` works.
if "site" not in config:

    configfile: "profiles/local/site.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/ladder.smk"
include: "workflow/rules/converge.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/trackers.smk"


rule all:
    input:
        CONVERGE_TARGETS,
        **LADDER_TARGETS,  # the ladder's files; with packs still to run, the packs first (workflow/rules/ladder.smk)
    default_target: True
