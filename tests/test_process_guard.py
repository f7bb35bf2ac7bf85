"""The fast tier's boundary (tests/conftest.py): a test that starts a process must carry
@pytest.mark.process, or it fails naming itself and the command. `make test-fast` leaves the
marked tests out; this file proves the guard that keeps that set honest can fail."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, ProcessStarted, no_process_starts


def test_the_guard_refuses_every_way_to_start_a_process() -> None:
    patched = (subprocess.Popen._execute_child, os.fork, os.system, os.posix_spawn)  # type: ignore[attr-defined]
    starts = {
        "subprocess.Popen: true": lambda: subprocess.run(["true"]),
        "subprocess.Popen: git rev-parse HEAD": lambda: subprocess.check_output(["git", "rev-parse", "HEAD"]),
        "os.system: true": lambda: os.system("true"),
        "os.posix_spawn: true": lambda: os.posix_spawn("/bin/true", ["true"], {}),
        "os.fork: ": lambda: os.fork(),
        "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    }
    with no_process_starts("tests/x.py::test_x") as started:
        for start in starts.values():
            with pytest.raises(ProcessStarted, match=r"^tests/x\.py::test_x started a process .* no @pytest\.mark\.process"):
                start()
    assert len(started) == len(starts)
    for said, wanted in zip(started, starts):
        assert said.startswith(wanted), (said, wanted)
    # ... and what was there before (here: the guard of this very test) is back
    assert (subprocess.Popen._execute_child, os.fork, os.system, os.posix_spawn) == patched  # type: ignore[attr-defined]


def test_a_start_inside_an_import_is_no_tests_doing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`import torch` runs `ldconfig -p` once per process, in whichever test imports it first."""
    (tmp_path / "probes_at_import.py").write_text("import subprocess\nRC = subprocess.run(['true']).returncode\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with no_process_starts("tests/x.py::test_x") as started:
        import probes_at_import  # type: ignore[import-not-found]

        assert probes_at_import.RC == 0
        with pytest.raises(ProcessStarted):
            subprocess.run(["true"])  # ... but the same start outside the import is refused
    assert started == ["subprocess.Popen: true"]
    sys.modules.pop("probes_at_import", None)


INNER = '''
import subprocess

import pytest


def test_unmarked_starts_one():
    subprocess.run(["true"])


def test_unmarked_hides_the_refusal():
    try:
        subprocess.run(["git", "--version"], check=True)
    except Exception:
        pass


@pytest.fixture
def tool():
    subprocess.run(["true"])


def test_unmarked_whose_fixture_starts_one(tool):
    pass


@pytest.mark.process
def test_marked_starts_one():
    assert subprocess.run(["true"]).returncode == 0


def test_unmarked_starts_none():
    assert 1 + 1 == 2
'''


@pytest.mark.process
def test_an_unmarked_test_that_starts_a_process_fails_naming_itself(tmp_path: Path) -> None:
    """The hooks, in a pytest of their own: this suite's conftest.py beside five tests."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    process: starts a process\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA", "-q", "--strict-markers",
                        "test_inner.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "2 failed, 2 passed, 1 error" in out, out
    assert "PASSED test_inner.py::test_marked_starts_one" in out and "PASSED test_inner.py::test_unmarked_starts_none" in out
    assert "test_inner.py::test_unmarked_starts_one starts a process but has no @pytest.mark.process: subprocess.Popen: true" in out
    assert ("test_inner.py::test_unmarked_hides_the_refusal starts a process but has no @pytest.mark.process: "
            "subprocess.Popen: git --version") in out
    assert "test_inner.py::test_unmarked_whose_fixture_starts_one starts a process (in its setup: a fixture)" in out
