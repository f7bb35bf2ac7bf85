"""`scaleladder launch` / `finalize`: run a rung under a launcher, record OOM as a result.

Why a supervisor: when one rank of many runs out of memory, the others are
blocked inside a collective that rank will never join; nothing inside the job
can recover in step. So the OOM rank writes a marker and exits with code 3, the
launcher stops the rest (torchrun does on any worker failure; srun needs
``--kill-on-bad-exit=1``), and this supervisor — outside the ranks — turns the
markers into an HDF5 record with status ``oom`` and exits 0: the ladder goes on.

Anything else that fails leaves no result file and a non-zero exit, so
Snakemake marks the job failed and never mistakes it for a result.

``launch`` = run ``PREFIX run ARGS`` in a shell, then ``finalize``. A site whose
rule must call ``srun ... apptainer exec ... scaleladder run`` itself (the rule's
container would wrap the supervisor too) runs ``finalize --rc $?`` after it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from scaleladder.log import get_logger
from scaleladder.results.record import FAILED, MaxBatch, Placement, Plan, Spec, checked
from scaleladder.results.record import FailedAttempt as F
from scaleladder.rung.oom_record import EXIT_OOM, write_oom_record
from scaleladder.rung.run_config import RunConfig, add_arguments, config_from_args
from scaleladder.spec import SpecError, parse_positive

_log = get_logger(__name__)

def oom_markers(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f"{out.name}.oom-rank*.json"))


def _clear(out: Path) -> None:
    for m in oom_markers(out):
        m.unlink()


def stamp(path: Path) -> tuple[int, int] | None:
    """(inode, mtime) of ``path``, None when absent: tells a new result from the one before."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def failure_notes(out: Path) -> Path:
    """Where a rung's failed attempts are noted: ``results/failed/<spec>.h5.json`` for a result
    under ``results/rungs/``, else ``.failed/<name>.json`` beside it. Never among the results
    themselves, where every file is a finished result."""
    parts = out.parts
    if "rungs" in parts[:-1]:
        i = len(parts) - 1 - parts[::-1].index("rungs")
        return Path(*parts[:i], "failed", *parts[i + 1:-1], f"{out.name}.json")
    return out.parent / ".failed" / f"{out.name}.json"


def note_failure(cfg: RunConfig, rc: int) -> None:
    """Append this failed attempt (when, exit code, the one-line reason) to the rung's notes
    (:func:`failure_notes`).

    The failure is not a result: no rung file is written, so the next `snakemake` runs the rung
    again. The notes stay as history: the report lists every failed attempt of a ladder's rungs
    ("Failed attempts", figures/report.py), redone or not. A note that cannot be written costs
    nothing but the note (the exit code and the log line are the failure's record)."""
    import datetime
    import signal

    try:
        why = f"killed by {signal.Signals(rc - 128).name}" if rc > 128 else f"exit code {rc}"
    except ValueError:
        why = f"exit code {rc}"
    path = failure_notes(cfg.out)
    try:
        notes = json.loads(path.read_text()) if path.is_file() else []
    except (OSError, ValueError):
        notes = []
    notes.append(checked({Spec.spec: cfg.spec.path, F.when: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                          F.rc: rc, F.reason: f"the run failed ({why}); no result written (its log names the cause)"}, FAILED))
    try:
        from scaleladder.files import atomic_write_text

        atomic_write_text(path, json.dumps(notes, indent=1))
    except Exception as e:  # the disk that failed the rung may refuse the note too
        _log.warning(f"scaleladder: {cfg.spec.path}: could not note the failure in {path}: {e}")


