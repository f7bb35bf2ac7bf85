"""Fast start: start-up measured per phase and recorded; no torch where a process
only spawns; `scaleladder spawn` starts the ranks of one machine as torchrun would, stops the
rest when one fails and passes a signal on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from conftest import VENV_BIN
from scaleladder.rung import startup

SCALELADDER = os.path.join(VENV_BIN, "scaleladder")


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", **extra}


@pytest.mark.process
@pytest.mark.parametrize("module", ["scaleladder.campaign.supervise", "scaleladder.campaign.maxbatch", "scaleladder.rung.spawn",
                                    "scaleladder.rung.run", "scaleladder.rung.run_config", "scaleladder.rung.oom_record",
                                    "scaleladder.cli"])
def test_the_supervisor_and_launcher_import_no_torch(module: str) -> None:
    """`launch`, `finalize`, `maxbatch` and `spawn` only start processes: torch there cost every rung
    seconds. (The ranks import it themselves: rung.startup.import_rank_modules.)"""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


@pytest.mark.process
def test_process_age_counts_from_the_kernels_start_time() -> None:
    age = startup.process_age_s()
    assert age is not None and 0 < age < 24 * 3600  # this pytest process: started seconds or minutes ago
    # a fresh interpreter's age, taken at once, is well under the time it took to start pytest
    code = "from scaleladder.rung.startup import process_age_s; print(process_age_s())"
    fresh = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 < fresh < age


def test_phases_are_consecutive_and_sum_to_startup() -> None:
    clock = startup.StartupClock()
    for phase in startup.PHASES:
        time.sleep(0.01)
        clock.mark(phase)
    attrs = clock.attrs(teardown_s=0.5)
    phases = [attrs[f"startup_{p}_s"] for p in startup.PHASES]
    assert all(isinstance(p, float) and p >= 0.009 for p in phases[1:])
    assert attrs["startup_s"] == pytest.approx(sum(phases))
    assert attrs["startup_s"] == pytest.approx(clock.marks["first_batch"] - clock.start)
    assert attrs["teardown_s"] == 0.5 and attrs["startup_origin"] == "process start (/proc)"


@pytest.mark.process
def test_a_two_rank_rung_under_spawn_records_its_startup(tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    run = subprocess.run([SCALELADDER, "launch", "--launcher", "scaleladder spawn --nproc-per-node 2 scaleladder",
                          "--spec", "vit-debug/ddp/fp32/pre-lag/n1/b4", "--steps", "4", "--warmup", "1", "--workers", "0",
                          "--out", str(out)], env=env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with h5py.File(out) as f:
        a = dict(f.attrs)
    assert a["status"] == "ok" and a["world_size"] == 2 and a["launcher"] == "spawn"
    phases = [float(a[f"startup_{p}_s"]) for p in startup.PHASES]
    assert all(p >= 0 for p in phases) and float(a["startup_imports_s"]) > 0.1  # torch alone takes longer
    assert float(a["startup_s"]) == pytest.approx(sum(phases))
    assert 0 <= float(a["teardown_s"]) < 60


# TRAP: the ranks share one stdout pipe: each line goes out in ONE write (print with several
# arguments may write piecewise, and the ranks' pieces interleave: seen in CI)
RANK_PROGRAM = """import os, sys, time
rank = int(os.environ["RANK"])
words = ["rank", str(rank), os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"], os.environ["MASTER_ADDR"],
         os.environ["MASTER_PORT"], os.environ["SCALELADDER_LAUNCHER"], str(os.environ.get("OMP_NUM_THREADS"))]
os.write(1, (" ".join(words) + "\\n").encode())
if rank == int(os.environ.get("FAIL_RANK", -1)):
    sys.exit(7)
