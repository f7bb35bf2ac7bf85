"""Two nodes for real: the 2-node Slurm of `.ci/slurm-up --nodes 2`, each node a
network namespace of its own (own address, hostname, slurmd), joined by a bridge.

The slurm-localhost profile climbs 1 and 2 nodes through the real SLURM executor
(profiles/slurm-localhost/multinode.yaml): weak scaling, HYBRID_SHARD (FSDP1 and FSDP2)
with a shard group of one node, and a max-batch search on 2 nodes; every record says
where each rank ran. Bad rendezvous input fails in one line before any training.

Skipped without a cluster of at least 2 idle nodes, except under CI=true, where it must run."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, VENV_BIN, snakemake, snakemake_env, workflow_copy
from scaleladder.results.aggregate import read_ladder

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.process]

PROFILE = ("--profile", "profiles/slurm-localhost")
MULTINODE = ("--configfile", "profiles/slurm-localhost/site.yaml", "profiles/slurm-localhost/multinode.yaml")


def _idle_nodes() -> tuple[list[str], str]:
    if not shutil.which("sinfo"):
        return [], "no sinfo on PATH"
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    up = sorted({line.split()[0] for line in out.stdout.splitlines()
                 if len(line.split()) == 2 and line.split()[1].rstrip("*~#") in ("idle", "mixed", "allocated", "completing")})
    return up, f"sinfo says {out.stdout.strip() or out.stderr.strip() or 'nothing'}"


@pytest.fixture(scope="module")
def two_nodes() -> list[str]:
    up, said = _idle_nodes()
    if len(up) < 2:
        why = f"no Slurm cluster of 2 nodes is up ({said})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {why}; .ci/slurm-up --nodes 2 starts one")
        pytest.skip(f"{why}; run .ci/slurm-up --nodes 2")
    return up


@pytest.fixture(scope="module")
def climbed(two_nodes: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    wf = workflow_copy(tmp_path_factory.mktemp("multinode") / "wf")
    snakemake(wf, *PROFILE, *MULTINODE, timeout=900)
    return wf


@pytest.fixture(scope="module")
def jobdir(two_nodes: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for the tests that submit jobs by hand (no workflow run needed)."""
    return workflow_copy(tmp_path_factory.mktemp("jobs") / "wf")


def _rungs(wf: Path) -> dict[str, dict]:
    rungs, _ = read_ladder(str(wf / "results/ladder.h5"))
    return {r["spec"]: r for r in rungs}


def test_weak_scaling_hybrid_and_max_batch_on_two_nodes(climbed: Path, two_nodes: list[str]) -> None:
    rungs = _rungs(climbed)
    assert sorted(rungs) == [
        "vit-debug/ddp/fp32/pre-lag/n1/b4", "vit-debug/ddp/fp32/pre-lag/n2/b4", "vit-debug/fsdp-full/fp32/pre-lag/n2/bmax",
        "vit-debug/fsdp-hybrid2/fp32/pre-lag/n1/b4", "vit-debug/fsdp-hybrid2/fp32/pre-lag/n2/b4",
        "vit-debug/fsdp2-hybrid2/fp32/pf0/n2/b4"]
    for spec, r in rungs.items():
        assert r["status"] == "ok", (spec, r.get("error"))
        assert r["launcher"] == "slurm" and str(r["slurm_job_id"]).isdigit()
        assert r["world_size"] == 2 * int(r["nodes"]) and r["ranks_per_node"] == 2
    # HYBRID_SHARD: sharded inside a node (2 ranks), replicated across the 2 nodes
    assert rungs["vit-debug/fsdp-hybrid2/fp32/pre-lag/n2/b4"]["sharding_ran"] == "fsdp1:HYBRID_SHARD"
    assert rungs["vit-debug/fsdp2-hybrid2/fp32/pf0/n2/b4"]["sharding_ran"].startswith("fsdp2:shard2xreplicate2")
    for spec in ("vit-debug/fsdp-hybrid2/fp32/pre-lag/n2/b4", "vit-debug/fsdp2-hybrid2/fp32/pf0/n2/b4"):
        assert 0.45 < rungs[spec]["param_shard_fraction"] < 0.55  # each rank holds half: sharded over 2, not 4
    mx = rungs["vit-debug/fsdp-full/fp32/pre-lag/n2/bmax"]
    assert mx["max_batch"] == 4  # the site's cap, searched by srun probes on both nodes
    assert (climbed / "results/plots/weak_scaling.png").exists()