def finalize(cfg: RunConfig, rc: int, world: int | None = None, previous: tuple[int, int] | None = None) -> int:
    """Decide what a finished launch produced. Returns the supervisor's exit code.

    ``previous``: the stamp of a result that was there before the launch (a rerun): it is not
    this launch's, so it counts as nothing written and is never deleted on a failure (the
    workflow keeps it, rung rules' update(): a failed rerun must not cost the good result)."""
    markers = oom_markers(cfg.out)
    old = previous is not None and stamp(cfg.out) == previous
    try:
        if markers:
            events = [json.loads(m.read_text()) for m in markers]
            cfg.out.unlink(missing_ok=True)  # a rank may have OOMed after rank 0 wrote: the OOM wins
            write_oom_record(cfg, events, world or int(events[0].get("world", len(events))))
            print(f"scaleladder: {cfg.spec.path}: out of memory on rank(s) {[e['rank'] for e in events]}; recorded as 'oom'", file=sys.stderr)
            return 0
        if rc == 0 and cfg.out.is_file() and not old:
            return 0
        if rc == 0:
            print(f"scaleladder: {cfg.spec.path}: the launcher exited 0 but wrote no {'new ' if old else ''}{cfg.out}",
                  file=sys.stderr)
            return 1
        if not old:
            cfg.out.unlink(missing_ok=True)  # never leave a result from a failed launch
        print(f"scaleladder: {cfg.spec.path}: the run failed with exit code {rc}; no result written", file=sys.stderr)
        note_failure(cfg, rc)
        return rc if rc not in (0, EXIT_OOM) else 1
    finally:
        _clear(cfg.out)


def predicted_oom(cfg: RunConfig, device_key: str, ranks_per_node: int) -> dict[str, Any] | None:
    """The planner's verdict as record attributes when it predicts the rung cannot run,
    else None. A fixed batch cannot run when it does not fit; a ``max`` rung, when not
    even batch 1 does. The workflow makes the same call (same arguments) while it builds
    its DAG, so the two never disagree about which rungs are skipped. A models-file model
    (``plan_trace.traced_model``) by its trace: the cached one the DAG read, else traced here."""
    from scaleladder.campaign.plan_trace import traced_model
    from scaleladder.flavors import get_flavor
    from scaleladder.planner.memory import predict
    from scaleladder.planner.step_setup import Variant

    if cfg.spec.strategy.compile:
        return None  # a compiled rung's memory is planned as its eager rung's, an upper bound: no verdict, run it (workflow.planned_not_to_fit says the same)
    world = cfg.spec.nodes * ranks_per_node
    if traced_model(get_flavor(cfg.spec.model)):
        # a models-file model: its trace (the cache's, else traced now: torch is loaded in a job anyway),
        # the one the workflow's DAG read when it routed the rung here
        from scaleladder.campaign.plan_trace import predict as predict_traced

        # plan_trace.Untraceable (FSDP1 on several ranks) goes to the caller: no verdict, which is not "fits"
        p = predict_traced(cfg.spec, world, ranks_per_node, device_key, data=cfg.data, flava_impl=cfg.flava_impl).prediction
    else:
        p = predict(cfg.spec, world, ranks_per_node, device_key, data=cfg.data, variant=Variant(flava_impl=cfg.flava_impl))
    if p.fits:
        return None
    # Every planner device is a GPU, one rank each.
    extra: dict[str, Any] = {Plan.predicted_peak_gib: p.peak_bytes / 2**30, Plan.predicted_required_gib: p.required_bytes / 2**30,
                             Plan.plan_device: device_key, Placement.gpus_per_node: ranks_per_node}
    if cfg.spec.batch == "max":
        extra |= {MaxBatch.max_batch: 0, MaxBatch.maxbatch_probes: 0}
    return extra


def record_predicted_oom(cfg: RunConfig, device_key: str, ranks_per_node: int, prog: str) -> bool:
    """Write a 'predicted-oom' record when the planner says the rung cannot run."""
    verdict = predicted_oom(cfg, device_key, ranks_per_node)
    if verdict is None:
        return False
    write_oom_record(cfg, [], cfg.spec.nodes * ranks_per_node, status="predicted-oom", extra=verdict)
    print(f"scaleladder {prog}: {cfg.spec.path}: predicted not to fit on {device_key} "
          f"(needs {verdict[Plan.predicted_required_gib]:.1f} GiB); recorded as 'predicted-oom'", file=sys.stderr)
    return True


