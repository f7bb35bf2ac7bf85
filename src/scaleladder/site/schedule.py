"""The ladder's batch jobs, decided while the DAG is built: each rung's time, its verdict, the packs.

Where the site has a batch system (``site.time_limit_min``), every rung's job asks for its own time
from the time model (campaign/cost.py) with the stated margin (campaign/timelimit.py); a rung
predicted past the limit runs fewer steps where its interval holds, else is refused; and with
``site.pack`` the rungs of one node count share batch jobs (campaign/packing.py). ``scaleladder
budget`` prices the same rungs, verdicts and packs from here, so the budget and the dry run agree.

Two time models: the verdicts and the packs use the planner's prediction and the stated start-ups
only, so that they do not move as rungs finish (a shortened rung's steps are in its command; a
pack's name must mean the same rungs in every process that reads the workflow); the time a job
asks for (:meth:`Schedule.runtime_min`) is calibrated by the finished rungs' records as well.
Torch-free: this runs on a login node, in every process that reads the workflow.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from scaleladder.campaign import cost
from scaleladder.campaign.packing import Member, Pack, PackError, pack_name, pack_rungs
from scaleladder.campaign.plan_trace import NotTraced, Untraceable
from scaleladder.campaign.timelimit import Limits, Verdict, judge
from scaleladder.errors import SpecError
from scaleladder.planner.steptime import site_from_config
from scaleladder.site.config import INVALID, ConfigError
from scaleladder.site.ladder import Ladder, final_targets, rank_args, repeats, rung_data_path, rung_inputs, rung_path, spec_of_file
from scaleladder.spec import RunSpec

__all__ = ["PackError", "time_model", "rung_estimate", "at_steps", "Schedule", "schedule", "attach", "job_minutes",
           "rung_options", "check_packing", "notes",
           "pack_table", "announce", "in_pack", "pack_rung_args", "inner_snakemake", "PackWildcards", "pack_of", "pack_inputs",
           "ladder_targets"]


def time_model(ladder: Ladder, profile: str, limits_min: Mapping[str, float] | None = None,
               trace_cache: str | None = None) -> cost.TimeModel:
    """The profile's time model: its device (``budget.device``, else ``site.plan_device``), steps,
    stated MFU, start-ups, probe steps and the site's links; ``limits_min`` (rule -> minutes) bound
    an unpriced rung."""
    s = ladder.settings
    device = s.budget.device or s.site.plan_device
    limits = dict(limits_min or {})
    if s.site.time_limit_min and not limits:
        limits = {"rung": float(s.site.time_limit_min), "rung_max": float(s.site.time_limit_min)}
    return cost.TimeModel(device, s.steps, dict(s.budget.mfu or ()),
                          float(s.budget.rung_startup_s if s.budget.rung_startup_s is not None else cost.DEFAULT_STARTUP_S),
                          int(s.maxbatch.probe_steps or 5), site_from_config(ladder.config, profile), ladder.ranks_per_node,
                          trace_cache=trace_cache, limits_s={k: v * 60 for k, v in limits.items()},
                          job_startup_s=float(s.budget.job_startup_s or 0.0))


def _max_batch(spec: RunSpec, ladder: Ladder, rpn: int) -> tuple[int | None, str, str]:
    """Where a ``max`` rung's search starts, as the budget prices it: (batch, why not priced, untraced note)."""
    from scaleladder.campaign.maxbatch import planned_start

    site = ladder.settings.site
    if not site.plan_device:  # a site with no memory planner: the search ends at its cap (a CPU)
        return site.max_batch_cap, "" if site.max_batch_cap else "not priced: no plan_device and no max_batch_cap", ""
    try:
        # where the search starts: the planner's max batch; for a -compile rung, whose memory the planner
        # gives only as an upper bound, its eager counterpart's (maxbatch.planned_start); a models-file
        # model's from its cached trace (torch-free)
        batch = planned_start(spec, site.plan_device, rpn, rung_data_path(spec, ladder.settings.data.source), cached_only=True)[0]
    except (NotTraced, Untraceable) as e:
        return None, "", f"no predicted max batch: {str(e).split(': ', 1)[-1]}"
    except (SpecError, ValueError) as e:
        return None, f"not priced: no predicted max batch ({e})", ""
    if batch is None and spec.strategy.compile:
        return None, ("not priced: its eager counterpart does not fit batch 1, and the planner's memory for a "
                      "compiled rung is only that upper bound (the rung runs; its search finds out)"), ""
    return batch, "", ""