def test_every_record_says_where_each_rank_ran(climbed: Path, two_nodes: list[str]) -> None:
    rungs = _rungs(climbed)
    hosts_of = {line.split()[1]: line.split()[0] for line in Path("/etc/hosts").read_text().splitlines()
                if line.strip() and not line.startswith("#") and len(line.split()) >= 2}
    for spec, r in rungs.items():
        placed = json.loads(r["rank_placement"])
        assert [p["rank"] for p in placed] == list(range(r["world_size"])), spec
        hosts = {p["host"] for p in placed}
        assert len(hosts) == int(r["nodes"]), (spec, placed)  # a 2-node rung names two distinct hosts
        assert sorted({p["node"] for p in placed}) == list(range(int(r["nodes"])))
        assert sorted(p["local_rank"] for p in placed) == sorted([0, 1] * int(r["nodes"]))
        first = [p for p in placed if p["node"] == 0]
        assert {p["host"] for p in first} == {placed[0]["host"]}  # srun's block placement: ranks 0-1 on node 0
        if int(r["nodes"]) == 2:
            # the master is the first node's own address on the bridge, not a loopback one
            assert r["master_host"] == placed[0]["host"]
            assert r["master_addr"] == placed[0]["addr"] == hosts_of.get(placed[0]["host"]), (spec, r["master_addr"])
            assert not r["master_addr"].startswith("127.")
            assert len({p["addr"] for p in placed}) == 2
        assert r["master_port"] == 29533  # the profile's MASTER_PORT
    # ... and the report shows it per rung
    report = (climbed / "results/report.md").read_text()
    assert "where ranks ran" in report
    two = rungs["vit-debug/ddp/fp32/pre-lag/n2/b4"]
    placed = json.loads(two["rank_placement"])
    assert f"{placed[0]['host']} ({placed[0]['addr']}): ranks 0-1" in report
    assert f"{placed[2]['host']} ({placed[2]['addr']}): ranks 2-3" in report


def test_too_many_nodes_is_one_line(jobdir: Path, two_nodes: list[str]) -> None:
    out = snakemake(jobdir, *PROFILE, *MULTINODE, "--config", "ladders=[{models: [vit-debug], strategies: [ddp], "
                    "precisions: [fp32], batches: [4], nodes: [3]}]", "-n", check=False, timeout=300)
    assert out.returncode != 0
    assert "3 nodes, but site 'slurm-localhost' launches on at most 2 (site.max_nodes)" in out.stdout + out.stderr


