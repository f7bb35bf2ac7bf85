"""Shared test helpers: rung files in the design's HDF5 schema, and a repo copy for
workflow tests (each snakemake test runs in its own tmp copy so .snakemake/ and
results/ never collide); a command run in-process (`in_process`); and the fast tier's
boundary: a test without @pytest.mark.process that starts a process fails, naming itself
(`no_process_starts`; docs/workflow.md, "Tests")."""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from scaleladder.spec import RunSpec

# An attribute a writer adds but results/record.py does not define fails the writer's test
# (in a real run it is a warning: results/record.checked). Set here, so every process a test
# starts (ranks, snakemake jobs) inherits it.
os.environ["SCALELADDER_STRICT_RECORDS"] = "1"

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = str(Path(sys.executable).parent)


# The groups that take longest, longest first (LPT). xdist's loadgroup hands the groups out in
# the order the workers collected them, and by default reorders them by their NUMBER of tests
# (--loadscope-reorder, turned off in pytest_configure): that queued these few-test, long files
# LAST (a run on the 2-core VM, 2026-11-27, had begun 13 of 55 files after 41 min, test_workflow
# and test_parity not among them), so one worker ran them alone at the end (in CI the Slurm
# group's ~14 min among them) while the other idled. Longest first, the many short groups even
# out the two workers' ends.
# Order from CI's slowest tests (docs/workflow.md, "CI time"): the Slurm group 835 s alone, then
# test_workflow's e2e, the parity launches, plan_exact's torchrun, the compiled rungs, ...
# A group not named here goes after these, in file order; a renamed file only loses its place.
COSTLIEST_FIRST = ("slurm", "tests/test_workflow.py", "tests/test_parity.py", "tests/test_plan_exact.py",
                   "tests/test_run.py", "tests/test_faults.py", "tests/test_gpu_check.py")


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers it itself; without xdist (TEST_WORKERS=0, -p no:xdist) the mark is inert
    config.addinivalue_line("markers", "xdist_group(name): tests an xdist worker runs together (loadgroup)")
    if getattr(config.option, "dist", "no") == "loadgroup":
        # The groups go out in COSTLIEST_FIRST's order (see there), not xdist's default, which
        # queues them by their number of tests (--loadscope-reorder).
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How `make test` splits the suite over pytest-xdist workers (`--dist loadgroup`).

    Each test file is one group, so a module-scoped fixture (the workflow test's whole DAG)
    is built once, on one worker. Every test that needs the one-node Slurm cluster is in ONE
    group, whatever its file: they would otherwise run at the same time on two workers and
    meet on the same srun MASTER_PORT (the slurm-localhost profile's), and queue on the
    node's CPUs (slurm.conf OverSubscribe=NO) past their timeouts. Without xdist the marks
    do nothing.

    On an xdist worker the items are also sorted group by group, COSTLIEST_FIRST first (a
    stable sort: a file's tests keep their order); the scheduler takes the groups in the
    order the workers collected them."""
    # (on a worker `dist` reads 'no'; xdist keeps the mode in its own `loadgroup` option)
    on_loadgroup_worker = hasattr(config, "workerinput") and bool(config.getvalue("loadgroup"))
    group_of: dict[int, str] = {}
    for item in items:
        group = "slurm" if item.get_closest_marker("slurm") else item.nodeid.split("::")[0]
        group_of[id(item)] = group
        item.add_marker(pytest.mark.xdist_group(group))
        node_id = getattr(item, "_id", None)  # pytest >= 9 (a NodeId); older pytest reads _nodeid
        if on_loadgroup_worker and hasattr(node_id, "parse"):
            # TRAP: pytest-xdist 3.8 tells the scheduler a test's group by setting
            # `item._nodeid = "<nodeid>@<group>"`, but pytest 9 reads a node's id from `item._id`,
            # so the suffix never arrives: every test is its own group, and the Slurm tests (one
            # cluster, one srun port) ran on both workers at once. Set the suffixed id here;
            # xdist's own suffix after it is then harmless (the scheduler reads the last '@').
            item._id = type(node_id).parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
    if on_loadgroup_worker:
        rank = {group: i for i, group in enumerate(COSTLIEST_FIRST)}
        items.sort(key=lambda item: rank.get(group_of[id(item)], len(rank)))


# -- the fast tier's boundary: a test that starts a process carries the `process` mark ------

PROCESS_MARK = "process"


class ProcessStarted(RuntimeError):
    """Raised where a test without the `process` mark starts a process."""


def _command(function: str, args: tuple[Any, ...]) -> str:
    """What a refused start would have run, for the failure message."""
    argv: Any = args[1] if function == "subprocess.Popen" and len(args) > 1 else (
        args[1] if function in ("os.posix_spawn", "os.posix_spawnp", "multiprocessing spawn") and len(args) > 1
        else args[0] if args else "")
    if isinstance(argv, (str, bytes, os.PathLike)):
        return os.fsdecode(argv)
    try:
        return shlex.join(os.fsdecode(a) for a in argv)
    except TypeError:
        return repr(argv)


def _importing() -> bool:
    """Whether the caller runs inside a module's import."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def no_process_starts(test: str) -> Iterator[list[str]]:
    """Every way a test can start a process, refused while the block runs.

    Each attempt raises ProcessStarted, and is also listed in the yielded list, so that code
    which catches the error (a best-effort `git` call, a retry loop) cannot hide it: the
    caller fails the test when the list is not empty. subprocess (run, check_output, Popen,
    asyncio's subprocesses) goes through Popen._execute_child; multiprocessing's fork through
    os.fork, its spawn and forkserver through multiprocessing.util.spawnv_passfds.

    A start made while a module is being imported is let through: it happens once per
    process, in whichever test imports the module first (`import torch` runs `ldconfig -p`
    through ctypes.util.find_library), so it is no test's doing."""
    started: list[str] = []

    def refuse(function: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def start(*args: Any, **kwargs: Any) -> Any:
            if _importing():
                return original(*args, **kwargs)
            command = _command(function, args)
            started.append(f"{function}: {command}")
            raise ProcessStarted(f"{test} started a process ({function}: {command}) but has no "
                                 f"@pytest.mark.{PROCESS_MARK} (tests/conftest.py)")
        return start

    patched: list[tuple[Any, str, str]] = [
        (subprocess.Popen, "_execute_child", "subprocess.Popen"),
        (os, "fork", "os.fork"), (os, "forkpty", "os.forkpty"), (os, "system", "os.system"),
        (os, "posix_spawn", "os.posix_spawn"), (os, "posix_spawnp", "os.posix_spawnp"),
        (multiprocessing.util, "spawnv_passfds", "multiprocessing spawn"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched if hasattr(owner, name)]
    try:
        for owner, name, function in patched:
            if hasattr(owner, name):
                setattr(owner, name, refuse(function, getattr(owner, name)))
        yield started
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _guarded(item: pytest.Item, phase: str) -> Generator[None, object, object]:
    """One phase (setup, call, teardown) of a test: unless the test carries the `process`
    mark, it fails when it (or a fixture it sets up) started a process."""
    if item.get_closest_marker(PROCESS_MARK):
        return (yield)
    with no_process_starts(item.nodeid) as started:
        try:
            result = yield
        except BaseException:
            if not started:
                raise
            result = None
    if started:
        where = "" if phase == "call" else f" (in its {phase}: a fixture)"
        pytest.fail(f"{item.nodeid} starts a process{where} but has no @pytest.mark.{PROCESS_MARK}: "
                    f"{'; '.join(started)}. Mark it (pyproject.toml [tool.pytest.ini_options] markers), "
                    f"or call the code in-process (scaleladder.cli.main(argv)).", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item, "teardown"))


_SUBPROCESS_RUN = subprocess.run


class _CheckoutGit:
    """`scaleladder.gitinfo`'s `subprocess`, answering the checkout's own git questions (which
    commit, dirty or not: every record's and ladder's provenance) from one asking when the
    suite starts, so that a test that writes a record starts no `git`. Any other command (git
    in a test's own repository) goes to the real subprocess.run, and so to the guard."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, ...], subprocess.CompletedProcess[str] | Exception] = {}
        self.recording = False

    def __getattr__(self, name: str) -> Any:  # SubprocessError, PIPE, ...: the module's own
        return getattr(subprocess, name)

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if subprocess.run is not _SUBPROCESS_RUN:  # a test's own stand-in (a machine without git): it answers
            return subprocess.run(argv, **kwargs)
        key = tuple(map(str, argv))
        if self.recording:
            try:
                self.answers[key] = subprocess.run(argv, **kwargs)
            except (OSError, subprocess.SubprocessError) as e:
                self.answers[key] = e
        answer = self.answers.get(key)
        if answer is None:
            return subprocess.run(argv, **kwargs)
        if isinstance(answer, Exception):
            raise answer
        return answer


CHECKOUT_GIT = _CheckoutGit()


def _ask_the_checkout_once() -> None:
    """Record what `gitinfo.commit_and_source()` asks git about this checkout, here, before any
    test runs (and outside the process guard)."""
    from scaleladder import gitinfo
    real = gitinfo.subprocess
    CHECKOUT_GIT.recording = True
    gitinfo.subprocess = CHECKOUT_GIT  # type: ignore[assignment]
    try:
        gitinfo.commit_and_source()
    finally:
        gitinfo.subprocess = real
        CHECKOUT_GIT.recording = False


_ask_the_checkout_once()


@pytest.fixture(autouse=True)
def _checkout_commit_asked_once(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a test without the `process` mark, the checkout's commit comes from the one asking
    above (the same answer, while the tree does not change under the suite)."""
    if request.node.get_closest_marker(PROCESS_MARK) is None:
        from scaleladder import gitinfo
        monkeypatch.setattr(gitinfo, "subprocess", CHECKOUT_GIT)


def in_process(*argv: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`scaleladder ARGV` run in this process (scaleladder.cli.main), for a test whose point is
    what the command does, not the process it runs in: its exit code and what it printed to
    stdout and stderr, as ``subprocess.run(..., capture_output=True, text=True)`` returns them.
    ``env`` is added to os.environ for the call; os.environ, the working directory, the
    SIGTERM handler and scaleladder's log level are put back after it."""
    from scaleladder import cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    logger = logging.getLogger("scaleladder")
    saved_level = logger.level
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(list(argv))
            except SystemExit as e:  # argparse, and a command's own exit: what the process would return
                if isinstance(e.code, int) or e.code is None:
                    rc = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
                    rc = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        signal.signal(signal.SIGTERM, saved_sigterm)
        logger.setLevel(saved_level)
    return subprocess.CompletedProcess(["scaleladder", *argv], rc, out.getvalue(), err.getvalue())


def write_rung(root: Path, spec_path: str, status: str = "ok", **metrics: Any) -> Path:
    """A rung file as `scaleladder run` writes it (docs/design.md, "Result file")."""
    spec = RunSpec.from_path(spec_path)
    path = Path(root) / "results" / "rungs" / f"{spec.path}.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = int(metrics.pop("steps", 6))
    with h5py.File(path, "w") as f:
        f.attrs["status"] = status
        for k, v in spec.as_attrs().items():
            f.attrs[k] = v
        f.attrs.update({"steps": steps, "warmup": 2, "seed": 0, "data": "synthetic", "world_size": 8,
                        "ranks_per_node": 8, "device_name": "test", "torch_version": "test"})
        if status == "ok":
            ips = float(metrics.pop("items_per_s", 100.0))
            f.attrs.update({"items_per_s": ips, "samples_per_s": ips / 2, "mfu": 0.3,
                            "peak_active_gib": 10.0, "peak_reserved_gib": 12.0})
            f.create_dataset("step_time_s", data=np.full(steps, 0.1))
            f.create_dataset("loss", data=np.linspace(2, 1, steps))
            for k in ("peak_active_bytes", "peak_reserved_bytes", "num_alloc_retries", "num_ooms"):
                f.create_dataset(f"memory/{k}", data=np.zeros(8, dtype=np.int64))
        else:
            f.attrs["error"] = "CUDA out of memory"
        for k, v in metrics.items():
            f.attrs[k] = v
    return path


def seed_like_ladder(root: Path) -> list[Path]:
    """A ladder shaped like the two seeds' experiments, with OOM and missing points."""
    files = []
    flava = {"flava-350m": 350e6, "flava-900m": 900e6, "flava-1.8b": 1.8e9, "flava-10b": 10e9}
    for i, (m, p) in enumerate(flava.items()):
        for s, fits, speed in (("ddp", i < 2, 1.0), ("fsdp-full", i < 3, 0.9), ("fsdp-full-ac", True, 0.7)):
            for b in ("8", "max"):
                spec = f"{m}/{s}/bf16-mixed/pre-lag/n1/b{b}"
                if fits:
                    mb = {"ddp": 16, "fsdp-full": 20, "fsdp-full-ac": 60}[s] // (i + 1)
                    extra = {"max_batch": mb, "batch": str(mb)} if b == "max" else {}
                    files.append(write_rung(root, spec, items_per_s=4000 * speed / (i + 1) * (1.3 if b == "max" else 1),
                                            params=p, peak_reserved_gib=8 + 6 * i + (10 if b == "max" else 0), **extra))
                else:
                    files.append(write_rung(root, spec, status="oom" if s == "ddp" else "predicted-oom", params=p))
    for k, thr in (("pre-lag", 900), ("pre-nolag", 850), ("post-lag", 870), ("none-nolag", 700)):
        for s in ("fsdp-full", "fsdp-grad-op", "fsdp-hybrid2"):
            files.append(write_rung(root, f"vit-5b/{s}/bf16-mixed/{k}/n8/b32", items_per_s=thr * (1.1 if "hybrid" in s else 1)))
    for m, base in (("vit-base", 2000.0), ("vit-3b", 150.0)):
        for s in ("ddp", "fsdp-full", "fsdp-hybrid2"):
            for n in (1, 2, 4, 8):
                if m == "vit-3b" and s == "ddp" and n >= 4:
                    files.append(write_rung(root, f"{m}/{s}/bf16-mixed/pre-lag/n{n}/b32", status="oom"))
                    continue
                files.append(write_rung(root, f"{m}/{s}/bf16-mixed/pre-lag/n{n}/b32", items_per_s=base * n * (0.9 ** n),
                                        peak_reserved_gib=60 / (n if s == "fsdp-full" else 1)))
    return files


@pytest.fixture
def seed_ladder(tmp_path: Path) -> tuple[Path, list[Path]]:
    return tmp_path, seed_like_ladder(tmp_path)


# -- workflow copies ----------------------------------------------------------------------

WORKFLOW_PARTS = ("Snakefile", "workflow", "profiles", "config")


def workflow_copy(dest: Path) -> Path:
    """The workflow's files (not results/ or .snakemake/) copied into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        else:
            shutil.copy2(src, dest / part)
    return dest


def snakemake_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # scaleladder and snakemake from this venv, also inside Slurm jobs (sbatch --export=ALL)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("SCALELADDER_SLURM_ACCOUNT", "testacct")
    env.update(extra)
    return env


def snakemake(cwd: Path, *args: str, check: bool = True, timeout: float = 900, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "snakemake"), *args], cwd=cwd, env=snakemake_env(**env),
        capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-5000:]}\n{proc.stderr[-8000:]}")
    return proc


@pytest.fixture
def wf(tmp_path: Path) -> Path:
    return workflow_copy(tmp_path / "wf")