def rung_estimate(spec: RunSpec, ladder: Ladder, timing: cost.TimeModel, measured: Mapping[str, cost.Measured]) -> cost.Estimate:
    """One rung's own job, priced: at its batch (a ``max`` rung at the search's planned start, with its
    probes), its start-ups and steps; a rung the planner says cannot fit costs nothing."""
    world, rpn = rank_args(spec, ladder.ranks_per_node)
    fits = spec.path not in ladder.predicted_oom
    max_batch, why, untraced = _max_batch(spec, ladder, rpn) if spec.batch == "max" and fits else (None, "", "")
    est = cost.estimate(spec, world, fits, max_batch, timing, measured)
    if untraced and not est.measured:
        est = cost.unpriced(spec, world, timing, untraced)
    if spec.batch == "max" and spec.strategy.compile and not est.measured and max_batch is not None:
        est = dataclasses.replace(est, source=est.source + "; at the eager rung's predicted max batch")
    if why and not est.measured:
        est = cost.Estimate(spec, world, spec.nodes, None, True, 0.0, 0.0, why, priced=False)
    return est


def at_steps(est: cost.Estimate, configured: int, steps: int) -> cost.Estimate:
    """The estimate of a rung run at ``steps`` instead of ``configured``."""
    if steps == configured or not est.priced or math.isnan(est.step_s):
        return est
    return dataclasses.replace(est, job_s=est.job_s - (configured - steps) * est.step_s)


@dataclass
class Schedule:
    """Every selected rung's verdict and, with ``site.pack``, the packs (see the module's docstring)."""

    ladder: Ladder
    profile: str
    limits: Limits
    verdicts: dict[str, Verdict]  # spec path -> verdict (rungs that run on the site's batch system)
    packs: list[Pack] = field(default_factory=list)
    repo: Path = Path(".")

    @property
    def refused(self) -> frozenset[str]:
        return frozenset(p for p, v in self.verdicts.items() if v.kind == "refused")

    def steps(self, spec: RunSpec) -> int:
        v = self.verdicts.get(spec.path)
        return v.steps if v else self.ladder.settings.steps

    @functools.cached_property
    def calibrated(self) -> tuple[cost.TimeModel, dict[str, cost.Measured]]:
        """The time model with the finished rungs' records (read once, when a job's time is first asked)."""
        files = [str(p) for p in (self.repo / "results" / "rungs").rglob("*.h5")]
        return time_model(self.ladder, self.profile), cost.read_measured(files)

    def runtime_min(self, spec: RunSpec) -> int:
        """What the rung's own job asks for, in minutes: the calibrated prediction at its steps, with
        the margin, at most the limit (the limit where nothing prices it)."""
        timing, measured = self.calibrated
        est = at_steps(rung_estimate(spec, self.ladder, timing, measured), timing.steps, self.steps(spec))
        if not est.priced or not est.fits or math.isnan(est.step_s):
            return self.limits.limit_min
        return self.limits.ask_min(est.job_s)

    @property
    def packed(self) -> dict[str, Pack]:
        """Rung file -> its pack."""
        return {m.file: p for p in self.packs for m in p.members}

    @property
    def job_startup_s(self) -> float:
        """What a batch job pays once, stated (``budget.job_startup_s``)."""
        return self.ladder.settings.budget.job_startup_s or 0.0

    def to_run(self) -> list[Pack]:
        """The packs with rungs still to run."""
        return [p for p in self.packs if self.todo(p)]

    def pack(self, name: str) -> Pack:
        for p in self.packs:
            if p.name == name:
                return p
        raise SpecError(f"no pack {name!r} in this ladder (its packs: {', '.join(p.name for p in self.packs) or 'none'})")

    def todo(self, p: Pack) -> list[Member]:
        """The members of a pack that have no result yet."""
        return [m for m in p.members if not (self.repo / m.file).exists()]

    def pack_runtime_min(self, p: Pack) -> int:
        """What a pack's job asks for: the job's start-up once and its rungs still to run, with the margin."""
        todo = frozenset(m.file for m in self.todo(p)) or None
        return self.limits.ask_min(p.predicted_s(self.job_startup_s, todo))

    def member_timeout_s(self, m: Member) -> int:
        """A rung's own timeout inside a pack: its prediction there with the margin."""
        return math.ceil(self.limits.ask_s(m.rung_s))


