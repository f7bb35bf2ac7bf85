"""scaleladder.log: the rank (and on several nodes the host) in each line, and one level for every process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from scaleladder import log
from scaleladder.cli import command_of, main


@pytest.fixture
def level(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The package's level and SCALELADDER_LOG_LEVEL as they were, after the test (setup() sets both)."""
    root = logging.getLogger(log.ROOT)
    before = root.level
    monkeypatch.setenv(log.LEVEL_ENV, "info")
    yield
    root.setLevel(before)  # setLevel, not the attribute: it clears the children's cached verdicts


def test_prefix_names_the_rank_and_on_several_nodes_the_host() -> None:
    assert log.prefix({}) == ""  # one process: the line as print wrote it
    assert log.prefix({"RANK": "0", "WORLD_SIZE": "1"}) == ""  # a single run's own process group
    assert log.prefix({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, host="h") == "[rank 3] "
    assert log.prefix({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, host="nid00012") == "[rank 5 host nid00012] "
    # srun's tasks of one step, two nodes
    srun = {"SLURM_PROCID": "6", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2", "SLURM_NTASKS": "8"}
    assert log.prefix(srun, host="nid00013") == "[rank 6 host nid00013] "
    # the batch script of a two-node job (the supervisor) is no rank, but it is on one of several hosts
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NUM_NODES": "2"}
    assert log.prefix(batch, host="nid00012") == "[host nid00012] "
    assert log.prefix({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1"}) == ""


def test_a_line_goes_to_stderr_as_given_and_follows_the_level(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch, level: object) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
                "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(var, raising=False)
    one = log.get_logger("scaleladder.test_log")
    log.setup()
    one.info("scaleladder test: working ...")
    assert capsys.readouterr() == ("", "scaleladder test: working ...\n")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    one.warning("scaleladder test: careful")
    assert capsys.readouterr().err == "[rank 1] scaleladder test: careful\n"
    log.setup("warning")
    assert os.environ[log.LEVEL_ENV] == "warning"  # exported: a launcher's ranks inherit it
    one.info("hidden")
    one.warning("shown")
    assert capsys.readouterr().err == "[rank 1] shown\n"


@pytest.mark.process
def test_the_level_flag_and_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], level: object) -> None:
    root = logging.getLogger(log.ROOT)
    assert command_of(["--log-level", "warning", "models"]) == "models"
    assert main(["--log-level", "ERROR", "spawn", "--nproc-per-node", "1", sys.executable, "-c", "pass"]) == 0
    assert root.level == logging.ERROR and os.environ[log.LEVEL_ENV] == "error"
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["--log-level", "loud", "spawn"])
    assert e.value.code == 2 and "--log-level: invalid choice: 'loud'" in capsys.readouterr().err
    monkeypatch.setenv(log.LEVEL_ENV, "loud")
    assert main(["spawn", "--nproc-per-node", "1"]) == 2  # refused before the command starts
    assert capsys.readouterr().err == ("scaleladder spawn: error: SCALELADDER_LOG_LEVEL / --log-level must be one of "
                                       "debug, info, warning, error, got 'loud'\n")


RANK_SCRIPT = textwrap.dedent(
    """
    import torch.distributed as dist
    from scaleladder.log import get_logger
    dist.init_process_group("gloo")  # env://, from the launcher's variables
    say = get_logger("scaleladder.test_log")
    say.info(f"scaleladder test: info from {dist.get_rank()} of {dist.get_world_size()}")
    say.warning(f"scaleladder test: warning from {dist.get_rank()}")
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.mark.process
@pytest.mark.slow
def test_two_gloo_ranks_name_themselves_and_inherit_the_level(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != log.LEVEL_ENV and not k.startswith("SLURM_")}

    def ranks(*top: str) -> list[str]:
        p = subprocess.run([sys.executable, "-m", "scaleladder", *top, "spawn", "--nproc-per-node", "2",
                            sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        return sorted(line for line in p.stderr.splitlines() if "scaleladder test:" in line)

    assert ranks() == ["[rank 0] scaleladder test: info from 0 of 2", "[rank 0] scaleladder test: warning from 0",
                       "[rank 1] scaleladder test: info from 1 of 2", "[rank 1] scaleladder test: warning from 1"]
    # the flag on the launcher reaches the ranks
    assert ranks("--log-level", "warning") == ["[rank 0] scaleladder test: warning from 0",
                                               "[rank 1] scaleladder test: warning from 1"]


@pytest.mark.process
@pytest.mark.slow
def test_a_two_rank_rung_says_who_speaks_and_keeps_its_summary_line(tmp_path: Path) -> None:
    """A real 2-rank gloo rung under `scaleladder spawn`: rank 0's progress is prefixed, the
    summary line (what scripts read) is exactly as before."""
    spec, out = "vit-debug/ddp/fp32/pre-lag/n1/b4", tmp_path / "r.h5"
    env = {k: v for k, v in os.environ.items() if k != log.LEVEL_ENV and not k.startswith("SLURM_")}
    p = subprocess.run([sys.executable, "-m", "scaleladder", "spawn", "--nproc-per-node", "2", sys.executable, "-m",
                        "scaleladder", "run", "--spec", spec, "--steps", "3", "--warmup", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stderr.splitlines()
    assert any(line.startswith(f"[rank 0] scaleladder run: {spec}: building vit-debug") for line in lines), lines
    assert not any(line.startswith("[rank 1]") for line in lines), lines  # progress is rank 0's alone
    assert lines[-1].startswith(f"{spec}: ") and lines[-1].endswith(f"-> {out}"), lines
