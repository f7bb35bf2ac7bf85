"""The check's run: the time budget and its shares, one fresh subprocess per command, the sections in order."""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import figures, host, machine, report, sections
from .config import ALL_SECTIONS, CPU, FSDP2_KNOBS, FULL, GPU, HOST_SECTION, HOST_SHARE, KNOBS, PRECISION, SECTIONS, SHARES, SMOKE
from .rows import Command, RungResult, describe, judge, seconds_str


class BudgetSpent(Exception):
    pass


class Check:
    """One `make gpu-check`: what it ran so far (``commands``, ``rungs`` and the sections' rows),
    the clock and the budget. The sections (``sections``), the figures and the report read and
    fill it; ``probe_env`` and ``draw`` are methods so that a test can replace them."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.device: str = args.device
        self.profile = GPU if self.device == "cuda" else CPU
        self.sel = SMOKE if args.smoke else FULL
        self.out = Path(args.out)
        self.rungs_dir = self.out / "rungs"
        self.logs = self.out / "logs"
        self.budget_s: float = float(args.budget_min) * 60
        self.clock = time.monotonic  # a test drives a simulated clock through this
        self.t0 = self.clock()
        self.section_end: float = math.inf  # when the running section's share is spent (elapsed seconds)
        self.section_name = ""
        self.section_took: list[float] = []  # the running section's commands' durations
        self.commands: list[Command] = []
        self.rungs: list[RungResult] = []
        self.section_s: dict[str, float] = {}
        self.notes: dict[str, list[str]] = {}
        self.harness: list[dict[str, Any]] = []
        self.loader: dict[str, Any] = {}
        self.planner: list[dict[str, Any]] = []
        self.figures: list[tuple[str, str]] = []  # (file, caption)
        self.env_info: dict[str, Any] = {}
        self.crashed: list[str] = []
        self.child_env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.device == "cpu":
            # bench_rung.py has no --device: it takes the GPU when it sees one. Hide it.
            self.child_env.update(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
        self.plan_args: list[str] = ["--device", "cpu"]
        self.plan_key: str | None = "cpu"

    def probe_env(self) -> None:
        machine.probe_env(self)

    def draw(self) -> None:
        figures.draw(self)

    # -- time ---------------------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def remaining(self) -> float:
        return self.budget_s - self.elapsed()

    def section_remaining(self) -> float:
        """What the running section's share has left (never more than the whole budget's)."""
        return min(self.remaining(), self.section_end - self.elapsed())

    def open_section(self, name: str, later: list[str]) -> None:
        """Give section ``name`` its share of what is left: (time left) × its share / (the shares
        of it and of the sections ``later`` still to run)."""
        shares = {**SHARES, HOST_SECTION: HOST_SHARE}
        owed = shares.get(name, 0.0) + sum(shares.get(n, 0.0) for n in later)
        share = shares.get(name, 0.0) / owed if owed > 0 else 1.0
        self.section_name = name
        self.section_end = self.elapsed() + max(0.0, self.remaining()) * share
        self.section_took = []

    def guard(self, section: str, what: str) -> None:
        """Raise BudgetSpent (with a note) when the budget, or this section's share of it, is spent:
        nothing new starts in the section after it."""
        if self.remaining() <= 0:
            self.note(section, f"skipped from {what} on: the time budget ({self.args.budget_min:g} min) was spent "
                               f"after {seconds_str(self.elapsed())}")
            raise BudgetSpent
        if section == self.section_name:
            # A command that would not fit in what the share has left is not started: the section's
            # commands so far say how long one takes (their median), so a section overruns its
            # share by at most the misjudgement, not by a whole command taken from the next one.
            took = sorted(self.section_took)
            typical = took[(len(took) - 1) // 2] if took else 0.0  # the lower median
            if self.section_remaining() <= 0 or self.section_remaining() < typical:
                self.note(section, f"skipped from {what} on: the section's share of the budget was spent after "
                                   f"{seconds_str(self.elapsed())} (its commands take ~{typical:.0f} s; the sections "
                                   "after it are owed theirs)")
                raise BudgetSpent

    def limit(self, cap: float = 600.0) -> float:
        """A command's time limit: what the whole budget has left, but at least 60 s, at most ``cap``.

        Not the section's share: a command the share let start (guard) is let finish, since killing
        it wastes what it already ran (on the CPU an inductor compile of flava-debug, started with a
        minute of its share left, was killed at 64 s). A share overrun is bounded by the guard's
        median rule, and the sections after it get their shares of what is then left."""
        return min(cap, max(60.0, self.remaining()))

    def note(self, section: str, text: str) -> None:
        self.notes.setdefault(section, []).append(text)
        print(f"gpu-check: [{section}] {text}", flush=True)

    # -- subprocesses -----------------------------------------------------------------------------------

    def sh(self, name: str, argv: list[str], timeout: float) -> Command:
        """Run one command in its own session, output to its log; kill its whole group at ``timeout``.

        Its own session, so a command killed at its limit takes its children along
        (maxbatch's probes, the loader's workers) and nothing else.
        """
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{len(self.commands) + 1:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}.log"
        t0 = self.clock()
        rc: int | None
        with open(log, "w") as fh:
            fh.write("$ " + shlex.join(argv) + "\n")
            fh.flush()
            p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=self.child_env, start_new_session=True)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(p)
                rc = None
                fh.write(f"\ngpu-check: killed at its time limit of {timeout:.0f} s\n")
            except BaseException:  # Ctrl-C: take the command's processes down with us
                _kill_group(p)
                raise
        cmd = Command(name, argv, rc, self.clock() - t0, log)
        self.commands.append(cmd)
        if self.section_name and not name.startswith("plan"):  # the planner's answers are seconds
            self.section_took.append(cmd.seconds)
        return cmd

    def scaleladder(self, *args: str) -> list[str]:
        # `python -m` with THIS interpreter: with the wheels installed by --target there is
        # no `scaleladder` script on the PATH, only the package on PYTHONPATH.
        return [sys.executable, "-m", "scaleladder", *args]

    def spec(self, role: str, strategy: str, precision: str = PRECISION, batch: int | str | None = None) -> str:
        b = self.profile.batches[role] if batch is None else batch
        knobs = FSDP2_KNOBS if strategy.startswith("fsdp2-") else KNOBS
        return f"{self.profile.flavors[role]}/{strategy}/{precision}/{knobs}/n1/b{b}"

    def rung_file(self, section: str, spec: str, tag: str = "") -> Path:
        return self.rungs_dir / f"{section}{tag}--{spec.replace('/', '--')}.h5"

    def run_rung(self, section: str, role: str, spec: str, extra: list[str] | None = None, tag: str = "",
                 steps: int | None = None, warmup: int | None = None) -> RungResult:
        out = self.rung_file(section, spec, tag)
        out.unlink(missing_ok=True)  # a stale file from an earlier check must never pass for this one's result
        argv = self.scaleladder("run", "--spec", spec, "--steps", str(steps or self.profile.steps),
                                "--warmup", str(warmup or self.profile.warmup), "--device", self.device,
                                "--out", str(out), *(extra or []))
        cmd = self.sh(f"{section}{tag} {spec}", argv, self.limit(300))
        rung = judge(section, role, spec, cmd, out)
        self.rungs.append(rung)
        print(f"gpu-check: [{section}] {spec}{tag}: {describe(rung)} ({cmd.seconds:.1f} s)", flush=True)
        return rung

    # -- driver ------------------------------------------------------------------------------------------

    def timed(self, name: str, fn: Callable[[], None]) -> None:
        t0 = self.clock()
        print(f"gpu-check: == {name} (at {seconds_str(self.elapsed())})", flush=True)
        try:
            fn()
        except BudgetSpent:
            pass
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug here must not cost the other sections or the report
            self.note(name, f"the section failed: {type(e).__name__}: {e}")
            self.crashed.append(name)
        self.section_s[name] = self.section_s.get(name, 0.0) + self.clock() - t0
        self.section_name, self.section_end = "", math.inf
        print(f"gpu-check: == {name} took {seconds_str(self.section_s[name])}", flush=True)

    def measure(self, work: Path) -> None:
        """The measuring sections asked for (``--sections``), each with its share of what is left."""
        wanted = set(self.args.sections.split(",")) if self.args.sections else set(SECTIONS)
        plan: tuple[tuple[str, Callable[[], None]], ...] = (
            ("strategies", lambda: sections.strategies(self)), ("harness", lambda: sections.harness(self)),
            ("loader", lambda: sections.loader(self, work)), ("precision", lambda: sections.precision(self)),
            ("maxbatch", lambda: sections.maxbatch(self)), (HOST_SECTION, lambda: host.run(self)))
        for k, (name, fn) in enumerate(plan):
            if name not in wanted:
                if name == HOST_SECTION:  # opt-in: not a row of every report
                    continue
                self.notes.setdefault(name, []).append("not asked for (--sections)")
                self.section_s[name] = 0.0
                continue
            if self.remaining() <= 0:
                self.section_s[name] = 0.0
                self.note(name, f"skipped: the time budget ({self.args.budget_min:g} min) was spent "
                                f"after {seconds_str(self.elapsed())}")
                continue
            self.open_section(name, [n for n, _ in plan[k + 1:] if n in wanted])
            self.timed(name, fn)

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.rungs_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.logs, ignore_errors=True)  # logs of an earlier check would be misread as this one's
        self.timed("environment", self.probe_env)
        if "pythonpath" not in self.env_info and os.environ.get("PYTHONPATH"):
            self.env_info["pythonpath"] = os.environ["PYTHONPATH"]
        status = "complete"
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
            try:
                self.measure(Path(work))
            except KeyboardInterrupt:
                status = "INTERRUPTED: partial results"
        # Always: they only read what ran, and cost seconds.
        self.timed("planner", lambda: sections.planner(self))
        self.timed("figures", self.draw)
        if self.crashed:
            status = f"INCOMPLETE: section(s) {', '.join(self.crashed)} failed (see the notes)" if status == "complete" else status
        md = report.write(self, status)
        print("gpu-check: time per section: " + ", ".join(f"{k} {seconds_str(v)}" for k, v in self.section_s.items())
              + f"; total {seconds_str(self.elapsed())}", flush=True)
        print(f"gpu-check: {status} -> {md}", flush=True)
        return 130 if status.startswith("INTERRUPTED") else (1 if self.crashed else 0)


def _kill_group(p: subprocess.Popen[Any]) -> None:
    """SIGTERM to the command's own process group (the runner cleans up its temporary files on it),
    then SIGKILL whatever is left after 15 s."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def parse_args(argv: list[str] | None = None, description: str = "") -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: one NVIDIA or AMD GPU (ROCm's torch calls it cuda too); cpu: the debug flavors, to test the path")
    ap.add_argument("--out", default="results/gpu-check", help="output folder (default results/gpu-check)")
    ap.add_argument("--smoke", action="store_true", help="every section, fewest rungs (the test's CPU run)")
    ap.add_argument("--budget-min", type=float, default=18.0,
                    help="minutes after which nothing new starts; the rest is skipped with a note (default 18)")
    ap.add_argument("--sections", default="", help=f"comma-separated subset of {','.join(ALL_SECTIONS)} (default: all but "
                                                   f"{HOST_SECTION}); the planner comparison and the report always run")
    a = ap.parse_args(argv)
    unknown = set(filter(None, a.sections.split(","))) - set(ALL_SECTIONS)
    if unknown:
        ap.error(f"--sections: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(ALL_SECTIONS)}")
    if not a.budget_min >= 0:
        ap.error("--budget-min must be >= 0")
    return a
