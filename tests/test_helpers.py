"""The bottom of the house's shared helpers: one markdown table, one atomic write, one commit."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from scaleladder import gitinfo, markdown
from scaleladder.errors import WriteError
from scaleladder.files import atomic_file, atomic_write_text

# -- markdown: byte for byte what the hand-built tables wrote -------------------------------------------


def test_table_is_the_hand_built_one() -> None:
    keys = ["model", "winner"]
    rows = [{"model": "vit-base", "winner": "ddp"}, {"model": "flava", "winner": "fsdp-full"}]
    # figures/report.py's winners, figures/convergence.py, campaign/cost.markdown
    old = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    old += ["| " + " | ".join(r[k] for k in keys) + " |" for r in rows]
    assert markdown.dict_table(rows) == old
    assert markdown.table(keys, [list(r.values()) for r in rows]) == old


def test_escaped_body_is_gpu_checks() -> None:
    header, rows = ["a", "b|c"], [["x|y", "two\nlines"], [1, 2.5]]

    def cell(x: object) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    old = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    assert markdown.table(header, rows, escape=True) == old
    assert markdown.table(["", ""], [["device", "cpu"]]) == ["|  |  |", "|---|---|", "| device | cpu |"]


def test_blank_header_is_the_reports_summary() -> None:
    pairs = [("rungs", "3"), ("ok", "2")]
    old = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in pairs]
    assert markdown.table(None, pairs) == old
    assert markdown.table(None, []) == ["|", "|"]


def test_row_and_rule_are_the_seeds() -> None:
    cells = ["model", "fsdp-full", "ddp"]
    assert markdown.row(cells) == "| " + " | ".join(cells) + " |"
    assert markdown.row(["---"] * 3) == "| --- | --- | --- |"
    assert markdown.rule(3) == "|---|---|---|"


# -- files: the one atomic write --------------------------------------------------------------------------


def test_atomic_write_text_leaves_the_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "report.md"
    atomic_write_text(out, "≥ one\n")
    atomic_write_text(out, "two\n", fsync=True)
    assert out.read_text(encoding="utf-8") == "two\n"
    assert [p.name for p in out.parent.iterdir()] == ["report.md"]


def test_a_failed_write_keeps_the_old_file_and_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    out.write_text("old\n")
    with pytest.raises(WriteError, match=r"^cannot write .*report\.md: no space left on the device \[ENOSPC\]$"):
        with atomic_file(out) as tmp:
            tmp.write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
    with pytest.raises(RuntimeError):  # not a write's error: raised as it is, still no temporary
        with atomic_file(out) as tmp:
            tmp.write_text("half")
            raise RuntimeError("a bug")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


@pytest.mark.process
def test_a_dead_writers_temporary_is_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"r.md.tmp-{dead.pid}").write_text("killed")
    (tmp_path / f"r.md.tmp-{os.getpid()}x").write_text("not ours")
    atomic_write_text(tmp_path / "r.md", "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.md", f"r.md.tmp-{os.getpid()}x"])


# -- gitinfo: git (-dirty), else the baked-in variable, else a stamp, else "" -----------------------------


def _repo(path: Path) -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(path), *a], capture_output=True, text=True, check=True).stdout.strip()

    path.mkdir()
    git("init", "-q")
    (path / "f").write_text("1")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return git("rev-parse", "HEAD")


@pytest.mark.process
def test_commit_from_git_with_dirty_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gitinfo.ENV, "baked")
    head = _repo(tmp_path / "r")
    assert gitinfo.commit_and_source(tmp_path / "r") == (head, "git")
    (tmp_path / "r" / "new").write_text("untracked files do not count")
    assert gitinfo.git_commit(tmp_path / "r") == head
    (tmp_path / "r" / "f").write_text("2")
    assert gitinfo.git_commit(tmp_path / "r") == head + "-dirty"


@pytest.mark.process
def test_commit_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no checkout above tmp_path either
    stamp = tmp_path / "COMMIT"
    monkeypatch.setenv(gitinfo.ENV, "")
    assert gitinfo.commit_and_source(tmp_path, stamp) == ("", f"no git, no {gitinfo.ENV}, no {stamp}")
    stamp.write_text("abc123\n")
    assert gitinfo.commit_and_source(tmp_path, stamp, "the wheels' stamp") == ("abc123", "the wheels' stamp")
    monkeypatch.setenv(gitinfo.ENV, "baked")
    assert gitinfo.commit_and_source(tmp_path, stamp) == ("baked", gitinfo.ENV)
    assert gitinfo.git_commit(tmp_path) == "baked"
    monkeypatch.delenv(gitinfo.ENV)
    assert gitinfo.git_commit(tmp_path) == ""