def _run_in_job(wf: Path, nodes: int, command: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``command`` as the batch script of a ``nodes``-node job, waited for; its output."""
    log = wf / f"job-{os.getpid()}-{abs(hash(command))}.log"
    name = f"scaleladder-test-{os.getpid()}"
    try:
        proc = subprocess.run(["sbatch", "--wait", "--no-requeue", f"-J{name}", f"-N{nodes}", "--ntasks-per-node=2", "-c1",
                               "-t", "5", f"--output={log}", "--wrap", command],
                              cwd=wf, env=snakemake_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        subprocess.run(["scancel", "-n", name], timeout=30)  # never leave a pending job to the next test
        raise
    proc.stdout += log.read_text() if log.exists() else ""
    return proc


def _heal(two_nodes: list[str]) -> None:
    """Every node idle again: each slurmd registers anew (`scontrol reconfigure`), and
    .ci/slurm-up restarts a missing slurmd and resumes a node still down.
    TRAP: slurmctld does not ping a node it set DOWN for not responding (Slurm's
    ping_nodes.c, "Do not keep pinging down nodes"), so a node whose link comes back stays
    down* until its slurmd registers again, as a rebooted node's does."""
    subprocess.run(["scontrol", "reconfigure"], timeout=60)
    up = subprocess.run(["bash", str(REPO / ".ci/slurm-up"), "--nodes", str(len(two_nodes))], capture_output=True,
                        text=True, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr


RUN = ("run --spec vit-debug/ddp/fp32/pre-lag/n{n}/b4 --steps 2 --warmup 1 --data synthetic --out {out}")


def test_bad_rendezvous_input_is_one_line_before_training(jobdir: Path, two_nodes: list[str]) -> None:
    exe = os.path.join(VENV_BIN, "scaleladder")
    # a nodelist whose first host resolves nowhere: the master address cannot be found
    # (srun sets each task's SLURM_*_NODELIST itself: `env` overrides them after it)
    out = _run_in_job(jobdir, 2, "OMP_NUM_THREADS=1 srun -N2 -n4 -K env SLURM_STEP_NODELIST=nosuch-node[1-2] "
                      f"SLURM_JOB_NODELIST=nosuch-node[1-2] {exe} " + RUN.format(n=2, out="bad1.h5"))
    msg = [line for line in out.stdout.splitlines() if "does not resolve" in line]
    assert out.returncode != 0 and len(msg) == 1, out.stdout[-3000:]
    assert "master address 'nosuch-node1' (the first host of the Slurm nodelist 'nosuch-node[1-2]')" in msg[0]
    assert "Traceback" not in out.stdout and not (jobdir / "bad1.h5").exists()
    # the master port already held by a listener on the first node
    port_holder = (f"{VENV_BIN}/python -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                   f"socket.SO_REUSEADDR, 1); s.bind((\"\", 29533)); s.listen(); time.sleep(60)' & sleep 2; ")
    out = _run_in_job(jobdir, 2, port_holder + f"MASTER_PORT=29533 OMP_NUM_THREADS=1 srun -N2 -n4 -K {exe} "
                      + RUN.format(n=2, out="bad2.h5") + "; rc=$?; kill %1; exit $rc")
    msg = [line for line in out.stdout.splitlines() if "already in use" in line]
    assert out.returncode != 0 and len(msg) == 1, out.stdout[-3000:]
    assert msg[0].startswith("scaleladder run: error: master port 29533 on slnode1 is already in use")
    assert "Traceback" not in out.stdout and not (jobdir / "bad2.h5").exists()


def test_names_resolve_on_every_node(two_nodes: list[str]) -> None:
    # each node's hostname is its own and resolves to its own, non-loopback address
    for node in two_nodes:
        addr = socket.gethostbyname(node)
        assert not addr.startswith("127."), (node, addr)


def test_a_launcher_per_node_torchrun_with_c10d_rendezvous(jobdir: Path, two_nodes: list[str]) -> None:
    # The A100 profile's multi-node launch mode in its CPU form (no apptainer, no GPU): srun
    # starts ONE torchrun per node, and torchrun its node's 2 ranks, meeting at a c10d
    # rendezvous on the first node of the job (docs/workflow.md, "Multi-node").
    # The very line of profiles/a100/site.yaml, less apptainer, with this machine's CPUs and torchrun.
    import yaml

    a100 = yaml.safe_load((REPO / "profiles/a100/site.yaml").read_text())["site"]["launcher"]
    launcher = re.sub(r"apptainer exec .*?\"\{image\}\" ", "", a100)
    assert launcher != a100 and " -c64 " in launcher and " torchrun " in launcher
    launcher = (launcher.replace(" -c64 ", " -c2 ").replace(" torchrun ", f" {VENV_BIN}/torchrun ")
                .replace("{nodes}", "2").replace("{ranks_per_node}", "2"))
    out_h5 = jobdir / "torchrun-n2.h5"
    # TRAP (as in the profile): the SLURM plugin's jobstep runs the rule without SLURM_JOB_NODELIST
    job = _run_in_job(jobdir, 2, f"unset SLURM_JOB_NODELIST SLURM_NODELIST; OMP_NUM_THREADS=1 {launcher} "
                      + RUN.format(n=2, out=out_h5))
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr
    from scaleladder.results.store import read_attrs

    r = read_attrs(out_h5)
    assert r["status"] == "ok" and r["launcher"] == "torchrun" and r["world_size"] == 4
    placed = json.loads(r["rank_placement"])
    assert len({p["host"] for p in placed}) == 2 and sorted(p["node"] for p in placed) == [0, 0, 1, 1]
    assert not str(r["master_addr"]).startswith("127.")


# -- a node lost mid-rung ------------------------------------------------------------------------------
# Bounds, and where they are set: srun --kill-on-bad-exit=1 (the profile's launcher) ends the
# rung as soon as one rank dies; a node that stops answering is marked DOWN after
# SlurmdTimeout=30 s (.ci/slurm-up), and with --no-requeue the job ends NODE_FAIL about 40 s
# after the cut instead of waiting out gloo's 600 s collective timeout (rung.launch.init).

LONG = "run --spec vit-debug/ddp/fp32/pre-lag/n2/b4 --steps 100000000 --warmup 1 --data synthetic --out {out}"
FINALIZE = "finalize --rc $rc --spec vit-debug/ddp/fp32/pre-lag/n2/b4 --steps 100000000 --warmup 1 --data synthetic --out {out}"


def _ranks_on(node: str) -> list[int]:
    """Pids of `scaleladder run` ranks in the node's network namespace."""
    out = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True, timeout=30).stdout.split()
    pids = []
    for pid in out:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"scaleladder") for c in cmd) and b"run" in cmd:
            pids.append(int(pid))
    return pids


