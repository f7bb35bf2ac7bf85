"""`scaleladder pack`: a pack's rungs, one after another, inside the one batch job that holds them.

The workflow submits one job per pack (``site.pack``, campaign/packing.py); this supervisor runs
in it and runs each rung still missing as its own inner ``snakemake <rung file>`` on the local
executor (``--nolock``: the workflow's own Snakemake holds the lock), under a timeout of its own.
So each rung is exactly the rung rule's job: its command line, its record written atomically by
the rung itself, and Snakemake's metadata for the file (rule, command, parameters), so a later run
with packing off or on sees nothing changed and runs no finished rung again. Why not Snakemake's
group jobs: docs/workflow.md, "Packs".

Nothing lost:

* a rung that fails, runs out of memory (an ``oom`` record is a result) or hangs costs only
  itself: its inner Snakemake is ended at the rung's own timeout, or 30 s before the allocation's
  end (SIGTERM to its process group, which holds the rung's shell and its srun, then SIGKILL,
  then ``scancel`` of the job's steps still running), noted in ``results/failed/`` as the rung's
  failed attempt, and the pack goes on;
* a rung the allocation has too little time left for (its prediction) is not started;
* when the allocation ends anyway (Slurm's time limit, ``scancel``, a node failure: SIGTERM), the
  running rung is noted first and then stopped, every finished rung keeps its record, and the
  rest is left for the rerun;
* the driver's record goes to its log either way: Slurm's submit and start times, its own
  start, each rung's start, end and status (benchmarks/bench_pack_startup.py reads it);
* the pack's record (``--out``, the workflow's checkpoint) is written only when every rung has a
  result; otherwise exit 1 with one line naming what is missing, so the next `snakemake` runs
  the pack again for just those rungs.

Bad input, one line and exit 2: no batch job here (no ``SLURM_JOB_ID``: packing needs a batch
system), and a pack whose rungs' predictions add up past ``--limit-min``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from scaleladder.errors import SpecError
from scaleladder.files import atomic_write_text
from scaleladder.log import get_logger

_log = get_logger(__name__)

#: What a rung needs left of the allocation beyond its prediction to be started, and the time a
#: stopped rung's Snakemake has to end before SIGKILL.
GRACE_S = 30.0


@dataclass
class Rung:
    """A member of the pack: its result file, its own timeout and its predicted time."""

    file: str
    timeout_s: float
    predicted_s: float
    status: str = "to run"
    started: float | None = None  # epoch seconds: its inner Snakemake's start and end (None: not started)
    ended: float | None = None


def parse_rung(text: str) -> Rung:
    """``FILE=TIMEOUT_S:PREDICTED_S`` (what the workflow's pack rule passes)."""
    try:
        file, times = text.rsplit("=", 1)
        timeout, predicted = (float(x) for x in times.split(":"))
    except ValueError:
        raise SpecError(f"--rung {text!r}: expected FILE=TIMEOUT_S:PREDICTED_S") from None
    if not file or not (timeout > 0 and predicted >= 0 and math.isfinite(timeout + predicted)):
        raise SpecError(f"--rung {text!r}: expected a file, a timeout > 0 s and a prediction >= 0 s")
    return Rung(file, timeout, predicted)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pack", required=True, help="the pack's name (n<nodes>-p<k>)")
    p.add_argument("--rung", action="append", required=True, metavar="FILE=TIMEOUT_S:PREDICTED_S",
                   help="a rung's result file, its own timeout and its predicted time, in the order to run them")
    p.add_argument("--limit-min", type=float, required=True, help="the batch job's time limit, minutes (what the pack asked for)")
    p.add_argument("--out", required=True, help="the pack's record, written when every rung has a result")
    p.add_argument("snakemake", nargs=argparse.REMAINDER,
                   help="after --: the inner Snakemake's options (its Snakefile, config files, --config), the rung's file appended")


class _Ended(Exception):
    """The allocation is ending (SIGTERM from Slurm)."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Ended(signal.Signals(signum).name)


def job_times(limit_s: float, started: float) -> tuple[float, float, float]:
    """When this batch job was submitted, when it started and when it ends (epoch seconds), from
    Slurm (``squeue``, to the second); where Slurm does not say, the driver's own start for the first
    two and the limit from it for the end."""
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        try:
            out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%V %S %e"], capture_output=True, text=True, timeout=30)
            submitted, start, end = (datetime.datetime.fromisoformat(t).timestamp() for t in out.stdout.split())
            return submitted, start, end
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
    return started, started, started + limit_s


def run_rung(argv: list[str], timeout_s: float, env: dict[str, str], why_timeout: str,
             on_end: Callable[[str], None]) -> tuple[int, str]:
    """The rung's inner Snakemake under its timeout: (exit code, '' or ``why_timeout`` where it was
    stopped there). When the allocation ends meanwhile (SIGTERM), ``on_end(why)`` notes it FIRST
    (Slurm's KillWait, 30 s by default, is all the time left), then the rung is stopped and
    :class:`_Ended` raised again."""
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s), ""
    except subprocess.TimeoutExpired:
        _stop(proc)
        return proc.returncode, why_timeout
    except _Ended as e:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one ending is enough
        why = f"stopped: the allocation is ending ({e})"
        on_end(why)
        _stop(proc)
        raise _Ended(why) from None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the rung's process group (its Snakemake, shell and srun), SIGKILL after GRACE_S;
    then every job step still running is cancelled. TRAP: a hung rank (a collective that never
    returns) is slurmstepd's child, not ours: killing srun can leave its step holding the
    allocation's CPUs and GPUs, and the next rung's srun would wait for them."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    cancel_steps()


def cancel_steps() -> None:
    """``scancel`` every step of this job but its batch script and the extern step (ours is the batch)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return
    try:
        out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True, text=True, timeout=30)
        steps = [s for s in out.stdout.split() if s.split(".")[-1].isdigit()]
        if steps:
            subprocess.run(["scancel", "--signal=KILL", *steps], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        _log.warning(f"scaleladder pack: could not cancel the stopped rung's job steps: {e}")


def note_stopped(file: str, why: str, pack: str) -> None:
    """The stopped rung's failed attempt, beside those `finalize` notes (campaign/supervise.failure_notes)."""
    from scaleladder.campaign.supervise import failure_notes
    from scaleladder.results.record import FAILED, Spec, checked
    from scaleladder.results.record import FailedAttempt as F

    path = failure_notes(Path(file))
    spec = file.split("results/rungs/", 1)[-1].removesuffix(".h5")
    try:
        notes = json.loads(path.read_text()) if path.is_file() else []
        notes.append(checked({Spec.spec: spec, F.when: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              F.rc: -int(signal.SIGTERM), F.reason: f"{why} in pack {pack}; no result written"}, FAILED))
        atomic_write_text(path, json.dumps(notes, indent=1))
    except Exception as e:  # the note is history; the rung's missing result is what counts
        _log.warning(f"scaleladder pack: {file}: could not note the stop in {path}: {e}")


def check(args: argparse.Namespace, rungs: list[Rung]) -> list[str]:
    """Bad input before any rung starts; returns the inner Snakemake's options."""
    if not os.environ.get("SLURM_JOB_ID"):
        raise SpecError(f"pack {args.pack}: no batch job here (no SLURM_JOB_ID): packing needs a batch system; "
                        "run the pack through the workflow on a site with one (site.time_limit_min)")
    if not (args.limit_min > 0 and math.isfinite(args.limit_min)):
        raise SpecError(f"--limit-min {args.limit_min}: expected minutes > 0")
    total = sum(r.predicted_s for r in rungs)
    if total > args.limit_min * 60:
        raise SpecError(f"pack {args.pack}: its {len(rungs)} rungs are predicted at {total / 60:.0f} min, past the "
                        f"job's {args.limit_min:.0f} min limit: too large a pack")
    inner = args.snakemake[1:] if args.snakemake[:1] == ["--"] else list(args.snakemake)
    if not inner:
        raise SpecError("no inner Snakemake options after --")
    return inner


def main(args: argparse.Namespace) -> int:
    started = time.time()
    rungs = [parse_rung(r) for r in args.rung]
    inner = check(args, rungs)
    submitted, job_started, ends = job_times(args.limit_min * 60, started)
    env = dict(os.environ, SCALELADDER_PACK=args.pack)
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        for r in rungs:
            _run_one(r, inner, ends, env, args.pack)
    except _Ended as e:
        print(f"scaleladder pack: {args.pack}: {e}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _finish(args, rungs, (submitted, job_started, started))


def _run_one(r: Rung, inner: list[str], ends: float, env: dict[str, str], pack: str) -> None:
    if Path(r.file).is_file():
        r.status = "recorded already"
        return
    left = ends - time.time()
    if left < r.predicted_s + GRACE_S:
        r.status = f"not started: {left:.0f} s left of the allocation, predicted {r.predicted_s:.0f} s"
        print(f"scaleladder pack: {pack}: {r.file}: {r.status}", file=sys.stderr)
        return
    # its own timeout, or the allocation's end less GRACE_S, whichever comes first: a rung stopped by
    # us leaves its note; one that Slurm kills might not
    timeout = min(r.timeout_s, left - GRACE_S)
    why = (f"stopped at its timeout, {timeout:.0f} s" if timeout == r.timeout_s else
           f"stopped {GRACE_S:.0f} s before the allocation ends, after {timeout:.0f} s")
    argv = [sys.executable, "-m", "snakemake", r.file, *inner]
    print(f"scaleladder pack: {pack}: {r.file} (timeout {timeout:.0f} s, predicted {r.predicted_s:.0f} s): "
          f"{shlex.join(argv)}", file=sys.stderr, flush=True)
    r.started = time.time()
    try:
        rc, stopped = run_rung(argv, timeout, env, why, lambda w: note_stopped(r.file, w, pack))
    except _Ended as e:
        r.status, r.ended = str(e), time.time()
        raise
    r.ended = time.time()
    if stopped:
        note_stopped(r.file, stopped, pack)
    r.status = ("recorded" if Path(r.file).is_file() else stopped or f"failed (exit code {rc})")
    print(f"scaleladder pack: {pack}: {r.file}: {r.status} in {r.ended - r.started:.0f} s", file=sys.stderr, flush=True)


#: The line that opens the driver's record in its log (``_finish`` prints it with ``indent=1``).
RECORD_START = '{\n "pack"'


def last_record(log_text: str) -> dict[str, object]:
    """The last record a driver printed into ``log_text`` (its pack's log): what the tests and
    benchmarks/bench_pack_startup.py read. ValueError where there is none."""
    start = log_text.rindex("\n" + RECORD_START) + 1 if not log_text.startswith(RECORD_START) else 0
    record: dict[str, object] = json.loads(log_text[start:log_text.index("\n}", start) + 2])
    return record


def _finish(args: argparse.Namespace, rungs: list[Rung], times: tuple[float, float, float]) -> int:
    """The pack's record when every rung has a result; else one line naming what is missing, exit 1.
    Either way the record goes to the log: it times the job's own start-up (Slurm's start to the
    driver's) and each rung's, inner Snakemake included (benchmarks/bench_pack_startup.py)."""
    missing = [r for r in rungs if not Path(r.file).is_file()]
    record = {"pack": args.pack, "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "job_submitted": times[0],
              "job_started": times[1], "driver_started": times[2], "ended": time.time(),
              "rungs": [{"file": r.file, "status": r.status, "started": r.started, "ended": r.ended, "timeout_s": r.timeout_s,
                         "predicted_s": r.predicted_s} for r in rungs]}
    print(json.dumps(record, indent=1), file=sys.stderr)
    if missing:
        print(f"scaleladder pack: error: pack {args.pack}: {len(rungs) - len(missing)} of {len(rungs)} rung(s) recorded; "
              "no result: " + "; ".join(f"{r.file} ({r.status})" for r in missing), file=sys.stderr)
        return 1
    atomic_write_text(Path(args.out), json.dumps(record, indent=1))
    return 0
