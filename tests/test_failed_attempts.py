"""A rung that fails for any reason but memory (a lost node, a crash) is no result: no rung
file, a non-zero exit, so the next `snakemake` runs it again. Its attempt is noted in
``results/failed/<spec>.h5.json`` and the report lists it, with whether it was redone
(a lost node is recorded as failed, in its log and in the report)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import VENV_BIN, write_rung
from scaleladder.campaign.supervise import failure_notes
from scaleladder.figures import report
from scaleladder.results.aggregate import aggregate

SPEC = "vit-debug/ddp/fp32/pre-lag/n1/b4"


def launch(out: Path, launcher: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run([os.path.join(VENV_BIN, "scaleladder"), "launch", "--launcher", launcher, "--spec", SPEC,
                           "--steps", "3", "--warmup", "1", "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.process
def test_a_failed_launch_is_noted_not_recorded_and_the_report_lists_it(tmp_path: Path) -> None:
    out = tmp_path / "results" / "rungs" / f"{SPEC}.h5"
    # the launcher dies the way a lost node's srun does: a non-zero exit, no rank wrote anything
    for _ in range(2):
        run = launch(out, "sh -c 'kill -TERM $$' --")
        assert run.returncode != 0 and not out.exists()
        assert f"{SPEC}: the run failed with exit code 143; no result written" in run.stderr
    assert failure_notes(out) == tmp_path / "results" / "failed" / f"{SPEC}.h5.json"
    assert not [p for p in (tmp_path / "results" / "rungs").rglob("*") if p.is_file()]  # results only, none yet
    notes = json.loads(failure_notes(out).read_text())
    assert [n["rc"] for n in notes] == [143, 143] and all("killed by SIGTERM" in n["reason"] for n in notes)
    assert not list(failure_notes(out).parent.glob("*.tmp*"))

    # the next run redoes it (here: a record as the runner writes it), and the report says both
    write_rung(tmp_path, SPEC)
    ladder = tmp_path / "results" / "ladder.h5"
    aggregate([str(out)], str(ladder))
    md = tmp_path / "report.md"
    html = tmp_path / "report.html"
    plots = tmp_path / "results" / "plots"
    plots.mkdir()
    args = argparse.Namespace(ladder=str(ladder), plots=str(plots), html=str(html), md=str(md), converge=[])
    assert report.main(args) == 0
    section = md.read_text().split("## Failed attempts\n\n", 1)[1]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert len(lines) == 2 and all(SPEC in line and "killed by SIGTERM" in line and line.endswith("; redone since")
                                   for line in lines)
    assert "<h2>Failed attempts</h2>" in html.read_text()


def test_a_ladder_without_failures_has_no_such_section(tmp_path: Path) -> None:
    out = write_rung(tmp_path, SPEC)
    ladder = tmp_path / "results" / "ladder.h5"
    aggregate([str(out)], str(ladder))
    assert report.with_failures("text", str(ladder), html_page=False) == "text"