def job_minutes(sched: Schedule, spec: RunSpec, submitting: bool) -> int:
    """A rung job's ``runtime``: what :meth:`Schedule.runtime_min` asks for in the Snakemake that
    submits; the limit in a job's own Snakemake and a pack's inner one, which ask Slurm for nothing
    and so read no finished records to calibrate it."""
    return sched.runtime_min(spec) if submitting and not in_pack() else sched.limits.limit_min


def rung_options(sched: Schedule | None, options: str, spec: RunSpec) -> str:
    """A ladder rule's ``device`` parameter (site/commands.rung_options: ``options``); a rung the time
    limit shortened adds ``--shortened-from <configured steps>``, so its record says so. Every
    other rung's is ``options`` unchanged, so no finished rung's command changes."""
    configured = sched.ladder.settings.steps if sched else 0
    return options + (f" --shortened-from {configured}" if sched and sched.steps(spec) != configured else "")


def check_packing(ladder: Ladder) -> None:
    """``site.pack`` needs a batch system to pack into: a site with no ``time_limit_min`` has none."""
    site = ladder.settings.site
    if site.pack is not False and not site.time_limit_min:
        raise ConfigError(f"{INVALID}  config key 'site.pack': site {site.name!r} has no batch system to pack rungs into "
                          "(no site.time_limit_min; a workstation runs its rungs one by one already)")


def schedule(ladder: Ladder, profile: str = "", repo: Path | str = ".", trace_cache: str | None = None) -> Schedule | None:
    """The ladder's batch jobs; None where the site has no batch system (no ``site.time_limit_min``).
    :class:`PackError` for ``site.pack: N`` that the time limit does not allow."""
    check_packing(ladder)
    s = ladder.settings
    if not s.site.time_limit_min:
        return None
    profile = profile or s.site.name
    limits = Limits(s.site.time_limit_min * 60.0, float(s.budget.margin), float(s.budget.slack_s))
    timing = time_model(ladder, profile, trace_cache=trace_cache)
    verdicts: dict[str, Verdict] = {}
    members: list[Member] = []
    for spec in ladder.selected:
        if spec.path in ladder.predicted_oom:
            continue
        est = rung_estimate(spec, ladder, timing, {})
        v = verdicts[spec.path] = judge(spec.path, est, s.steps, s.warmup, limits)
        if v.kind in ("runs", "shortened"):
            rung = at_steps(est, s.steps, v.steps).rung_s
            members += [Member(rung_path(spec, k), spec.nodes, rung) for k in range(repeats(s))]
    packs = pack_rungs(members, limits, timing.job_startup_s, s.site.pack) if s.site.pack is not False else []
    return Schedule(ladder, profile, limits, verdicts, packs, Path(repo))


def attach(ladder: Ladder, profile: str = "", repo: Path | str = ".") -> tuple[Ladder, Schedule | None]:
    """:func:`schedule`, and the ladder without its refused rungs in :attr:`Ladder.rung_files` (the
    aggregate waits for no rung that will not run). A bad ``site.pack`` raises :class:`ConfigError`."""
    try:
        sched = schedule(ladder, profile, repo)
    except PackError as e:
        raise ConfigError(f"{INVALID}  config key 'site.pack': {e}") from None
    return (ladder if sched is None else dataclasses.replace(ladder, refused=sched.refused)), sched


def notes(sched: Schedule) -> list[str]:
    """The lines the dry run and the budget print: every shortened and refused rung, one line each."""
    return [f"scaleladder: {v.line}" for v in sched.verdicts.values() if v.kind in ("shortened", "refused")]


def pack_table(sched: Schedule, members: bool = False) -> list[str]:
    """One line per pack with rungs still to run: how many, its predicted time and what its job asks
    for; with ``members``, its rungs' spec paths too."""
    job = sched.job_startup_s
    lines = []
    for p in sched.packs:
        if not (todo := sched.todo(p)):
            continue
        files = frozenset(m.file for m in todo)
        line = (f"  {p.name}: {len(todo)}{'' if len(todo) == len(p.members) else f' of {len(p.members)}'} rung(s) on "
                f"{p.nodes} node(s), predicted {p.predicted_s(job, files) / 60:.0f} min, asks {sched.pack_runtime_min(p)} min")
        if members:
            line += ": " + ", ".join(m.file.removeprefix("results/rungs/").removesuffix(".h5") for m in todo)
        lines.append(line)
    return lines


