# What the rules need from the config and the site, each a line calling scaleladder.site
# (src/scaleladder/site/), where the logic lives and is unit-tested (tests/test_workflow_logic.py):
# config validation (site/config.py), the ladder as run specs and the planner's routing
# (site/ladder.py), the site's strings in the rules' commands (site/commands.py, as `swf`).
#
# Everything a site is (launcher, container, environment, ranks per node) comes from
# `config["site"]`, which the profile's site.yaml provides. Nothing here names a site.

import os
import sys

from snakemake.exceptions import WorkflowError

# TRAP: no module here may be bound to the name `workflow` (or `config`, `rules`): it would shadow
# Snakemake's own object, which every directive below (rule, include, ...) is compiled into.
import scaleladder.site.commands as swf
import scaleladder.site.config as site_config
import scaleladder.site.ladder as site_ladder
import scaleladder.site.site_check as site_check
import scaleladder.site.failures as failures
import scaleladder.site.schedule as site_schedule

SCHEMA = os.path.normpath(os.path.join(workflow.current_basedir, "..", "schemas", "config.schema.yaml"))

# For --software-deployment-method conda: workflow/envs/scaleladder.yaml names this checkout
# as ${SCALELADDER_REPO} (swf.export_repo says why).
swf.export_repo(os.path.join(workflow.current_basedir, "..", ".."))

# Validates `config` once (filling the schema's defaults into it), expands the ladder and
# asks the planner about every rung. A bad config fails here, before any job, naming the key.
# The --config overrides go in too: a data value given there must also survive Snakemake's
# re-quoting of --config into cluster jobs (site_config.check_data_values says why).
try:
    LADDER = site_ladder.prepare(config, SCHEMA, cli_config=workflow.config_settings.config)
    # Where the site has a batch system (site.time_limit_min): each rung's job time from the time model,
    # the rungs predicted past the limit shortened or refused, and with site.pack the packs
    # (scaleladder.site.schedule; None on a workstation). A refused rung leaves LADDER.rung_files.
    LADDER, SCHEDULE = site_schedule.attach(LADDER)
except site_config.ConfigError as e:
    raise WorkflowError(str(e)) from None

# The config read once into typed fields (scaleladder.site.settings.SiteConfig, generated from the
# schema): what the rules read. `config` itself is read only for the ladder's provenance.
SETTINGS = LADDER.settings
# The site's required settings (site.requires) that are missing, in a few lines before any job
# is submitted, -n included; not again inside each job (scaleladder.site.site_check).
if workflow.is_main_process and (_missing := site_check.announce(SETTINGS.site)):
    print(_missing, file=sys.stderr)
RPN = LADDER.ranks_per_node
# The dry run says which rungs run fewer steps or are refused for the time limit, and the packs; once,
# from the Snakemake the user started (not from each job's, nor a pack's own for one rung).
if workflow.is_main_process and SCHEDULE and not site_schedule.in_pack():
    print(site_schedule.announce(SCHEDULE), file=sys.stderr)


# A failed job: its cause on the console, under the rule's name (scaleladder.site.failures). Snakemake
# itself prints "message: None" and the log's path; the one line that says why is in that log.
onerror:
    _copies = failures.explain(log, sys.stderr)
    # In a container, Snakemake's last line names its complete log inside the container (gone
    # after `docker run --rm`); it names the copy in the mounted results/ instead, relative, as
    # the host sees it. TRAP: logger_manager.logfile_hint is Snakemake's internals (9.x: called
    # right after this handler, it prints "Complete log(s): <absolute paths>"); if it moves, the
    # same line is printed here instead.
    if _copies:
        _manager = workflow.logger_manager

        def _hint():
            _manager.logger.info(failures.complete_log_line(_copies))
            return _manager.logfile_handlers.values()

        if hasattr(_manager, "logfile_hint") and hasattr(_manager, "logger"):
            _manager.logfile_hint = _hint
        else:
            print(failures.complete_log_line(_copies), file=sys.stderr)


# A `select` run ends with the ladder, figures and report of what it selected (Ladder.rung_files):
# say so, and how to get every rung back.
onsuccess:
    if LADDER.config.get("select"):
        print(site_ladder.select_note(LADDER), file=sys.stderr)