def _long_rung(wf: Path, out: Path) -> tuple[subprocess.Popen[str], Path]:
    """The rung rule's command shape (srun ... run; finalize --rc), made long, in a 2-node job."""
    exe = os.path.join(VENV_BIN, "scaleladder")
    log = wf / f"{out.name}.log"
    script = (f"OMP_NUM_THREADS=1 srun -N2 -n4 -c1 --kill-on-bad-exit=1 {exe} {LONG.format(out=out)} && rc=0 || rc=$?; "
              f"{exe} {FINALIZE.format(out=out)}")
    proc = subprocess.Popen(["sbatch", "--wait", "--no-requeue", f"-J{LONG_JOB}", "-N2", "--ntasks-per-node=2", "-c1",
                             "-t", "15", f"--output={log}", "--wrap", script], cwd=wf, env=snakemake_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, log


LONG_JOB = f"scaleladder-long-{os.getpid()}"


def _cancel_long_rung() -> None:
    """A long rung left by a failed test would hold both nodes for its 15-minute limit."""
    subprocess.run(["scancel", "-n", LONG_JOB], timeout=30)


def _wait_for_ranks(node: str, proc: subprocess.Popen[str], log: Path, n: int = 2, timeout: float = 420) -> list[int]:
    """The pids of the rung's ranks on ``node``, once the rung has finished its first step.
    TRAP: a fixed sleep after the ranks appear sometimes ended inside the rendezvous on the
    loaded 2-core VM, where a cut is a different failure (seen: sbatch --wait 0, the job
    CANCELLED DUE TO NODE FAILURE); rank 0's "step 1/" progress line (rung/loop.py, in the
    job's log through srun) says the ranks are training. Under a load average of 18 on the
    2 cores (2026-11-27) the rendezvous and model build took about 3 minutes: hence 420 s."""
    # first its turn: another test's job may still hold the nodes (not part of the bound)
    t_queue = time.monotonic()
    while subprocess.run(["squeue", "-h", "-n", LONG_JOB, "-t", "PENDING", "-o", "%i"], capture_output=True, text=True,
                         timeout=30).stdout.strip():
        assert time.monotonic() - t_queue < 600, "the long rung never left the queue"
        time.sleep(2)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pids = _ranks_on(node)
        training = log.exists() and ": step 1/" in log.read_text(errors="replace")
        if len(pids) >= n and training:
            return pids
        assert proc.poll() is None, "the job ended before its ranks trained: " + (log.read_text()[-2000:] if log.exists() else "")
        time.sleep(1)
    raise AssertionError(f"the rung on {node} did not reach its first step within {timeout} s (ranks there: "
                         f"{_ranks_on(node)}): " + (log.read_text()[-2000:] if log.exists() else "no log"))


def _nodes_free(nodes: list[str], timeout: float = 600) -> None:
    """Wait until every node is idle (another test's job may still run); heal one that is down."""
    t0 = time.monotonic()
    while (states := [_node_state(n) for n in nodes]) != ["idle"] * len(nodes):
        if any(st.startswith(("down", "drain", "fail")) for st in states):
            _heal(nodes)
        assert time.monotonic() - t0 < timeout, f"the nodes are {states} after {timeout} s"
        time.sleep(2)


def _node_state(node: str) -> str:
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True, timeout=30).stdout.strip()


def _no_leftovers(folder: Path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(out.name) and p.suffix != ".log"], list(folder.iterdir())


def test_second_nodes_ranks_killed_mid_rung(jobdir: Path, two_nodes: list[str]) -> None:
    out = jobdir / "killed.h5"
    _nodes_free(two_nodes)  # never disturb another test's job
    proc, log = _long_rung(jobdir, out)
    try:
        pids = _wait_for_ranks(two_nodes[1], proc, log)
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, 9)
        proc.wait(timeout=120)
        took = time.monotonic() - t0
    finally:
        _cancel_long_rung()
    assert proc.returncode != 0 and took < 60, took
    said = [line for line in log.read_text().splitlines() if line.startswith("scaleladder: vit-debug/")]
    assert said == ["scaleladder: vit-debug/ddp/fp32/pre-lag/n2/b4: the run failed with exit code 137; no result written"] or \
        (len(said) == 1 and "the run failed with exit code" in said[0]), log.read_text()[-3000:]
    _no_leftovers(jobdir, out)
    # ... and the failed attempt is noted apart from the results, for the report (test_failed_attempts)
    from scaleladder.campaign.supervise import failure_notes

    notes = json.loads(failure_notes(out).read_text())
    assert len(notes) == 1 and "no result written" in notes[0]["reason"], notes


