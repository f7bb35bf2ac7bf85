"""`scaleladder budget --profile NAME [--out results/budget.md] [--rungs]`: the campaign's cost
in node-hours, before anything is submitted.

The rungs come from the workflow's own expansion of the profile's ladder
(:func:`scaleladder.site.ladder.prepare`, the planner's verdict included), per ladder block in
config order (a rung in two blocks counts in the first, as the workflow runs it once); the
time model and its calibration from finished rungs are ``campaign/cost.py``; the time limit is
the site's (``site.time_limit_min``; a profile without one: the ``runtime`` it gives the ``rung``
and ``rung_max`` jobs). Where the site has one, each rung's verdict under it (runs, shortened to
fewer steps, refused) and the packs (``site.pack``) are the workflow's own (site/schedule.py): a
packed rung costs its own part, and each pack its job's start-up once. Finished rungs (their
result files exist) are counted as measured and cost nothing more.

``--out`` writes the table as Markdown (atomically); ``scaleladder report`` adds it to the
report as a section when it lies beside the ladder file (results/budget.md).

A models-file model (``--models FILE``, or the config's ``models_file``) is priced from its cached
trace (``--trace-cache``; campaign/cost.py says the fallback where there is none), and one line
under the table counts the rungs that had none and gives the command that traces them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scaleladder import markdown
from scaleladder.campaign import cost
from scaleladder.campaign.plan_trace import NotTraced, Untraceable, trace, traced_model, untraced_hint
from scaleladder.errors import SpecError
from scaleladder.files import atomic_file
from scaleladder.flavors import get_flavor
from scaleladder.site import config as site_config
from scaleladder.site import ladder as site_ladder
from scaleladder.site import schedule as site_schedule
from scaleladder.site.config import ConfigError
from scaleladder.site.profiles import find_profile, load_profile, parse_config, profile_config


def estimates(profile_name: str, repo: Path, configfiles: Sequence[str] | None = None, overrides: Mapping[str, Any] | None = None,
              trace_cache: str | None = None) -> tuple[list[tuple[str, list[cost.Estimate]]], dict[str, float], cost.TimeModel,
                                                       site_schedule.Schedule | None]:
    """Every rung the workflow would run with this profile and config (``select`` applied), per
    ladder block, priced; the time limits (rule -> minutes), the time model, and the site's batch
    jobs (site/schedule.py: each rung's verdict under the time limit, the packs)."""
    prof = load_profile(profile_name, repo, plan=True, configfiles=configfiles, overrides=overrides)
    if prof.config_error or prof.ladder is None:
        raise SpecError(f"profile {profile_name}: {prof.config_error}")
    ladder, cfg = prof.ladder, prof.config
    chosen = {s.path for s in ladder.selected}  # `select` (every rung without one), as the workflow's targets
    site = ladder.settings.site
    if not (ladder.settings.budget.device or site.plan_device):
        raise SpecError(f"profile {profile_name} names no site.plan_device (nor budget.device), so there is no device to price the rungs on")
    limits = ({rule: float(site.time_limit_min) for rule in ("rung", "rung_max")} if site.time_limit_min else
              {rule: float(v) for rule in ("rung", "rung_max") if (v := prof.resources(rule).get("runtime"))})
    timing = site_schedule.time_model(ladder, profile_name, limits, trace_cache)
    try:
        sched = site_schedule.schedule(ladder, profile_name, repo, trace_cache)
    except ConfigError as e:
        raise SpecError(str(e).strip().splitlines()[-1].strip()) from None  # the key and why, without the config error's header
    measured = cost.read_measured([str(p) for p in (repo / "results" / "rungs").rglob("*.h5")])
    packed = set(sched.packed) if sched else set()
    seen: set[str] = set()
    blocks: list[tuple[str, list[cost.Estimate]]] = []
    for i, block in enumerate(cfg["ladders"]):
        specs, _ = site_ladder.expand_ladder([block], ladder.ranks_per_node)
        ests = []
        for spec in specs:
            if spec.path in seen or spec.path not in chosen:
                continue
            seen.add(spec.path)
            est = site_schedule.rung_estimate(spec, ladder, timing, measured)
            v = sched.verdicts.get(spec.path) if sched else None
            if v and not est.measured and v.kind == "refused":
                est = dataclasses.replace(est, refused=v.line)
            elif v and not est.measured and v.kind == "shortened":
                est = dataclasses.replace(site_schedule.at_steps(est, timing.steps, v.steps), steps=v.steps)
            ests.append(dataclasses.replace(est, packed=site_ladder.rung_path(spec) in packed))
        if ests or not cfg.get("select"):  # a block `select` leaves empty is not this campaign's
            blocks.append((str(block.get("name") or f"ladders[{i}]"), ests))
    return blocks, limits, timing, sched


def untraced_line(blocks: Sequence[tuple[str, Sequence[cost.Estimate]]], timing: cost.TimeModel, models_file: str | None) -> str:
    """One line for the rungs of models-file models priced without a cached trace (their source
    says how): how many, and the command that traces them; '' when there are none."""
    missing: list[NotTraced] = []
    cannot = 0
    for _, ests in blocks:
        for e in ests:
            if e.measured or not e.fits or not traced_model(get_flavor(e.spec.model)):
                continue
            try:
                trace(e.spec, e.world, cache=timing.trace_cache, cached_only=True)
            except NotTraced as n:
                missing.append(n)
            except Untraceable:
                cannot += 1
    if not missing and not cannot:
        return ""
    line = (f"{len(missing) + cannot} rung(s) of models-file models have no cached trace to price them by: their rule's "
            "time limit (an upper bound) or FLOPs a finished rung recorded priced them instead, else nothing "
            "(--rungs: each one's source).")
    if cannot:
        line += f" {cannot} of them the fake tensors cannot trace (FSDP1 on several ranks)."
    if missing:
        line += f" Trace the rest: {untraced_hint(missing, timing.plan_device, timing.ranks_per_node, models_file, timing.trace_cache)}"
    return line


def jobs(blocks: Sequence[tuple[str, Sequence[cost.Estimate]]], repo: Path, n_repeats: int,
         packed: set[str] | frozenset[str] = frozenset()) -> Counter[str]:
    """The rung jobs ``snakemake -n`` lists for these rungs, per rule: each repeat of a rung that
    fits, is not refused for the time limit, is in no pack and has no result file yet (any record,
    as Snakemake sees it) is a ``rung`` job, or a ``rung_max`` job for a ``max`` rung."""
    out: Counter[str] = Counter()
    for _, ests in blocks:
        for e in ests:
            if e.fits and not e.refused:
                rule = "rung_max" if e.spec.batch == "max" else "rung"
                out[rule] += sum(not (repo / (f := site_ladder.rung_path(e.spec, k))).exists() and f not in packed
                                 for k in range(n_repeats))
    return out


def top(blocks: Sequence[tuple[str, Sequence[cost.Estimate]]], n: int) -> list[str]:
    """The ``n`` costliest rungs still to run, costliest first (ties by spec path)."""
    todo = sorted((e for _, ests in blocks for e in ests if e.fits and e.priced and not e.measured and not e.refused),
                  key=lambda e: (-e.node_hours, e.spec.path))
    return [f"{e.node_hours:8.2f} node-h  {e.spec.path}  ({e.job_s / 60:.0f} min x {e.nodes} node(s), batch {e.batch})"
            for e in todo[:n]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="a folder name under profiles/ (or profiles/NAME, as snakemake takes it)")
    p.add_argument("--configfile", nargs="+", metavar="FILE",
                   help="as snakemake's: these files replace the profile's own site.yaml (name it first to build on it)")
    p.add_argument("--config", nargs="+", metavar="KEY=VALUE",
                   help="as snakemake's, on top of the config files, e.g. 'select={models: [vit-base]}'")
    p.add_argument("--top", type=int, metavar="N", help="also list the N costliest rungs still to run, costliest first")
    p.add_argument("--repo", default=".", help="the workflow's folder (default: here)")
    p.add_argument("--out", help="also write the table as Markdown here (e.g. results/budget.md, which the report shows)")
    p.add_argument("--rungs", action="store_true", help="one line per rung: its job time and where the estimate comes from")
    p.add_argument("--trace-cache", default=None, metavar="DIR",
                   help="where a models-file model's traces are read (as `scaleladder plan --trace-cache`; default: "
                        "$SCALELADDER_CACHE/plan-traces, else $XDG_CACHE_HOME/scaleladder/plan-traces, else ~/.cache/scaleladder/plan-traces)")


def main(args: argparse.Namespace) -> int:
    repo = Path(args.repo).resolve()
    overrides = parse_config(getattr(args, "config", None) or [])
    blocks, limits, timing, sched = estimates(args.profile, repo, getattr(args, "configfile", None), overrides,
                                              getattr(args, "trace_cache", None))
    rows = cost.block_table(blocks, limits, asks=(lambda s: sched.limits.ask_s(s) / 60) if sched else None)
    if sched and sched.packs:
        rows = with_packs(rows, sched)
    mfu = ", ".join(f"{k} {v:.2f}" for k, v in sorted(timing.mfu.items())) or f"default {cost.DEFAULT_MFU}"
    sources = sorted({e.startup_source for _, ests in blocks for e in ests if e.fits and e.priced and e.startup_source})
    head = (f"Budget for profile {args.profile}: {timing.steps} steps per rung on {timing.plan_device}, each step predicted "
            "by the planner (planner/steptime.py: compute, host, communication over the profile's timing.links"
            + (f"; {timing.site.links_note}" if timing.site.links_note else "") + f"), stated MFU {mfu} only where it has "
            "no rates; calibrated from finished rungs where there are any. Start-up (priced apart from the steps): "
            + ("; ".join(sources) if sources else f"stated {timing.job_startup_s + timing.startup_s:.0f} s") + "."
            + (f" Each job asks for {sched.limits.rule()}." if sched else "") + "\n\n")
    text = head + "\n".join(markdown.dict_table(rows)) + "\n"
    if sched:
        text += "".join(f"\n{line.removeprefix('scaleladder: ')}" for line in site_schedule.notes(sched)) + ("\n" if site_schedule.notes(sched) else "")
    if args.rungs:
        text += "\n" + "\n".join(
            f"{e.spec.path}: " + (_rung_line(e) if e.fits and e.priced and not e.refused else e.refused or e.source)
            for _, ests in blocks for e in ests) + "\n"
    if sched and sched.packs:
        text += "\n" + pack_lines(sched, args.rungs) + "\n"
    text += "\n" + job_line(args, blocks, repo, overrides, sched) + "\n"
    models_file = getattr(args, "models", None) or profile_config(repo, find_profile(args.profile, repo),
                                                                   getattr(args, "configfile", None), overrides).get("models_file")
    if note := untraced_line(blocks, timing, models_file):
        text += "\n" + note + "\n"
    n_top = getattr(args, "top", None)
    if n_top is not None:
        if n_top < 1:
            raise SpecError(f"--top {n_top}: expected a number of rungs >= 1")
        listed = top(blocks, n_top)
        text += f"\nThe {len(listed)} costliest rung(s) still to run:\n" + "\n".join(listed) + "\n"
    print(text, end="")
    if args.out:
        with atomic_file(args.out) as tmp:
            tmp.write_text(text)
    return 0


def with_packs(rows: list[dict[str, str]], sched: site_schedule.Schedule) -> list[dict[str, str]]:
    """The table with a row for the packs' job start-ups (each pack's once, on its nodes), in the total too."""
    job = sched.job_startup_s
    todo = sched.to_run()
    hours = sum(p.nodes * job for p in todo) / 3600
    row = {k: "" for k in rows[-1]} | {"ladder block": f"the {len(todo)} pack jobs' start-ups ({job:.0f} s each)",
                                        "node-hours to run": f"{hours:.1f}", "of which start-up": f"{hours:.1f}"}
    total = dict(rows[-1])
    for key in ("node-hours to run", "of which start-up"):
        total[key] = f"{float(total[key]) + hours:.1f}"
    longest = max(todo, key=lambda p: sched.pack_runtime_min(p), default=None)
    if longest is not None:
        total["longest job"] = f"{sched.pack_runtime_min(longest)} min asked (pack {longest.name})"
    return rows[:-1] + [row, total]


def pack_lines(sched: site_schedule.Schedule, members: bool = False) -> str:
    """The packs still to run, one line each, after a line that says what packing saves."""
    job = sched.job_startup_s
    todo = sched.to_run()
    rungs = sum(len(sched.todo(p)) for p in todo)
    saved = sum((len(sched.todo(p)) - 1) * p.nodes for p in todo) * job / 3600
    head = (f"{len(todo)} pack job(s) hold the {rungs} rung file(s) to run (site.pack: {sched.ladder.settings.site.pack}); one job "
            f"per rung would pay {rungs - len(todo)} more job start-ups of {job:.0f} s: {saved:.1f} node-hours more. The packs:")
    return "\n".join([head, *site_schedule.pack_table(sched, members)])


def _rung_line(e: cost.Estimate) -> str:
    step = "no step time" if math.isnan(e.step_s) else f"step {e.step_s:.3f} s"
    at = f"at batch {e.batch}" if e.batch is not None else "at the batch its search finds"
    return (f"{e.job_s / 60:.1f} min x {e.nodes} node(s) = {e.node_hours:.2f} node-h, {step} {at}, "
            f"start-up {e.startup_s:.0f} s ({e.startup_source}); {e.source}")


def job_line(args: argparse.Namespace, blocks: Sequence[tuple[str, Sequence[cost.Estimate]]], repo: Path,
             overrides: Mapping[str, Any], sched: site_schedule.Schedule | None = None) -> str:
    """What was priced, as jobs: the count ``snakemake -n`` shows for the rung rules (or the packs)
    with the same profile and config, and the ``select`` it applied."""
    raw = profile_config(repo, find_profile(args.profile, repo), getattr(args, "configfile", None), overrides)
    cfg_repeats = int(site_config.as_int(raw.get("repeats", 1)))  # validated already (estimates)
    packed = set(sched.packed) if sched else set()
    n = jobs(blocks, repo, cfg_repeats, packed)
    rungs = sum(len(ests) for _, ests in blocks)
    same = " ".join(["--profile", f"profiles/{Path(args.profile).name}"]
                    + (["--configfile", *args.configfile] if getattr(args, "configfile", None) else [])
                    + (["--config", *(repr(c) for c in args.config)] if getattr(args, "config", None) else []))
    if sched and sched.packs:
        todo = len(sched.to_run())
        line = (f"Priced {rungs} rung(s){' of the select' if overrides.get('select') else ''}: {todo + n.total()} batch job(s) to run "
                f"({todo} pack, {n['rung']} rung, {n['rung_max']} rung_max), the pack, rung and rung_max jobs of `snakemake -n {same}`")
    else:
        line = (f"Priced {rungs} rung(s){' of the select' if overrides.get('select') else ''}: {n.total()} rung job(s) to run "
                f"({n['rung']} rung, {n['rung_max']} rung_max), the rung and rung_max jobs of `snakemake -n {same}`")
    if cfg_repeats > 1:
        line += f"; repeats: {cfg_repeats} makes each rung that many jobs, and the node-hours above price one of each"
    return line + "."
