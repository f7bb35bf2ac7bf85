"""`make gpu-check`: every GPU figure the issues ask for, from ONE GPU, in one command.

    python3 benchmarks/gpu_check.py --device cuda --out results/gpu-check     # one NVIDIA or AMD GPU
    python3 benchmarks/gpu_check.py --device cpu --smoke --out /tmp/gc        # the same path on a CPU (the test)

It drives the real command-line programs as subprocesses — ``scaleladder run``,
``maxbatch``, ``plan``, ``shard`` and ``benchmarks/bench_rung.py`` — ONE FRESH PROCESS
PER RUNG, so every rung starts with a clean allocator (a rung after an OOM in the same
process would measure a fragmented or poisoned cache), and measures:

* strategies: every strategy that is distinct on one rank (single, ddp, fsdp-full,
  fsdp2-full, each with and without activation checkpointing, and single-compile) for
  vit-base, vit-huge and flava-350m in bf16-mixed at a fixed batch (fsdp-grad-op and
  fsdp-no-shard are not run: FSDP1 at world size 1 runs them as NO_SHARD, like fsdp-full;
  every row names the sharding that ran, read from the wrapped model);
* harness/bare step time (bench_rung.py);
* loader-fed against synthetic throughput for vit-base (shards written by ``shard``);
* fp32 / tf32 / bf16-mixed / fp16-mixed for vit-base ``single``;
* ``maxbatch`` for the three models under ddp, fsdp-full and fsdp-full-ac, capped;
* the planner's predicted peak against the measured one, for every rung that ran.

Output (``--out``, default results/gpu-check/): ``gpu-check.md`` (tables in the style of
docs/performance.md, with the machine, versions, commit, date and the exact commands),
``gpu-check.json`` (the same numbers for programs), ``rungs/*.h5`` (the raw rung files),
``*.png`` figures (when matplotlib imports) and ``logs/`` (one log per command).

Targets are REPORTED as measured, never asserted: a GPU check that fails its targets is
a result, and so is a rung that runs out of memory (a row saying ``oom``).

Time: each section's elapsed time is printed and recorded. Each measuring section gets a
share of the budget (``--budget-min``, default 18; :data:`SHARES`): at its start, the time
left times its share over the shares still owed, so a section may use what earlier ones
left but never what later ones are owed, and every section starts. Within its share a
section runs its key rows first (:data:`RUN_ORDER`; every model's ddp max-batch search
first), starts no command its share cannot hold (judged by the median of its commands so
far), and lets a started command run to the whole budget's end (at least 60 s; max-batch
searches get their round's share of the section). Once the whole budget is
spent nothing new starts, so the whole check overruns by a minute at most. Each rung's
start-up (process start to its first step, ``startup_s`` in its record) is shown apart from
its wall time. tests/test_gpu_check.py runs the full GPU selection on a simulated clock at
an assumed 20 s start-up per rung and shows every section starting.
The planner comparison and the report are always written: they only read what ran.

On the CPU (``--device cpu``) the flavors are the debug ones (vit-base and vit-huge ->
vit-debug at two batches, flava-350m -> flava-debug) with tiny batches and steps: the
numbers mean nothing, the path is the GPU one. ``--smoke`` keeps every section with
fewer rungs (what tests/test_gpu_check.py runs).

This file imports no torch: the GPU must belong to the rung processes alone (a CUDA
context in this driver would take memory from every rung and from the max-batch search).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_RUNG = Path(__file__).resolve().parent / "bench_rung.py"

ROLES = ("vit-base", "vit-huge", "flava-350m")  # the models the issue names; "role" = the GPU flavor a row stands for
STRATEGIES = ("single", "single-ac", "ddp", "ddp-ac", "fsdp-full", "fsdp-full-ac",
              # FSDP2 beside FSDP1, and one compiled rung (issue 12); the planner does not
              # model compile, so its planner row says so
              "fsdp2-full", "fsdp2-full-ac", "single-compile")
# TRAP (torch FSDP1, _init_utils._init_core_state): at world size 1 FSDP1 replaces FULL_SHARD
# and SHARD_GRAD_OP by NO_SHARD with a warning only, so on one GPU fsdp-grad-op* and
# fsdp-no-shard* would measure fsdp-full*'s strategy again under other names (issue 22).
# They are not run; fsdp-full* stands for all three, and every record says what ran
# (`sharding_ran`, read from the wrapped model). Rows that still ran the same strategy are
# marked (Check.same_as) and left out of the AC-cost and planner targets.
ONE_RANK_SAME = {"fsdp-grad-op": "fsdp-full", "fsdp-grad-op-ac": "fsdp-full-ac",
                 "fsdp-no-shard": "fsdp-full", "fsdp-no-shard-ac": "fsdp-full-ac"}
MAXBATCH_STRATEGIES = ("ddp", "fsdp-full", "fsdp-full-ac")
# The order the strategies section runs them (issue 22): the rows the targets and the other
# sections lean on first, for every model (the AC pair, FSDP's pair), the inductor compile last.
RUN_ORDER = ("single", "single-ac", "fsdp-full", "fsdp-full-ac", "ddp", "ddp-ac", "fsdp2-full", "fsdp2-full-ac",
             "single-compile")
# Each measuring section's share of the budget (issue 22). A section may use what the sections
# before it left unused, never what the ones after it are owed: at a section's start it gets
# (time left) x its share / (the shares of it and the sections after it). Without shares, the
# strategies section's 27 fresh processes (3 inductor compiles) could fill an 18-minute budget
# at a GPU's start-up cost and skip max-batch, which the check exists for.
SHARES = {"strategies": 0.27, "harness": 0.11, "loader": 0.14, "precision": 0.08, "maxbatch": 0.40}
PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
SECTIONS = ("strategies", "harness", "loader", "precision", "maxbatch")  # measuring sections, in run order
PRECISION = "bf16-mixed"
KNOBS = "pre-lag"  # FSDP1's default; FSDP2 rungs take theirs, pf0 (spec.default_knobs)
FSDP2_KNOBS = "pf0"

# The targets. Reported, never asserted (see the module docstring).
TARGET_VIT_H_MFU = 0.50
TARGET_HARNESS = 1.02
TARGET_LOADER = 0.97
TARGET_AC_COST = 0.25
TARGET_PLANNER = 0.10

# What "ran out of memory" looks like in the log of a process that died of it without
# writing its record (the runner records the OOMs it catches itself, as status 'oom').
OOM_RE = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED|hipErrorOutOfMemory",
                    re.IGNORECASE)
GIB = 2**30


@dataclass(frozen=True)
class Profile:
    """Sizes for one kind of device: which flavor each role runs as, batches, steps."""

    flavors: dict[str, str]
    batches: dict[str, int]
    steps: int  # per rung, warm-up included (the runner's --steps)
    warmup: int
    maxbatch_caps: dict[str, int]
    probe_steps: int  # = the maxbatch rung's own steps, so the passing probe IS the rung (no extra run)
    probe_warmup: int
    harness: tuple[tuple[str, int, int, int], ...]  # (role, batch, steps, repeats)
    shard_samples: int
    shard_per_shard: int
    loader_steps: int
    loader_warmup: int


# One H100 80GB: batches the planner puts at 10-21 GiB (`scaleladder plan ... --device h100-80gb`),
# far from the limit, so every strategy runs. Start-up (python, torch, CUDA context, NCCL,
# model build) dominates a rung's wall time, so a few tens of steps cost little more than a few.
GPU = Profile(
    flavors={r: r for r in ROLES},
    batches={"vit-base": 128, "vit-huge": 32, "flava-350m": 16},
    steps=40, warmup=10,
    # 8x the fixed batch; lowered further to the planner's own max batch when it predicts one
    # (see Check.maxbatch): the search's doubling and bisection cost ~log2(batch) probes.
    maxbatch_caps={"vit-base": 1024, "vit-huge": 256, "flava-350m": 128},
    probe_steps=4, probe_warmup=2,
    harness=(("vit-base", 128, 50, 3), ("vit-huge", 32, 30, 3)),
    shard_samples=2048, shard_per_shard=128,  # 16 shards: one per loader worker on a 16-core node
    loader_steps=60, loader_warmup=20,
)

# The CPU stand-in: the same commands on the debug flavors. vit-huge runs as vit-debug at a
# smaller batch so that its rungs are distinct files (and distinct rows) from vit-base's.
CPU = Profile(
    flavors={"vit-base": "vit-debug", "vit-huge": "vit-debug", "flava-350m": "flava-debug"},
    batches={"vit-base": 8, "vit-huge": 4, "flava-350m": 4},
    steps=4, warmup=2,
    maxbatch_caps={"vit-base": 2, "vit-huge": 2, "flava-350m": 2},  # a CPU never runs out of memory: the cap ends every search
    probe_steps=4, probe_warmup=2,
    harness=(("vit-base", 8, 6, 2), ("vit-huge", 4, 6, 2)),
    shard_samples=256, shard_per_shard=32,
    loader_steps=6, loader_warmup=2,
)


@dataclass(frozen=True)
class Selection:
    """Which rungs each section runs."""

    strategies: tuple[tuple[str, str], ...]  # (role, strategy)
    maxbatch: tuple[tuple[str, str], ...]
    harness_roles: tuple[str, ...]
    precisions: tuple[str, ...]


FULL = Selection(
    strategies=tuple((r, s) for s in RUN_ORDER if s in STRATEGIES for r in ROLES),
    # the seeds' claim (FSDP+AC allows ~3x DDP's batch) for every model first, then fsdp-full
    maxbatch=tuple((r, s) for s in ("ddp", "fsdp-full-ac", "fsdp-full") for r in ROLES),
    harness_roles=("vit-base", "vit-huge"),
    precisions=PRECISIONS,
)
# Every section, fewest rungs: an AC pair (single, single-ac) and one FSDP rung on FLAVA.
SMOKE = Selection(
    strategies=(("vit-base", "single"), ("vit-base", "single-ac"), ("flava-350m", "fsdp-full")),
    maxbatch=(("vit-base", "fsdp-full-ac"),),
    harness_roles=("vit-base",),
    precisions=("fp32", "bf16-mixed"),
)


@dataclass
class Command:
    """One subprocess this check ran."""

    name: str
    argv: list[str]
    rc: int | None  # None: killed at its time limit
    seconds: float
    log: Path

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def last_line(self) -> str:
        lines = [ln.strip() for ln in self.tail().splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""


@dataclass
class Rung:
    """One rung's row: what ran, how it ended, and its record's attributes."""

    section: str
    role: str
    spec: str
    status: str  # ok | oom | predicted-oom | error | timeout
    file: Path | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    seconds: float = 0.0

    def num(self, key: str) -> float:
        """A metric of the record as a float; NaN when absent, empty or not a number (never a crash)."""
        v = self.attrs.get(key)
        try:
            return float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    def mem(self, key: str) -> float:
        """A memory metric; NaN where the rung ran on a CPU (the runner records 0 there: nothing was measured)."""
        if str(self.attrs.get("gpus_per_node", "")) == "0":
            return math.nan
        return self.num(key)


# -- formatting --------------------------------------------------------------------------------------


def fmt(v: float, digits: int = 1, unit: str = "") -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:,.{digits}f}{unit}"


def gib(v: float) -> str:
    """GiB with two decimals, or three significant digits below 0.01 GiB (the debug flavors' kilobytes)."""
    if not math.isfinite(v):
        return "n/a"
    return f"{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.3g}"


def pct(v: float, digits: int = 1) -> str:
    return "n/a" if not math.isfinite(v) else f"{100 * v:.{digits}f}%"


def seconds_str(s: float) -> str:
    return f"{s:.1f} s" if s < 90 else f"{int(s // 60)} min {s % 60:.0f} s"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    def cell(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]


def verdict(ok: bool | None, why: str = "") -> str:
    return f"not measured{f' ({why})' if why else ''}" if ok is None else ("met" if ok else "NOT met")


def atomic_write(path: Path, text: str) -> None:
    """Temporary file beside ``path``, then rename: a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def with_batch(spec: str, batch: Any) -> str:
    return spec.rsplit("/b", 1)[0] + f"/b{batch}"


# -- the machine ----------------------------------------------------------------------------------------

# Run in a child: this driver never touches the GPU itself (see the module docstring).
_PROBE = r"""
import json, os, platform, sys
import torch
import scaleladder
d = {"torch": torch.__version__, "cuda": torch.version.cuda or "", "hip": getattr(torch.version, "hip", None) or "",
     "python": platform.python_version(), "gpu": torch.cuda.is_available(),
     "scaleladder_from": os.path.dirname(scaleladder.__file__)}
if sys.argv[1] == "cuda" and torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    d.update(name=torch.cuda.get_device_name(0), total_bytes=int(p.total_memory), count=torch.cuda.device_count(),
             capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count)
print("PROBE " + json.dumps(d))
"""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def driver_version(hip: bool) -> str:
    """The GPU driver's version from the vendor tool (empty when there is none)."""
    try:
        if not hip:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        p = Path("/sys/module/amdgpu/version")
        if p.is_file():
            return "amdgpu " + p.read_text().strip()
        out = subprocess.run(["rocm-smi", "--showdriverversion"], capture_output=True, text=True, timeout=30)
        m = re.search(r"Driver version:\s*(\S+)", out.stdout)
        return m.group(1) if m else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def git_commit() -> tuple[str, str]:
    """(commit, where it came from). The GPU machine may hold a copy of the tree without .git:
    then the commit `make gpu-wheels` wrote beside the wheels is the best there is."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else ""), "git"
    except (OSError, subprocess.SubprocessError):
        pass
    if os.environ.get("SCALELADDER_GIT_COMMIT"):
        return os.environ["SCALELADDER_GIT_COMMIT"], "SCALELADDER_GIT_COMMIT"
    stamp = REPO / ".whl" / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip(), ".whl/COMMIT (the tree the wheels were built from)"
    return "unknown", "no git, no SCALELADDER_GIT_COMMIT, no .whl/COMMIT"


def plan_device_args(name: str, total_bytes: int | None) -> tuple[list[str], str | None, str]:
    """(`scaleladder plan` device arguments, the key for `maxbatch --plan-device` or None, a description).

    A table entry only when the chip matches AND its capacity is within 5% of what torch
    reports: an H100 NVL (94 GB) or an H100 with memory taken by MIG is not `h100-80gb`.
    Any other GPU is planned as a custom device of its measured size (`--device-gib`).
    """
    from scaleladder.plan import DEVICES

    if total_bytes is None:
        return ["--device", "cpu"], "cpu", "cpu (no capacity: nothing is predicted not to fit)"
    low = name.lower()
    for key, cap in DEVICES.items():
        if cap and key.split("-")[0] in low and abs(cap - total_bytes) <= 0.05 * cap:
            return ["--device", key], key, f"{key} (the planner's table; torch reports {total_bytes / GIB:.1f} GiB)"
    gib = f"{total_bytes / GIB:.2f}"
    return (["--device", "this-gpu", "--device-gib", gib], None,
            f"custom, {gib} GiB as torch reports it (no table entry matches {name!r})")


# -- the check ---------------------------------------------------------------------------------------


class BudgetSpent(Exception):
    pass


class Check:
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
        self.rungs: list[Rung] = []
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
        owed = SHARES.get(name, 0.0) + sum(SHARES.get(n, 0.0) for n in later)
        share = SHARES.get(name, 0.0) / owed if owed > 0 else 1.0
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
                 steps: int | None = None, warmup: int | None = None) -> Rung:
        out = self.rung_file(section, spec, tag)
        out.unlink(missing_ok=True)  # a stale file from an earlier check must never pass for this one's result
        argv = self.scaleladder("run", "--spec", spec, "--steps", str(steps or self.profile.steps),
                                "--warmup", str(warmup or self.profile.warmup), "--device", self.device,
                                "--out", str(out), *(extra or []))
        cmd = self.sh(f"{section}{tag} {spec}", argv, self.limit(300))
        rung = self.judge(section, role, spec, cmd, out)
        self.rungs.append(rung)
        print(f"gpu-check: [{section}] {spec}{tag}: {self.describe(rung)} ({cmd.seconds:.1f} s)", flush=True)
        return rung

    def judge(self, section: str, role: str, spec: str, cmd: Command, out: Path) -> Rung:
        """A row from how the command ended: its record when there is one, else why there is none."""
        if out.is_file():
            from scaleladder.results.store import read_attrs

            attrs = read_attrs(out)
            note = str(attrs.get("error", "")) if attrs.get("status") != "ok" else ""
            return Rung(section, role, spec, str(attrs.get("status", "error")), out, attrs, note[:300], cmd.seconds)
        if cmd.timed_out:
            return Rung(section, role, spec, "timeout", None, {}, f"killed after {cmd.seconds:.0f} s (see {cmd.log.name})", cmd.seconds)
        tail = cmd.tail()
        # Out of memory outside what the runner can catch and record (the process died of it).
        status = "oom" if OOM_RE.search(tail) else "error"
        return Rung(section, role, spec, status, None, {}, f"exit {cmd.rc}: {cmd.last_line()} (see {cmd.log.name})", cmd.seconds)

    def same_as(self, r: Rung) -> Rung | None:
        """The earlier strategies row that ran the SAME strategy as ``r`` (None when ``r`` is the
        first of its kind): same model, precision, knobs and batch, same AC and compile, and the
        same ``sharding_ran`` read from the wrapped model. On one rank FSDP1's full, grad-op and
        no-shard are all NO_SHARD (issue 22): such rows are marked, never shown as different
        strategies, and left out of the AC-cost and planner targets."""
        ran = r.attrs.get("sharding_ran")
        if r.section != "strategies" or r.status != "ok" or not ran:
            return None

        def key(x: Rung) -> tuple[Any, ...]:
            parts = x.spec.split("/")
            strategy = parts[1]
            return (x.role, parts[0], *parts[2:], str(x.attrs.get("sharding_ran")), strategy.endswith("-ac") or "-ac-" in strategy,
                    "-compile" in strategy, str(x.attrs.get("wrapper", "")))

        for other in self.rungs:
            if other is r:
                return None
            if other.section == "strategies" and other.status == "ok" and other.attrs.get("sharding_ran") and key(other) == key(r):
                return other
        return None

    @staticmethod
    def describe(r: Rung) -> str:
        if r.status != "ok":
            return f"{r.status}{': ' + r.note if r.note else ''}"
        return (f"ok, {fmt(r.num('items_per_s'))} items/s, MFU {pct(r.num('mfu'))}, "
                f"peak active {gib(r.mem('peak_active_gib'))} GiB")

    # -- sections -------------------------------------------------------------------------------------------

    def probe_env(self) -> None:
        cmd = self.sh("probe", [sys.executable, "-c", _PROBE, self.device], 300)
        m = re.search(r"^PROBE (.*)$", cmd.tail(), re.MULTILINE)
        if cmd.rc != 0 or not m:
            raise SystemExit(f"gpu-check: the environment probe failed: {cmd.last_line()} (see {cmd.log})")
        info: dict[str, Any] = json.loads(m.group(1))
        if self.device == "cuda" and not info.get("gpu"):
            raise SystemExit("gpu-check: --device cuda, but torch sees no GPU (use --device cpu for the CPU form)")
        commit, commit_from = git_commit()
        # provenance.git_commit falls back to this variable where the package has no .git. When the
        # package is the wheel from .whl/ (not this tree's src/), the code that runs is the wheel's:
        # its records must name the commit it was built from, which may not be the tree's.
        stamp = REPO / ".whl" / "COMMIT"
        if not Path(str(info["scaleladder_from"])).resolve().is_relative_to(REPO) and stamp.is_file():
            info["wheel_commit"] = stamp.read_text().strip()
        self.child_env["SCALELADDER_GIT_COMMIT"] = str(info.get("wheel_commit", commit))
        info.update(commit=commit, commit_from=commit_from, host=socket.gethostname(), cores=cores(),
                    date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
        if self.device == "cuda":
            info["driver"] = driver_version(bool(info.get("hip")))
            self.plan_args, self.plan_key, info["plan_device"] = plan_device_args(str(info["name"]), int(info["total_bytes"]))
        else:
            info.update(name=f"cpu ({cpu_model()})", driver="n/a (CPU)", plan_device="cpu (no capacity)")
        self.env_info = info
        print(f"gpu-check: {info['name']}, torch {info['torch']}, commit {commit}", flush=True)

    def strategies(self) -> None:
        for role, strategy in self.sel.strategies:
            self.guard("strategies", f"{role} {strategy}")
            self.run_rung("strategies", role, self.spec(role, strategy))

    def harness_section(self) -> None:
        for role, batch, steps, repeats in self.profile.harness:
            if role not in self.sel.harness_roles:
                continue
            self.guard("harness", role)
            flavor = self.profile.flavors[role]
            argv = [sys.executable, str(BENCH_RUNG), "--model", flavor, "--precision", PRECISION, "--batch", str(batch),
                    "--steps", str(steps), "--repeats", str(repeats)]
            cmd = self.sh(f"harness {flavor} b{batch}", argv, self.limit(600))
            row: dict[str, Any] = {"role": role, "model": flavor, "precision": PRECISION, "batch": batch, "steps": steps,
                                   "repeats": repeats, "status": "ok", "bare_ms": math.nan, "harness_ms": math.nan,
                                   "ratio": math.nan, "seconds": cmd.seconds}
            m = re.search(r"bare mean step ([0-9.]+) ms \| harness mean step ([0-9.]+) ms \| harness/bare = ([0-9.]+)", cmd.tail())
            if m:
                row.update(bare_ms=float(m.group(1)), harness_ms=float(m.group(2)), ratio=float(m.group(3)))
            else:
                row["status"] = "timeout" if cmd.timed_out else ("oom" if OOM_RE.search(cmd.tail()) else "error")
                row["note"] = f"exit {cmd.rc}: {cmd.last_line()}"
            self.harness.append(row)
            print(f"gpu-check: [harness] {flavor} b{batch}: harness/bare {fmt(row['ratio'], 3)} ({cmd.seconds:.1f} s)", flush=True)

    def loader_section(self, work: Path) -> None:
        p, role = self.profile, "vit-base"
        flavor = p.flavors[role]
        from scaleladder.models.flavors import get_flavor

        size = get_flavor(flavor).image_size
        shards = work / "shards"
        self.guard("loader", "shard")
        cmd = self.sh("loader shard", self.scaleladder("shard", "--out", str(shards), "--samples", str(p.shard_samples),
                                                       "--per-shard", str(p.shard_per_shard), "--image-size", str(size),
                                                       "--overwrite", "--quiet"), self.limit(600))
        if cmd.rc != 0:
            self.note("loader", f"`scaleladder shard` failed (exit {cmd.rc}): {cmd.last_line()}; no loader rung ran")
            return
        # Workers = the cores the rank itself does not need: one for the training process, one
        # for its pin-memory thread and the rest of the machine.
        workers = max(1, cores() - 2) if self.device == "cuda" else max(1, cores() - 1)
        spec = self.spec(role, "single")
        self.loader = {"workers": workers, "samples": p.shard_samples, "image_size": size, "spec": spec}
        steps = {"steps": p.loader_steps, "warmup": p.loader_warmup}
        # Back to back, same steps: the two differ only in where the batches come from.
        self.guard("loader", "the loader-fed rung")
        fed = self.run_rung("loader", role, spec, ["--data", str(shards / "manifest.json"), "--workers", str(workers)],
                            tag="-data", **steps)
        self.guard("loader", "the synthetic rung")
        syn = self.run_rung("loader", role, spec, ["--data", "synthetic"], tag="-synthetic", **steps)
        self.loader.update(fed=fed, synthetic=syn)
        if fed.file is not None:
            self.loader["wait_ms"] = _mean_wait_ms(fed.file, int(fed.num("warmup")) if math.isfinite(fed.num("warmup")) else 0)

    def precision_section(self) -> None:
        role = "vit-base"
        for prec in self.sel.precisions:
            spec = self.spec(role, "single", prec)
            reuse = next((r for r in self.rungs if r.section == "strategies" and r.spec == spec and r.status == "ok"), None)
            if reuse is not None:
                self.rungs.append(Rung("precision", role, spec, reuse.status, reuse.file, reuse.attrs,
                                       "the strategies section's rung (same spec and steps)", reuse.seconds))
                continue
            self.guard("precision", prec)
            self.run_rung("precision", role, spec)

    def maxbatch_section(self) -> None:
        todo = list(self.sel.maxbatch)
        for i, (role, strategy) in enumerate(todo):
            self.guard("maxbatch", f"{role} {strategy}")
            p = self.profile
            spec = self.spec(role, strategy, batch="max")
            cap = p.maxbatch_caps[role] if not self.args.smoke else 1
            planned = self.planned_max(spec)
            if planned:
                cap = min(cap, planned)
            self.guard("maxbatch", f"{role} {strategy}")  # the planner's answer took time too
            out = self.rung_file("maxbatch", spec)
            out.unlink(missing_ok=True)
            argv = self.scaleladder("maxbatch", "--spec", spec, "--device", self.device,
                                    "--steps", str(p.probe_steps), "--warmup", str(p.probe_warmup),
                                    "--probe-steps", str(p.probe_steps), "--probe-warmup", str(p.probe_warmup),
                                    "--max-batch-cap", str(cap), "--keep-probes", "--out", str(out))
            if self.plan_key:
                argv += ["--plan-device", self.plan_key, "--ranks-per-node", "1"]
            # A search is many processes: give each its share of what is left, shared within one
            # round of the models at a time (issue 22): split over all nine searches, a GPU's
            # start-up cost leaves each too little to finish, and none would; this way the key
            # round (ddp for every model) finishes first. A killed search still leaves its probes.
            round_left = min(len(todo) - i, len(ROLES) - i % len(ROLES))  # searches left in this round
            share = self.section_remaining() / round_left
            cmd = self.sh(f"maxbatch {spec}", argv, max(60.0, share))
            rung = self.judge("maxbatch", role, spec, cmd, out)
            rung.attrs.setdefault("gpu_check_cap", cap)
            rung.attrs.setdefault("gpu_check_planned", planned or 0)
            if rung.file is None:
                rung.attrs.update(_probes_summary(out))  # a killed search: what its kept probes bracket
            shutil.rmtree(out.with_name(f".{out.name}.maxbatch"), ignore_errors=True)  # the record keeps the probe table
            self.rungs.append(rung)
            print(f"gpu-check: [maxbatch] {spec}: {rung.status}, max batch {rung.attrs.get('max_batch', '?')} "
                  f"(cap {cap}, {cmd.seconds:.1f} s)", flush=True)

    def planned_max(self, spec: str) -> int | None:
        """The planner's max local batch for ``spec`` on this device (None: unbounded or unknown)."""
        pred = self.predict(spec.replace("/bmax", "/b1"), "synthetic")
        mb = pred.get("max_batch") if pred else None
        return int(mb) if mb else None

    def predict(self, spec: str, data: str) -> dict[str, Any] | None:
        cmd = self.sh(f"plan {spec}", self.scaleladder("plan", "--spec", spec, "--gpus-per-node", "1", "--data", data,
                                                        "--json", *self.plan_args), 120)
        if cmd.rc != 0:
            return None
        text = cmd.tail(200_000)
        try:
            out: dict[str, Any] = json.loads(text[text.index("{"):])
            return out
        except ValueError:
            return None

    def planner_section(self) -> None:
        """Predicted against measured peak for every rung that ran (a rung reused by two sections, once)."""
        seen: set[Path] = set()
        for r in self.rungs:
            if r.status != "ok" or r.file is None or r.file in seen:
                continue
            seen.add(r.file)
            batch = r.attrs.get("batch", "")
            data = "synthetic" if str(r.attrs.get("data", "synthetic")) == "synthetic" else "loader"
            spec = with_batch(r.spec, batch)
            pred = self.predict(spec, data)
            dup = self.same_as(r)
            row: dict[str, Any] = {"rung": r.spec, "section": r.section, "batch": batch, "data": data,
                                   "same_as": dup.spec if dup else "",
                                   "measured_active_gib": r.mem("peak_active_gib"),
                                   "measured_reserved_gib": r.mem("peak_reserved_gib"),
                                   # absent in records of runners that predate it: missing, not a crash
                                   "measured_device_used_gib": r.mem("peak_device_used_gib"),
                                   "predicted_gib": math.nan, "required_gib": math.nan, "error": math.nan}
            if pred:
                row.update(predicted_gib=pred["peak_bytes"] / GIB, required_gib=pred["required_bytes"] / GIB)
            m = row["measured_active_gib"]
            if math.isfinite(m) and m > 0 and math.isfinite(row["predicted_gib"]):
                row["error"] = row["predicted_gib"] / m - 1
            self.planner.append(row)

    # -- figures ------------------------------------------------------------------------------------------

    def draw(self) -> None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            self.note("figures", "matplotlib is not importable here: no figures (every number is in the tables)")
            return
        try:
            self._throughput_figure()
            self._precision_figure()
        except Exception as e:  # a figure must never cost the tables
            self.note("figures", f"a figure failed: {type(e).__name__}: {e}")
        measured = [r for r in self.rungs if r.status == "ok" and r.file is not None and r.mem("peak_active_gib") > 0]
        if not measured:
            self.note("figures", "no predicted-vs-measured figure: no rung measured device memory "
                                 "(the CPU records none)")
            return
        files = list(dict.fromkeys(str(r.file) for r in measured))
        out = self.out / "peak-vs-measured.png"
        cmd = self.sh("plan vs-measured", self.scaleladder("plan", "--vs-measured", str(out), "--gpus-per-node", "1",
                                                            *self.plan_args, "--rungs", *files), 300)
        if cmd.rc == 0 and out.is_file():
            self.figures.append((out.name, "The planner's predicted peak against the measured peak active memory, "
                                           "every rung that ran (`scaleladder plan --vs-measured`); grey: ±10%."))
        else:
            self.note("figures", f"`scaleladder plan --vs-measured` failed (exit {cmd.rc}): {cmd.last_line()}")

    def _pyplot(self) -> Any:
        import matplotlib

        matplotlib.use("Agg")  # no display on a compute node
        import matplotlib.pyplot as plt

        return plt

    def _save(self, fig: Any, name: str, caption: str) -> None:
        path = self.out / name
        tmp = path.with_name(f".{name}.tmp-{os.getpid()}")
        try:
            fig.savefig(tmp, format="png", dpi=130)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self.figures.append((name, caption))

    def _throughput_figure(self) -> None:
        rows = [r for r in self.rungs if r.section == "strategies"]
        roles = [role for role in ROLES if any(r.role == role for r in rows)]
        if not roles:
            return
        plt = self._pyplot()
        fig, axes = plt.subplots(1, len(roles), figsize=(5.2 * len(roles), 4.2), squeeze=False)
        for ax, role in zip(axes[0], roles):
            mine = [r for r in rows if r.role == role]
            x = list(range(len(mine)))
            ys = [r.num("items_per_s") if r.status == "ok" else 0.0 for r in mine]
            colors = ["#d58a3a" if r.spec.split("/")[1].endswith("-ac") else "#3a78b5" for r in mine]
            ax.bar(x, [y if math.isfinite(y) else 0.0 for y in ys], color=colors)
            top = max([y for y in ys if math.isfinite(y)] + [1.0])
            for xi, r, y in zip(x, mine, ys):
                label = (pct(r.num("mfu"), 0) if math.isfinite(r.num("mfu")) else "") if r.status == "ok" else r.status
                ax.text(xi, (y if math.isfinite(y) else 0) + 0.01 * top, label, ha="center", va="bottom", fontsize=7)
            ax.set_xticks(x, [r.spec.split("/")[1] for r in mine], rotation=40, ha="right", fontsize=8)
            ax.set_title(f"{role} ({mine[0].spec.split('/')[0]}, b{self.profile.batches[role]})", fontsize=9)
            ax.set_ylabel("items/s")
        fig.suptitle(f"Throughput per strategy, {PRECISION}, one rank: {self.env_info.get('name', '')} "
                     f"(labels: MFU; orange: activation checkpointing)", fontsize=9)
        fig.tight_layout()
        self._save(fig, "throughput.png", "Throughput per strategy at a fixed batch, one bar per rung, labelled with "
                                          "its MFU (orange bars: activation checkpointing).")
        plt.close(fig)

    def _precision_figure(self) -> None:
        rows = [r for r in self.rungs if r.section == "precision"]
        if not rows:
            return
        plt = self._pyplot()
        fig, ax = plt.subplots(figsize=(5, 3.6))
        ys = [r.num("items_per_s") if r.status == "ok" else 0.0 for r in rows]
        ax.bar(range(len(rows)), [y if math.isfinite(y) else 0.0 for y in ys], color="#3a78b5")
        ax.set_xticks(range(len(rows)), [r.spec.split("/")[2] for r in rows])
        ax.set_ylabel("items/s")
        ax.set_title(f"{rows[0].spec.split('/')[0]} single, b{self.profile.batches['vit-base']}, by precision", fontsize=9)
        fig.tight_layout()
        self._save(fig, "precision.png", "vit-base `single` throughput by precision.")
        plt.close(fig)

    # -- the report ----------------------------------------------------------------------------------------

    def targets(self) -> list[list[str]]:
        smoke = " (--smoke)" if self.args.smoke else ""
        rows: list[list[str]] = []
        vh = [r for r in self.rungs if r.section == "strategies" and r.role == "vit-huge" and r.status == "ok"
              and math.isfinite(r.num("mfu"))]
        if vh:
            best = max(vh, key=lambda r: r.num("mfu"))
            rows.append(["ViT-H/14 bf16-mixed MFU", f">= {TARGET_VIT_H_MFU:.0%}",
                         f"{pct(best.num('mfu'))} best ({best.spec}); `single`: "
                         f"{next((pct(r.num('mfu')) for r in vh if r.spec.split('/')[1] == 'single'), 'n/a')}",
                         verdict(best.num("mfu") >= TARGET_VIT_H_MFU)])
        else:
            why = "no peak FLOP/s for a CPU" if self.device == "cpu" else "no vit-huge rung ran" + smoke
            rows.append(["ViT-H/14 bf16-mixed MFU", f">= {TARGET_VIT_H_MFU:.0%}", "n/a", verdict(None, why)])
        hs = [h for h in self.harness if math.isfinite(h["ratio"])]
        rows.append(["harness/bare step time", f"<= {TARGET_HARNESS}",
                     ", ".join(f"{h['model']} {h['ratio']:.3f}" for h in hs) or "n/a",
                     verdict(all(h["ratio"] <= TARGET_HARNESS for h in hs) if hs else None, "no bench ran")])
        ratio = self.loader_ratio()
        rows.append(["loader/synthetic throughput", f">= {TARGET_LOADER}", fmt(ratio, 3),
                     verdict(ratio >= TARGET_LOADER if math.isfinite(ratio) else None, "a loader rung is missing")])
        costs = [(c, s) for s, c in self.ac_costs().items() if math.isfinite(c)]
        if costs:
            worst = max(costs)
            rows.append(["AC throughput cost", f"<= {TARGET_AC_COST:.0%}", f"worst {pct(worst[0])} ({worst[1]}), "
                         f"{sum(c <= TARGET_AC_COST for c, _ in costs)} of {len(costs)} pairs within",
                         verdict(worst[0] <= TARGET_AC_COST)])
        else:
            rows.append(["AC throughput cost", f"<= {TARGET_AC_COST:.0%}", "n/a", verdict(None, "no AC pair ran")])
        errs = [(abs(p["error"]), p["error"], p["rung"]) for p in self.planner if math.isfinite(p["error"]) and not p.get("same_as")]
        if errs:
            worst_p = max(errs)
            within = sum(e <= TARGET_PLANNER for e, _, _ in errs)
            rows.append(["planner peak vs measured", f"within {TARGET_PLANNER:.0%}", f"{within} of {len(errs)} rungs within; "
                         f"worst {worst_p[1]:+.1%} ({worst_p[2]})", verdict(within == len(errs))])
        else:
            why = "the CPU records no device memory" if self.device == "cpu" else "no rung measured memory"
            rows.append(["planner peak vs measured", f"within {TARGET_PLANNER:.0%}", "n/a", verdict(None, why)])
        return rows

    def ac_costs(self) -> dict[str, float]:
        """1 - throughput(X-ac) / throughput(X), for every pair that both ran ok."""
        # a row that ran the same strategy as an earlier one is not a pair of its own (issue 22)
        rows = {r.spec: r for r in self.rungs if r.section == "strategies" and r.status == "ok" and self.same_as(r) is None}
        costs: dict[str, float] = {}
        for spec, r in rows.items():
            parts = spec.split("/")
            if parts[1].endswith("-ac"):
                base = "/".join([parts[0], parts[1][:-3], *parts[2:]])
                if base in rows:
                    costs[spec] = 1 - r.num("items_per_s") / rows[base].num("items_per_s")
        return costs

    def loader_ratio(self) -> float:
        fed, syn = self.loader.get("fed"), self.loader.get("synthetic")
        if not fed or not syn or fed.status != "ok" or syn.status != "ok":
            return math.nan
        return float(fed.num("items_per_s") / syn.num("items_per_s"))

    def markdown(self, status: str) -> str:
        e, p = self.env_info, self.profile
        cuda = f"CUDA {e.get('cuda')}" if e.get("cuda") else ""
        hip = f"HIP {e.get('hip')}" if e.get("hip") else ""
        mode = f"--device {self.device}" + (" --smoke" if self.args.smoke else "") + (
            f" (debug flavors: {', '.join(f'{r}->{f}' for r, f in p.flavors.items())})" if self.device == "cpu" else "")
        gpu = e.get("name", "?")
        if e.get("total_bytes"):
            gpu += f", {e['total_bytes'] / GIB:.1f} GiB as torch reports it, {e.get('count', 1)} visible (rungs use the first)"
        L: list[str] = [f"# make gpu-check: {e.get('name', '?')}", ""]
        if status != "complete":
            L += [f"**{status}**", ""]
        L += table(["", ""], [
            ["device", gpu],
            ["driver", e.get("driver") or "unknown"],
            ["torch", f"{e.get('torch', '?')} ({', '.join(x for x in (cuda, hip) if x) or 'CPU build'})"],
            ["python", e.get("python", "?")],
            ["scaleladder", self._md_commit()],
            ["date (UTC)", e.get("date", "?")],
            ["host", f"{e.get('host', '?')}, {e.get('cores', '?')} CPU cores"],
            ["mode", mode],
            ["planner device", e.get("plan_device", "?")],
            ["time", f"{seconds_str(self.elapsed())} of a {self.args.budget_min:g} min budget"],
            ["command", f"`{shlex.join([Path(sys.executable).name, *sys.argv])}`"],
        ])
        L += ["", "Every number below was measured by this run on this machine (commands at the end); the targets "
                  "are reported, not asserted. A rung that ran out of memory is a row saying `oom`.", ""]
        if self.device == "cpu":
            L += ["On the CPU the numbers say nothing about GPUs: no MFU (no peak FLOP/s), no device memory. "
                  "This form exists to prove the path end to end.", ""]
        L += ["## Targets", ""] + table(["target", "goal", "measured", "verdict"], self.targets()) + [""]
        L += self._md_strategies() + self._md_maxbatch() + self._md_harness() + self._md_loader() + self._md_precision()
        L += self._md_planner() + self._md_figures()
        L += ["## Time per section", ""] + table(
            ["section", "time", "notes"],
            [[s, seconds_str(t), "; ".join(self.notes.get(s, []))] for s, t in self.section_s.items()]
            + [["total", seconds_str(self.elapsed()), f"budget {self.args.budget_min:g} min"]]) + [""]
        other = [f"- {s}: {n}" for s, ns in self.notes.items() if s not in self.section_s for n in ns]
        if other:
            L += ["## Notes", "", *other, ""]
        L += ["## Commands", "", "In the order they ran, each in a fresh process (exit code, wall time, log under `logs/`):", ""]
        for i, c in enumerate(self.commands, 1):
            ended = "killed at its limit" if c.timed_out else f"exit {c.rc}"
            L.append(f"{i}. `{shlex.join(c.argv) if c.name != 'probe' else shlex.join(c.argv[:2]) + ' <environment probe>'}` "
                     f"— {ended}, {c.seconds:.1f} s, `{c.log.relative_to(self.out)}`")
        L.append("")
        if self.env_info.get("pythonpath"):
            L += [f"With `PYTHONPATH={self.env_info['pythonpath']}`.", ""]
        return "\n".join(L)

    def _md_commit(self) -> str:
        e = self.env_info
        text = f"tree at commit {e.get('commit', '?')} (from {e.get('commit_from', '?')}); package imported from {e.get('scaleladder_from', '?')}"
        wheel = e.get("wheel_commit")
        if wheel:
            text += f", a wheel built from {wheel} (.whl/COMMIT)"
            if wheel != e.get("commit"):
                text += " — NOT the tree's commit: `make gpu-wheels` again to measure the tree"
        return text

    def _status_cells(self, r: Rung) -> list[str]:
        return [r.status if r.status == "ok" else f"**{r.status}**" + (f": {r.note}" if r.note else "")]

    def _md_strategies(self) -> list[str]:
        order = {s: i for i, s in enumerate(STRATEGIES)}
        rows = sorted((r for r in self.rungs if r.section == "strategies"),  # run in RUN_ORDER, shown by model
                      key=lambda r: (ROLES.index(r.role) if r.role in ROLES else 99, order.get(r.spec.split("/")[1], 99)))
        L = [f"## Strategies at a fixed batch ({PRECISION}, one rank)", "",
             "At one rank FSDP1 runs every sharding strategy as `NO_SHARD` (torch warns and switches), so "
             "`fsdp-grad-op*` and `fsdp-no-shard*` are not run: they would measure `fsdp-full*` again. FSDP2 keeps "
             "its schedule but shards over one rank. 'ran as' is the sharding read from the wrapped model "
             "(`sharding_ran`); a row that ran the same strategy as an earlier row says so and is left out of the "
             "AC-cost and planner targets. AC cost = 1 − throughput with AC ÷ throughput without. Start-up: the "
             "rung's `startup_s`, process start to its first step (imports, process group, model build and wrapping; "
             "compile is in the warm-up steps); wall: the whole process as this check timed it.", ""]
        if not rows:
            return L + ["Not run.", ""]
        costs = self.ac_costs()
        body = []
        for r in rows:
            dup = self.same_as(r)
            ran = str(r.attrs.get("sharding_ran", "")) or "n/a"
            if dup is not None:
                ran += f" (same strategy as `{dup.spec.split('/')[1]}`)"
            body.append([r.role, f"`{r.spec}`", *self._status_cells(r), ran, fmt(r.num("items_per_s")),
                         fmt(1e3 * r.num("step_time_mean_s"), 1), pct(r.num("mfu")), fmt(r.num("tflops_per_device"), 1),
                         gib(r.mem("peak_active_gib")), gib(r.mem("peak_reserved_gib")),
                         gib(r.mem("peak_device_used_gib")), pct(costs[r.spec]) if r.spec in costs else "",
                         fmt(r.num("startup_s"), 1), fmt(r.seconds, 1), f"`{r.file.name}`" if r.file else ""])
        return L + table(["model", "rung", "status", "ran as", "items/s", "step (ms)", "MFU", "TFLOP/s", "peak active (GiB)",
                          "peak reserved (GiB)", "device used (GiB)", "AC cost", "start-up (s)", "wall (s)", "file"], body) + [""]

    def _md_maxbatch(self) -> list[str]:
        rows = [r for r in self.rungs if r.section == "maxbatch"]
        p = self.profile
        L = ["## Max batch", "",
             f"`scaleladder maxbatch` from the planner's predicted max batch (`--plan-device`), capped at the smaller "
             f"of that prediction and {', '.join(f'{k} {v}' for k, v in p.maxbatch_caps.items())}"
             f"{' (1 in --smoke)' if self.args.smoke else ''}; probes of {p.probe_steps} steps ({p.probe_warmup} warm-up), "
             "each a fresh process, and the passing probe at the max is the rung. `≥N (cap)`: the search stopped at its "
             "cap, so the true max batch is at least N; a search killed by the time guard says what its probes bracket.", ""]
        if not rows:
            return L + ["Not run.", ""]
        body = []
        for r in rows:
            mb = r.attrs.get("max_batch")
            capped = str(r.attrs.get("maxbatch_capped", "")).lower() in ("true", "1")
            if r.status == "ok":
                found = f"≥{mb} (cap)" if capped else str(mb)
            elif "probe_lo" in r.attrs:
                found = f"[{r.attrs['probe_lo']}, {r.attrs.get('probe_hi') or '?'})"
            else:
                found = "none" if r.status == "oom" else ""
            planned = int(r.attrs.get("gpu_check_planned", 0) or 0)
            body.append([r.role, r.spec.split("/")[1], *self._status_cells(r), str(planned or "n/a"),
                         str(r.attrs.get("gpu_check_cap", "")), found, str(r.attrs.get("maxbatch_probes", r.attrs.get("probes_run", ""))),
                         fmt(r.num("items_per_s")), pct(r.num("mfu")), gib(r.mem("peak_active_gib")),
                         gib(r.mem("peak_device_used_gib")), seconds_str(r.seconds)])
        return L + table(["model", "strategy", "status", "planner max", "cap", "max batch", "probes", "items/s at max",
                          "MFU", "peak active (GiB)", "device used (GiB)", "search time"], body) + [""]

    def _md_harness(self) -> list[str]:
        L = ["## Harness overhead", "", "`benchmarks/bench_rung.py`: the harness's loop against a bare loop in one process, "
             "interleaved; both timed by the harness's window. Median of the repeats.", ""]
        if not self.harness:
            return L + ["Not run.", ""]
        body = [[h["model"], h["precision"], str(h["batch"]), f"{h['steps']} × {h['repeats']}",
                 h["status"] + (f": {h['note']}" if h.get("note") else ""), fmt(h["bare_ms"], 2), fmt(h["harness_ms"], 2),
                 fmt(h["ratio"], 3)] for h in self.harness]
        return L + table(["model", "precision", "batch", "steps × repeats", "status", "bare step (ms)",
                          "harness step (ms)", "harness/bare"], body) + [""]

    def _md_loader(self) -> list[str]:
        L = ["## Loader against synthetic data", ""]
        if not self.loader.get("fed") and not self.loader.get("synthetic"):
            return L + ["Not run.", ""]
        lo = self.loader
        L += [f"`{lo['spec']}`, {self.profile.loader_steps} steps ({self.profile.loader_warmup} warm-up), back to back: "
              f"shards of {lo['samples']} synthetic samples at {lo['image_size']} px (`scaleladder shard`), "
              f"{lo['workers']} loader worker{'s' if lo['workers'] != 1 else ''} (the cores the rank does not need).", ""]
        body = []
        for what, key in (("shards (`--data manifest.json`)", "fed"), ("synthetic (`--data synthetic`)", "synthetic")):
            r = lo.get(key)
            if r is None:
                continue
            wait = fmt(lo.get("wait_ms", math.nan), 2) if key == "fed" else ""
            body.append([what, *self._status_cells(r), fmt(r.num("items_per_s")), fmt(1e3 * r.num("step_time_mean_s"), 1),
                         wait, f"`{r.file.name}`" if r.file else ""])
        L += table(["data", "status", "items/s", "step (ms)", "loader wait per step (ms)", "file"], body)
        return L + ["", f"loader/synthetic = **{fmt(self.loader_ratio(), 3)}** (target ≥ {TARGET_LOADER}).", ""]

    def _md_precision(self) -> list[str]:
        rows = [r for r in self.rungs if r.section == "precision"]
        L = ["## Precision (vit-base, `single`)", "",
             "MFU is against the device's peak for each precision (fp32, tf32, bf16 = fp16: `rung/devices.py`).", ""]
        if not rows:
            return L + ["Not run.", ""]
        fp32 = next((r.num("items_per_s") for r in rows if r.spec.split("/")[2] == "fp32" and r.status == "ok"), math.nan)
        body = [[r.spec.split("/")[2], f"`{r.spec}`", *self._status_cells(r), fmt(r.num("items_per_s")),
                 fmt(1e3 * r.num("step_time_mean_s"), 1), pct(r.num("mfu")), fmt(r.num("peak_tflops_per_device"), 1),
                 fmt(r.num("items_per_s") / fp32, 2, "×"), fmt(r.num("final_loss"), 4), gib(r.mem("peak_active_gib")),
                 r.note if r.status == "ok" else ""] for r in rows]
        return L + table(["precision", "rung", "status", "items/s", "step (ms)", "MFU", "peak TFLOP/s", "vs fp32",
                          "final loss", "peak active (GiB)", "note"], body) + [""]

    def _md_planner(self) -> list[str]:
        L = ["## Planner against measurement", "",
             f"`scaleladder plan --spec <rung at the batch it ran> --gpus-per-node 1 --data <synthetic|loader> "
             f"{shlex.join(self.plan_args)} --json` for every rung that ran. The planner's peak is the allocator's "
             "active peak; its 'required' adds fragmentation, the CUDA context and the comm library, which is what "
             "the device reports in use. error = predicted ÷ measured active − 1.", ""]
        if not self.planner:
            return L + ["No rung to compare.", ""]
        body = [[f"`{p['rung']}`" + (f" (same strategy as `{p['same_as'].split('/')[1]}`)" if p.get("same_as") else ""),
                 p["section"], str(p["batch"]), p["data"], gib(p["predicted_gib"]),
                 gib(p["measured_active_gib"]), f"{p['error']:+.1%}" if math.isfinite(p["error"]) else "n/a",
                 gib(p["measured_reserved_gib"]), gib(p["required_gib"]), gib(p["measured_device_used_gib"])]
                for p in self.planner]
        return L + table(["rung", "section", "batch", "data", "predicted peak (GiB)", "measured active (GiB)", "error",
                          "measured reserved (GiB)", "predicted required (GiB)", "measured device used (GiB)"], body) + [""]

    def _md_figures(self) -> list[str]:
        L = ["## Figures", ""]
        if not self.figures:
            return L + ["None (see the notes).", ""]
        for name, caption in self.figures:
            L += [f"![{caption}]({name})", "", f"*{caption}*", ""]
        return L

    def summary(self, status: str) -> dict[str, Any]:
        def clean(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            if isinstance(v, Rung):
                return {"section": v.section, "role": v.role, "spec": v.spec, "status": v.status, "file": v.file}
            if isinstance(v, Path):
                return str(v.relative_to(self.out)) if v.is_relative_to(self.out) else str(v)
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            if hasattr(v, "item"):  # numpy scalars from the records
                return clean(v.item())
            return v

        rungs = [{**{k: v for k, v in asdict(r).items() if k != "attrs"},
                  **{k: r.num(k) for k in ("items_per_s", "step_time_mean_s", "mfu", "peak_active_gib", "peak_reserved_gib",
                                          "peak_device_used_gib")}, "max_batch": r.attrs.get("max_batch")}
                 for r in self.rungs]
        result: dict[str, Any] = clean({"status": status, "device": self.device, "smoke": self.args.smoke, "env": self.env_info,
                      "budget_s": self.budget_s, "elapsed_s": self.elapsed(), "sections_s": self.section_s,
                      "notes": self.notes, "targets": [dict(zip(("target", "goal", "measured", "verdict"), t)) for t in self.targets()],
                      "rungs": rungs, "harness": self.harness, "loader_ratio": self.loader_ratio(),
                      "ac_costs": self.ac_costs(), "planner": self.planner, "figures": [f for f, _ in self.figures],
                      "commands": [{"argv": c.argv, "rc": c.rc, "seconds": c.seconds} for c in self.commands]})
        return result

    def write(self, status: str) -> Path:
        md = self.out / "gpu-check.md"
        atomic_write(self.out / "gpu-check.json", json.dumps(self.summary(status), indent=1, default=str) + "\n")
        atomic_write(md, self.markdown(status))
        return md

    # -- driver ------------------------------------------------------------------------------------------

    def timed(self, name: str, fn: Any, *args: Any) -> None:
        t0 = self.clock()
        print(f"gpu-check: == {name} (at {seconds_str(self.elapsed())})", flush=True)
        try:
            fn(*args)
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

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.rungs_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.logs, ignore_errors=True)  # logs of an earlier check would be misread as this one's
        self.timed("environment", self.probe_env)
        if "pythonpath" not in self.env_info and os.environ.get("PYTHONPATH"):
            self.env_info["pythonpath"] = os.environ["PYTHONPATH"]
        wanted = set(self.args.sections.split(",")) if self.args.sections else set(SECTIONS)
        status = "complete"
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
            try:
                plan = (("strategies", self.strategies), ("harness", self.harness_section),
                        ("loader", lambda: self.loader_section(Path(work))), ("precision", self.precision_section),
                        ("maxbatch", self.maxbatch_section))
                for k, (name, fn) in enumerate(plan):
                    if name not in wanted:
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
            except KeyboardInterrupt:
                status = "INTERRUPTED: partial results"
        # Always: they only read what ran, and cost seconds.
        self.timed("planner", self.planner_section)
        self.timed("figures", self.draw)
        if self.crashed:
            status = f"INCOMPLETE: section(s) {', '.join(self.crashed)} failed (see the notes)" if status == "complete" else status
        md = self.write(status)
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


def _mean_wait_ms(path: Path, warmup: int) -> float:
    """Mean host wait for the loader per measured step, when the record has it (``loader_wait_s``)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if "loader_wait_s" not in f:
                return math.nan
            w = f["loader_wait_s"][()]
        w = w[warmup:] if len(w) > warmup else w
        return float(1e3 * w.mean()) if len(w) else math.nan
    except (OSError, KeyError, ValueError):
        return math.nan


def _probes_summary(out: Path) -> dict[str, Any]:
    """What the kept probes of a killed search bracket: the largest passing and smallest failing batch."""
    from scaleladder.results.store import read_attrs

    workdir = out.with_name(f".{out.name}.maxbatch")
    passed: list[int] = []
    failed: list[int] = []
    n = 0
    for f in sorted(workdir.glob("probe-b*.h5")):
        n += 1
        try:
            a = read_attrs(f)
        except OSError:
            continue
        b = int(f.stem.split("-b")[1])
        (passed if a.get("status") == "ok" and not int(a.get("alloc_retries", 0) or 0) else failed).append(b)
    summary: dict[str, Any] = {"probes_run": n}
    if passed:
        summary["probe_lo"] = max(passed)
        above = [b for b in failed if b > max(passed)]
        summary["probe_hi"] = min(above) if above else 0
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "", formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cuda: one NVIDIA or AMD GPU (ROCm's torch calls it cuda too); cpu: the debug flavors, to test the path")
    ap.add_argument("--out", default="results/gpu-check", help="output folder (default results/gpu-check)")
    ap.add_argument("--smoke", action="store_true", help="every section, fewest rungs (the test's CPU run)")
    ap.add_argument("--budget-min", type=float, default=18.0,
                    help="minutes after which nothing new starts; the rest is skipped with a note (default 18)")
    ap.add_argument("--sections", default="", help=f"comma-separated subset of {','.join(SECTIONS)} (default: all); "
                                                   "the planner comparison and the report always run")
    a = ap.parse_args(argv)
    unknown = set(filter(None, a.sections.split(","))) - set(SECTIONS)
    if unknown:
        ap.error(f"--sections: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(SECTIONS)}")
    if not a.budget_min >= 0:
        ap.error("--budget-min must be >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