time.sleep(float(os.environ.get("SLEEP", 0)))
"""


@pytest.mark.process
def test_spawn_gives_every_rank_torchruns_variables(tmp_path: Path) -> None:
    prog = tmp_path / "rank.py"
    prog.write_text(RANK_PROGRAM)
    bare = {k: v for k, v in env().items() if k != "OMP_NUM_THREADS"}  # unset: each rank gets 1, as under torchrun
    run = subprocess.run([SCALELADDER, "spawn", "--nproc-per-node", "3", sys.executable, str(prog)],
                         env=bare, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = sorted(run.stdout.split("\n")[:-1])
    port = lines[0].split()[5]
    assert lines == [f"rank {r} 3 {r} 127.0.0.1 {port} spawn 1" for r in range(3)]


@pytest.mark.process
def test_one_failed_rank_stops_the_others_and_is_the_exit_code(tmp_path: Path) -> None:
    prog = tmp_path / "rank.py"
    prog.write_text(RANK_PROGRAM)
    t0 = time.monotonic()
    run = subprocess.run([SCALELADDER, "spawn", "--nproc-per-node", "2", "--grace", "2", sys.executable, str(prog)],
                         env=env(FAIL_RANK="1", SLEEP="120"), capture_output=True, text=True, timeout=60)
    assert run.returncode == 7
    assert time.monotonic() - t0 < 30  # rank 0 would sleep 120 s: it was stopped


@pytest.mark.process
def test_sigterm_to_spawn_reaches_every_rank(tmp_path: Path) -> None:
    prog = tmp_path / "rank.py"
    prog.write_text(RANK_PROGRAM)
    p = subprocess.Popen([SCALELADDER, "spawn", "--nproc-per-node", "2", "--grace", "2", sys.executable, str(prog)],
                         env=env(SLEEP="120"), stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for _ in range(2):
        p.stdout.readline()  # both ranks are up
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM


@pytest.mark.process
def test_spawn_without_a_program_is_one_line(tmp_path: Path) -> None:
    run = subprocess.run([SCALELADDER, "spawn", "--nproc-per-node", "2"], env=env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "rank program" in run.stderr



def test_the_report_shows_each_rungs_startup(tmp_path: Path) -> None:
    """A record's startup_s survives the aggregate into the report's table, as a column of its own."""
    from conftest import write_rung
    from scaleladder.figures.report import render_markdown
    from scaleladder.results.aggregate import aggregate, read_ladder

    files = [write_rung(tmp_path, "vit-debug/ddp/fp32/pre-lag/n1/b4", startup_s=7.25, teardown_s=0.5),
             write_rung(tmp_path, "vit-debug/fsdp-full/fp32/pre-lag/n1/b4")]  # an older record: no start-up
    ladder = tmp_path / "ladder.h5"
    aggregate([str(f) for f in files], str(ladder))
    rungs, root = read_ladder(str(ladder))
    md = render_markdown(rungs, root, "plots", figures=[])
    header = next(line for line in md.splitlines() if line.startswith("| run spec"))
    col = header.split(" | ").index("start-up s")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[col] for line in md.splitlines() if "vit-debug/" in line and line.startswith("|")}
    assert rows["vit-debug/ddp/fp32/pre-lag/n1/b4"] == "7.25" and rows["vit-debug/fsdp-full/fp32/pre-lag/n1/b4"] == "-"


@pytest.mark.process
def test_bench_startup_prints_every_phase() -> None:
    """benchmarks/bench_startup.py stays runnable (its figures are for a quiet machine, not this test)."""
    from conftest import REPO

    run = subprocess.run([sys.executable, str(REPO / "benchmarks/bench_startup.py"), "--launchers", "spawn", "--repeats", "1",
                          "--ranks", "1", "--steps", "3", "--warmup", "1", "--rungs", "vit-debug/ddp/fp32/pre-lag/n1/b4"],
                         env=env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    row = next(line for line in run.stdout.splitlines() if line.startswith("| vit-debug/ddp"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "spawn" and len(cells) == 10 and all(float(c) >= 0 for c in cells[2:8])
    assert float(cells[9]) >= sum(float(c) for c in cells[2:8])  # the wall holds every phase


@pytest.mark.process
@pytest.mark.parametrize("workers", [0, 2])
def test_a_rank_ends_at_once_with_its_line_printed_and_no_worker_left(tmp_path: Path, workers: int) -> None:
    """`scaleladder run` as a program skips interpreter teardown (cli._exit_without_teardown): its
    summary line is still printed (flushed first), and loader workers never outlive it."""
    data = "synthetic"
    if workers:
        subprocess.run([SCALELADDER, "shard", "--out", str(tmp_path / "sh"), "--samples", "16", "--per-shard", "8",
                        "--image-size", "32", "--quiet"], env=env(), check=True, timeout=120)
        data = str(tmp_path / "sh")
    out = tmp_path / "r.h5"
    run = subprocess.run([SCALELADDER, "run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b4", "--steps", "3", "--warmup", "1",
                          "--workers", str(workers), "--data", data, "--out", str(out)], env=env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].endswith(f"-> {out}") and out.is_file()
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of this rung still running: {left}"


@pytest.mark.process
@pytest.mark.parametrize("model, flava_loaded", [("vit-debug", False), ("flava-debug", True)])
def test_a_rank_imports_only_what_its_rung_uses(tmp_path: Path, model: str, flava_loaded: bool) -> None:
    """No plotting, workflow or report modules in a rank; TorchMultimodal's FLAVA only for FLAVA."""
    code = f"""import sys
from scaleladder import cli
rc = cli._main(["run", "--spec", "{model}/single/fp32/pre-lag/n1/b4", "--steps", "3", "--warmup", "1",
                "--workers", "0", "--out", {str(tmp_path / 'r.h5')!r}])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("matplotlib", "snakemake", "jinja2", "pandas", "sklearn")
               or m.startswith(("scaleladder.figures", "scaleladder.site")))
print(rc, heavy, "torchmultimodal.models.flava.model" in sys.modules)
"""
    run = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=300)
    assert run.stdout.split("\n")[-2] == f"0 [] {flava_loaded}", run.stderr[-2000:]