def add_launch_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument("--launcher", default="", help="command prefix that starts the ranks and ends with the program, e.g. "
                   "'torchrun --standalone --nproc-per-node 2 -m scaleladder' (empty: one local process)")
    p.add_argument("--plan-device", default="", help="planner device key; when set, a rung predicted not to fit is recorded as "
                   "'predicted-oom' without running (needs --ranks-per-node)")
    p.add_argument("--ranks-per-node", default=None, help="ranks the launcher starts per node: lets launch check the world "
                   "(e.g. a hybrid group that does not divide it) before starting any rank; required with --plan-device")
    p.add_argument("--run-predicted-oom", action="store_true", help="run rungs the planner predicts will not fit anyway")
    p.add_argument("--plan-only", action="store_true", help="with --plan-device: record the planner's 'predicted-oom' verdict "
                   "and start nothing; a rung predicted to fit is an error (the workflow's DAG said it would not)")


def add_finalize_arguments(p: argparse.ArgumentParser) -> None:
    add_arguments(p)
    p.add_argument("--rc", type=int, required=True, help="exit code of the launcher that ran `scaleladder run`")


def run_command(cfg: RunConfig, launcher: str, **override: Any) -> list[str] | str:
    """The command that runs the ranks: argv for one local process, or a shell line."""
    run_args = cfg.argv(**override)
    if not launcher.strip():
        return [sys.executable, "-m", "scaleladder", "run", *run_args]
    return f"{launcher} run {shlex.join(run_args)}"


def launch(cfg: RunConfig, launcher: str) -> int:
    from scaleladder.results.store import check_writable, record_bytes

    check_writable(cfg.out, record_bytes(cfg.steps))  # a read-only or full results/: one line, no rank started
    _clear(cfg.out)  # stale markers from an earlier, killed attempt must not turn this run into an OOM
    previous = stamp(cfg.out)
    cmd = run_command(cfg, launcher)
    _log.info(f"scaleladder launch: {cmd if isinstance(cmd, str) else shlex.join(cmd)}")
    rc = subprocess.call(cmd, shell=isinstance(cmd, str))
    return finalize(cfg, rc, previous=previous)


def launch_main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.plan_only and not args.plan_device:
        raise SpecError("--plan-only needs --plan-device")
    if cfg.spec.batch == "max" and not args.plan_only:
        raise SpecError("batch 'max' is searched by `scaleladder maxbatch`, not `launch`")
    if args.plan_device and args.ranks_per_node is None:
        # The planner's verdict depends on it (hybrid groups, per-node memory): never assume 1.
        raise SpecError(f"--plan-device {args.plan_device} needs --ranks-per-node")
    rpn = None if args.ranks_per_node is None else parse_positive("ranks-per-node", args.ranks_per_node)
    if rpn is None and not args.launcher.strip():
        rpn = 1  # no launcher: one local process
    if rpn is not None:
        # Under a launcher a world-size fault would surface once per rank, as a launcher
        # traceback; known here, it is one line and exit 2 before any rank starts.
        cfg.spec.strategy.check_world(cfg.spec.nodes * rpn)
    if args.plan_only and cfg.spec.strategy.compile:
        raise SpecError(f"{cfg.spec.path}: the planner gives a compiled rung only an upper bound (its eager memory), so --plan-only has no verdict to "
                        "record; a compiled rung is always run (its OOM is its result)")
    if rpn is not None and args.plan_device and (args.plan_only or not args.run_predicted_oom):
        from scaleladder.campaign.plan_trace import Untraceable

        try:
            if record_predicted_oom(cfg, args.plan_device, rpn, "launch"):
                return 0
        except Untraceable as e:  # a models-file rung the fake tensors cannot trace: the planner has no verdict
            if args.plan_only:
                raise SpecError(f"{e}: the planner has no verdict to record (the workflow's DAG does not route such a rung here)") from None
            print(f"scaleladder launch: {e}: no verdict of the planner, so the rung runs", file=sys.stderr)
        if args.plan_only:
            raise SpecError(f"{cfg.spec.path} is predicted to fit on {args.plan_device} with {rpn} ranks per node; "
                            "--plan-only records only rungs that are not (is the planner here the one that built the DAG?)")
    return launch(cfg, args.launcher)


def finalize_main(args: argparse.Namespace) -> int:
    return finalize(config_from_args(args), args.rc)