SCALELADDER = swf.fill(SETTINGS.site.scaleladder, SETTINGS.site, RPN)  # how a job calls scaleladder


# Wildcards may only take values the ladder declares, so a typo in a target path
# cannot match a rule by accident.
wildcard_constraints:
    **site_ladder.wildcard_constraints(LADDER.rungs),


# -- input and params functions of the rung rules (wildcards -> run spec -> string) --------


# ancient() where the finished shards were written with today's data settings: a rung needs
# them to exist, not to be older than itself. TRAP: a failed shard attempt with other settings
# leaves its params in Snakemake's metadata, so the next run reshards (the same bytes), which
# would otherwise make every finished rung run again. Data changed on purpose: a
# plain input, so the rungs run again on the new shards (site_ladder.shards_settled).
def rung_data(wildcards):
    return [ancient(f) if settled else f for f, settled in site_ladder.rung_shards(swf.spec_of(wildcards), SETTINGS)]


def data_arg(wildcards, input):
    return input.data if input.get("data") else "synthetic"


def spec_path(wildcards):
    return swf.spec_of(wildcards).path


def launcher(wildcards):
    return swf.launcher(SETTINGS.site, RPN, swf.spec_of(wildcards))


def prologue(wildcards):
    return swf.prologue(SETTINGS.site, RPN, swf.spec_of(wildcards))


def ranks_arg(wildcards):
    return swf.ranks_arg(swf.spec_of(wildcards), RPN)


def plan_args(wildcards):
    return swf.plan_args(SETTINGS, RPN, swf.spec_of(wildcards))


# --device and every setting of every rung (the schema's run_arg rows), for the rules' `device` param.
# The schema the config was validated with: the workflow's own (an installed package has no workflow/ beside it).
RUNG_OPTIONS = swf.rung_options(SETTINGS, site_config.load_schema(SCHEMA))


# The params every ladder rule's command reads for the rung's own arguments (swf.RUNG_ARGS),
# once: each rule adds those of its own command (env, launcher, ...).
# A rung's steps: the config's, fewer where the time limit shortened it (site_schedule; the same number
# in every process, so a finished rung's parameters never change under it).
def rung_steps(wildcards):
    return SCHEDULE.steps(swf.spec_of(wildcards)) if SCHEDULE else SETTINGS.steps


# The ladder rules' `device` (swf.rung_options); a shortened rung's adds --shortened-from, the
# configured steps, so its record says so (steps_configured). Every other rung's is RUNG_OPTIONS as ever.
def rung_device(wildcards):
    return site_schedule.rung_options(SCHEDULE, RUNG_OPTIONS, swf.spec_of(wildcards))


# The time a rung's job asks for, minutes (ladder.smk's RUNG_TIME, where the site has a batch system).
# Only the Snakemake that submits asks Slurm for it: a job's own Snakemake and a pack's inner one
# take the limit, and read no finished records to calibrate it (every rung file's attributes).
def rung_runtime(wildcards):
    return site_schedule.job_minutes(SCHEDULE, swf.spec_of(wildcards), submitting=workflow.is_main_process)


# -- the pack rule's (ladder.smk, site.pack): its rungs' shards, its time, its rungs, the inner Snakemake --
def pack_data(wildcards):
    return site_schedule.pack_inputs(SCHEDULE, site_schedule.pack_of(wildcards))


def pack_runtime(wildcards):
    return SCHEDULE.pack_runtime_min(SCHEDULE.pack(site_schedule.pack_of(wildcards)))


def pack_rungs(wildcards):
    return site_schedule.pack_rung_args(SCHEDULE, site_schedule.pack_of(wildcards))


# the process that runs the pack's job reads the workflow with the same files, --config and deployment
def pack_inner(wildcards):
    return site_schedule.inner_snakemake(workflow.main_snakefile, workflow.overwrite_configfiles, workflow.config_settings.config_args,
                                         workflow.deployment_settings)


RUNG_PARAMS = dict(
    spec=spec_path,
    data=data_arg,
    steps=rung_steps,
    warmup=SETTINGS.warmup,
    workers=swf.rung_workers(SETTINGS),
    seed=SETTINGS.seed,
)