def test_link_cut_mid_rung_ends_node_fail_and_the_rung_reruns(jobdir: Path, two_nodes: list[str]) -> None:
    out = jobdir / "cut.h5"
    _nodes_free(two_nodes)  # never cut a link under another test's job
    proc, log = _long_rung(jobdir, out)
    try:
        _wait_for_ranks(two_nodes[1], proc, log)
    except BaseException:
        _cancel_long_rung()
        raise
    veth = "slv" + two_nodes[1].removeprefix("slnode")  # the node's end of the bridge (.ci/slurm-up)
    subprocess.run(["ip", "link", "set", veth, "down"], check=True, timeout=30)
    t0 = time.monotonic()
    state = ""
    try:
        proc.wait(timeout=180)
        took = time.monotonic() - t0
        said = proc.stdout.read() if proc.stdout else ""
        job_id = said.split("Submitted batch job")[-1].split()[0]
        # (MinJobAge=600 keeps it in slurmctld's memory)
        state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True, timeout=30)
        _cancel_long_rung()
        _heal(two_nodes)  # the node is back; ReturnToService=2 returns it to idle once it registers
    assert took < 120, took
    # NODE_FAIL; or still COMPLETING for the node that was lost (its epilog never ran) with the reason NodeDown
    assert "JobState=NODE_FAIL" in state or ("JobState=COMPLETING" in state and "Reason=NodeDown" in state), state
    # TRAP: sbatch --wait's own exit code after a node failure races Slurm's bookkeeping: seen 0
    # once (2-core VM, 2026-11-27) with the job CANCELLED DUE TO NODE FAILURE in its log and
    # NODE_FAIL as its state. The state is the verdict; a 0 is accepted only beside NODE_FAIL.
    assert proc.returncode != 0 or "JobState=NODE_FAIL" in state, (proc.returncode, state)
    _no_leftovers(jobdir, out)
    t1 = time.monotonic()
    while _node_state(two_nodes[1]) != "idle":
        assert time.monotonic() - t1 < 60, f"{two_nodes[1]} is {_node_state(two_nodes[1])} 60 s after it registered again"
        time.sleep(2)
    # ... and the same rung, rerun, succeeds
    exe = os.path.join(VENV_BIN, "scaleladder")
    again = _run_in_job(jobdir, 2, f"OMP_NUM_THREADS=1 srun -N2 -n4 -c1 -K {exe} " + RUN.format(n=2, out=out))
    assert again.returncode == 0 and out.exists(), again.stdout[-3000:]


def test_a_node_that_never_comes_up(jobdir: Path, two_nodes: list[str]) -> None:
    # The second node's slurmd is gone when the job starts (a node that crashed and never
    # came back, not yet noticed by slurmctld): Slurm still allocates it, and srun cannot
    # launch there. srun gives up after its own connection retries; finalize says so.
    _nodes_free(two_nodes)  # killing a slurmd under another job's feet would fail that job instead
    pidfile = Path(f"/run/slurmd-{two_nodes[1]}.pid")
    pid = int(pidfile.read_text())
    os.kill(pid, 15)
    for _ in range(40):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.25)
    exe = os.path.join(VENV_BIN, "scaleladder")
    out = jobdir / "never.h5"
    run = RUN.format(n=2, out=out)
    t0 = time.monotonic()
    try:
        job = _run_in_job(jobdir, 2, f"OMP_NUM_THREADS=1 srun -N2 -n4 -c1 --kill-on-bad-exit=1 {exe} {run} && rc=0 || rc=$?; "
                          f"{exe} {run.replace('run ', 'finalize --rc $rc ', 1)}", timeout=240)
        took = time.monotonic() - t0
    finally:
        _heal(two_nodes)  # the node comes back: .ci/slurm-up restarts the missing slurmd in place
    assert job.returncode != 0 and took < 120, (took, job.stdout[-3000:])
    said = [line for line in job.stdout.splitlines() if line.startswith("scaleladder: vit-debug/")]
    assert len(said) == 1 and "the run failed with exit code" in said[0] and "no result written" in said[0], job.stdout[-3000:]
    assert f"failed on node {two_nodes[1]}" in job.stdout  # srun names the node it could not reach
    _no_leftovers(jobdir, out)
    again = _run_in_job(jobdir, 2, f"OMP_NUM_THREADS=1 srun -N2 -n4 -c1 -K {exe} {run}")
    assert again.returncode == 0 and out.exists(), again.stdout[-3000:]