def announce(sched: Schedule) -> str:
    """What the dry run prints while the DAG is built: the rule each job's time follows, every
    shortened or refused rung, and the packs still to run."""
    lines = [f"scaleladder: each rung's job asks for its own time, {sched.limits.rule()} (the time model: "
             "`scaleladder budget` prices it)"] + notes(sched)
    todo = sched.to_run()
    if todo:
        rungs = sum(len(sched.todo(p)) for p in todo)
        lines.append(f"scaleladder: {rungs} rung(s) in {len(todo)} pack(s) of one batch job each (site.pack: "
                     f"{sched.ladder.settings.site.pack}; results/packs/<pack>.json once every rung of it is recorded):")
        lines += pack_table(sched, members=True)
    return "\n".join(lines)


def in_pack() -> str:
    """The pack this process runs a rung of (``scaleladder pack`` sets it for its inner Snakemake), else ''."""
    return os.environ.get("SCALELADDER_PACK", "")


def pack_rung_args(sched: Schedule, name: str) -> str:
    """The pack job's ``--rung FILE=TIMEOUT_S:PREDICTED_S`` arguments, its rungs still to run in order
    (shell-quoted: a file name is data)."""
    return " ".join(f"--rung {shlex.quote(f'{m.file}={sched.member_timeout_s(m)}:{m.rung_s:.0f}')}"
                    for m in sched.todo(sched.pack(name)))


def inner_snakemake(snakefile: str, configfiles: Sequence[str | Path], config_args: Sequence[str] | str | None,
                    deployment: object = None) -> str:
    """The options of a pack's inner Snakemake for one rung (``scaleladder pack``, after ``--``): this
    workflow with the same config files, ``--config`` and software deployment (Snakemake's
    ``DeploymentSettings``: conda, apptainer, the conda prefix), on the local executor inside the
    allocation, without the lock the workflow's own Snakemake holds. Shell-quoted."""
    methods = sorted(m.item_to_choice() for m in getattr(deployment, "deployment_method", None) or ())
    conda_prefix = getattr(deployment, "conda_prefix", None)
    args = ["--snakefile", snakefile, "--cores", "1", "--nolock", "--rerun-incomplete", "--latency-wait", "30",
            "--printshellcmds", "--executor", "local"]
    if methods:
        args += ["--software-deployment-method", *methods]
    if conda_prefix:
        args += ["--conda-prefix", str(conda_prefix)]
    if configfiles:
        args += ["--configfiles", *map(str, configfiles)]
    extra = [config_args] if isinstance(config_args, str) else list(config_args or [])
    if extra:
        args += ["--config", *extra]
    return shlex.join(args)


class PackWildcards(Protocol):
    """The wildcards of the pack rule (results/packs/n{nodes}-p{k}.json)."""

    nodes: str
    k: str


def pack_of(wildcards: PackWildcards) -> str:
    return pack_name(int(wildcards.nodes), int(wildcards.k))


def pack_inputs(sched: Schedule, name: str) -> list[str]:
    """The shard manifests the pack's rungs still to run read (the pack rule's input)."""
    source = sched.ladder.settings.data.source
    return sorted({f for m in sched.todo(sched.pack(name)) for f in rung_inputs(spec_of_file(m.file), source)})


def ladder_targets(ladder: Ladder, sched: Schedule | None, done: Callable[[Pack], object]) -> dict[str, object]:
    """``rule all``'s inputs, by name: the ladder's files (:func:`final_targets`); with packs still to
    run, each pack (``done(pack)``: its checkpoint's output, which raises Snakemake's
    IncompleteCheckpointException until the pack's job has finished), every rung file outside the
    packs, and the ladder's files once every pack is done: so no rung of a pack is ever asked for
    as a job of its own."""
    todo = sched.to_run() if sched else []
    if not todo or sched is None:
        return {"ladder": final_targets(ladder)}

    def after_packs(wildcards: object) -> list[str]:
        for p in todo:
            done(p)
        return final_targets(ladder)

    packed = sched.packed
    return {**{f"pack_{p.name.replace('-', '_')}": (lambda wildcards, p=p: done(p)) for p in todo},
            "outside_packs": [f for f in ladder.rung_files if f not in packed], "ladder": after_packs}
