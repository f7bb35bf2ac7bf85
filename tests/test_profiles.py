"""Every profile, dry-run: the exact launch line each site would run for a rung, the
resources its jobs would be submitted with, its ladder; and no site detail outside
profiles/."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO, VENV_BIN, snakemake, snakemake_env, workflow_copy
from scaleladder.site import schedule as site_schedule
from scaleladder.site.profiles import load_profile
from scaleladder.spec import RunSpec

ARGS = "--steps {steps} --warmup {warmup} --data {data} --workers {workers} --seed 0 --out {out}"


def dry_run(wf: Path, profile: str, *targets: str, **env: str) -> str:
    return snakemake(wf, "--profile", f"profiles/{profile}", "-n", "-p", *targets, **env).stdout


def shell_of(out: str, rule: str, output: str) -> str:
    """The `Shell command:` of the job of `rule` that writes `output`."""
    for block in out.split("\nrule ")[1:] + out.split("\nlocalrule ")[1:]:
        if block.startswith(f"{rule}:") and f"output: {output}" in block:
            return re.search(r"Shell command: (.*)", block).group(1)  # type: ignore[union-attr]
    raise AssertionError(f"no {rule} job writing {output} in:\n{out[-3000:]}")


def resources_of(out: str, rule: str, output: str) -> dict[str, str]:
    for block in out.split("\nrule ")[1:]:
        if block.startswith(f"{rule}:") and f"output: {output}" in block:
            line = re.search(r"resources: (.*)", block).group(1)  # type: ignore[union-attr]
            return dict(kv.split("=", 1) for kv in line.split(", "))
    raise AssertionError(f"no {rule} job writing {output}")


def job_counts(out: str) -> dict[str, int]:
    table = out[out.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="module")
def wf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return workflow_copy(tmp_path_factory.mktemp("profiles") / "wf")


@pytest.mark.process
def test_frontier_srun_apptainer_rocm(wf: Path) -> None:
    rung = "results/rungs/vit-5b/fsdp-hybrid2/bf16-mixed/pre-lag/n2/b32.h5"
    out = dry_run(wf, "frontier", rung, SCALELADDER_SLURM_ACCOUNT="abc123")
    cmd = shell_of(out, "rung", rung)
    # every path a shell expands is quoted, so a checkout path with a space stays one word
    image = '"${SCALELADDER_IMAGE:-$PWD/containers/scaleladder-rocm.sif}"'
    plugin_dir = "${SCALELADDER_RCCL_NET_PLUGIN%/*}"
    launcher = (
        "srun -N2 -n16 -c7 --gpus-per-task=1 --gpu-bind=closest --kill-on-bad-exit=1 "
        'apptainer exec --rocm --workdir "$PWD" --bind "/opt/cray,/var/spool/slurmd,/lustre/orion,'
        "/usr/lib64/libcxi.so.1:/opt/host-lib64/libcxi.so.1,/usr/lib64/libjansson.so.4:/opt/host-lib64/libjansson.so.4,"
        f'{plugin_dir}" {image} scaleladder'
    )
    args = ARGS.format(steps=40, warmup=10, data="results/shards/224px/manifest.json", workers=6, out=rung)
    spec = "--spec vit-5b/fsdp-hybrid2/bf16-mixed/pre-lag/n2/b32"
    log = "results/logs/rungs/vit-5b/fsdp-hybrid2/bf16-mixed/pre-lag/n2/b32.log"
    # OLCF's RCCL-over-Slingshot settings, the plugin forced by path and (on >1 node) by name
    env = (
        'export MASTER_PORT="3442"; '
        'export NCCL_NET_PLUGIN="${SCALELADDER_RCCL_NET_PLUGIN:?set SCALELADDER_RCCL_NET_PLUGIN to librccl-net.so, see scaleladder doctor}"; '
        'export NCCL_NET="$([ ${SLURM_JOB_NUM_NODES:-1} -gt 1 ] && echo OFI || echo Socket)"; '
        'export NCCL_CROSS_NIC="1"; export NCCL_NET_GDR_LEVEL="PHB"; export NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"; '
        'export HSA_FORCE_FINE_GRAIN_PCIE="1"; export FI_MR_CACHE_MONITOR="kdreg2"; export FI_CXI_DISABLE_HOST_REGISTER="1"; '
        'export FI_CXI_DEFAULT_CQ_SIZE="131072"; export FI_CXI_DEFAULT_TX_SIZE="2048"; export FI_CXI_RX_MATCH_MODE="hybrid"; '
        'export FI_CXI_RDZV_PROTO="alt_read"; export FI_CXI_RDZV_EAGER_SIZE="0"; export FI_CXI_RDZV_THRESHOLD="0"; '
        'export FI_CXI_RDZV_GET_MIN="0"; '
        'export MIOPEN_USER_DB_PATH="/tmp/miopen-$USER"; export MIOPEN_CUSTOM_CACHE_DIR="/tmp/miopen-$USER"; '
        f'export APPTAINERENV_LD_LIBRARY_PATH="{plugin_dir}:${{SCALELADDER_LIBFABRIC:-/opt/cray/libfabric/2.3.1}}/lib64:/opt/host-lib64"; '
        'export HDF5_USE_FILE_LOCKING="FALSE"; export OMP_NUM_THREADS="1"; '
    )
    assert cmd == (
        f"rm -f {rung}.oom-rank*.json; {env}srun -N2 --ntasks-per-node=1 mkdir -p /tmp/miopen-$USER; "
        f"{launcher} run --device cuda {spec} {args} > {log} 2>&1 && rc=0 || rc=$?; "
        f'apptainer exec --workdir "$PWD" --bind /lustre/orion {image} scaleladder finalize --rc $rc --device cuda {spec} {args} >> {log} 2>&1'
    )
    assert "torchrun" not in out  # srun starts the ranks on Frontier, never torchrun
    res = resources_of(out, "rung", rung)
    assert res["nodes"] == "2" and res["tasks_per_node"] == "8" and res["cpus_per_task"] == "7"
    assert res["mpi"] == "srun" and res["slurm_account"] == "abc123" and res["slurm_partition"] == "batch"


# the seed blocks, the ViT-15B AC block (3 AC forms x 4 node counts: the 15B panel of Figures 2-3), the FSDP2 blocks
FRONTIER_RUNGS = (18 + 6 * 7 * 4 - 3) + 3 * 4 + (9 + 6 * 6 * 4 - 3)


@pytest.mark.process
def test_frontier_ladder_is_the_vit_seed(wf: Path) -> None:
    out = dry_run(wf, "frontier", "--config", "site={pack: false}")  # a job per rung (packed: test_workflow_logic's PACKED)
    counts = job_counts(out)
    # Figure 1: 3 strategies x 6 knob sets at 8 nodes; Figures 2-3: 6 models x 7 strategies
    # x nodes 1/2/4/8; 3 rungs are in both. Beside them, FSDP2's prefetch block
    # (3 x pf0..pf2 at 8 nodes) and FSDP2 + compile weak scaling (6 models x 6 strategies x 4),
    # again with 3 rungs in both. Each is either run or, when the planner says it cannot fit
    # a 64 GB GCD, recorded as predicted-oom without an allocation (never a compiled rung:
    # its planned memory is only an upper bound).
    assert counts["rung"] + counts["predicted_oom"] == FRONTIER_RUNGS
    assert "results/rungs/vit-15b/fsdp2-full-compile/bf16-mixed/pf0/n1/b32.h5" in out
    for spec in ("vit-base/fsdp-hybrid1/bf16-mixed/pre-lag/n8/b32", "vit-5b/fsdp-grad-op/bf16-mixed/none-nolag/n8/b32",
                 "vit-3b/fsdp-hybrid2/bf16-mixed/pre-lag/n1/b32"):
        assert f"results/rungs/{spec}.h5" in out and f"results/predicted/{spec}.h5" not in out
    # the seed's own verdicts: 5B and 15B do not fit replicated on one GCD, 3B does not with DDP's extras either
    for spec in ("vit-15b/ddp/bf16-mixed/pre-lag/n1/b32", "vit-15b/fsdp-hybrid1/bf16-mixed/pre-lag/n8/b32",
                 "vit-5b/ddp/bf16-mixed/pre-lag/n4/b32"):
        assert f"results/predicted/{spec}.h5" in out and f"results/rungs/{spec}.h5" not in out
    assert "srun -N8 -n64 -c7" in out and "rung_max" not in counts


@pytest.mark.process
def test_predicted_oom_rungs_are_recorded_on_the_login_node(wf: Path) -> None:
    spec = "vit-15b/ddp/bf16-mixed/pre-lag/n2/b32"
    out = dry_run(wf, "frontier", f"results/predicted/{spec}.h5")
    image = '"${SCALELADDER_IMAGE:-$PWD/containers/scaleladder-rocm.sif}"'
    cmd = shell_of(out, "predicted_oom", f"results/predicted/{spec}.h5")
    assert f'apptainer exec --workdir "$PWD" --bind /lustre/orion {image} scaleladder launch --plan-only --plan-device mi250x-gcd ' \
           f"--ranks-per-node 8 --spec {spec} " in cmd
    assert "srun" not in cmd  # a local rule: no allocation for a certain OOM
    assert re.search(r"localrules:\s+predicted_oom,", (REPO / "workflow/rules/ladder.smk").read_text())
    # the switch runs them all for real instead
    out = dry_run(wf, "frontier", "--config", "run_predicted_oom=true", "site={pack: false}")
    assert "predicted_oom" not in job_counts(out) and job_counts(out)["rung"] == FRONTIER_RUNGS


@pytest.mark.process
def test_a100_torchrun_inside_apptainer_nv(wf: Path) -> None:
    fixed = "results/rungs/flava-2.7b/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8.h5"
    mx = "results/rungs/flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax.h5"
    out = dry_run(wf, "a100", fixed, mx)
    sl = "scaleladder"  # the supervisor runs on the host (it calls srun); the ranks in the image
    launcher = ("'srun -N1 -n1 --ntasks-per-node=1 -c64 --kill-on-bad-exit=1 apptainer exec --nv --workdir \"$PWD\" "
                "\"${SCALELADDER_IMAGE:-$PWD/containers/scaleladder-cuda.sif}\" torchrun --nnodes 1 --nproc-per-node 8 "
                "--rdzv-backend c10d --rdzv-endpoint \"$(scontrol show hostnames \"${SLURM_JOB_NODELIST:-$(squeue -h -j "
                "\"$SLURM_JOB_ID\" -o %N)}\" | head -n1):29500\" --rdzv-id \"$SLURM_JOB_ID\" -m scaleladder'")
    env = ('export NCCL_DEBUG="WARN"; export TORCH_NCCL_ASYNC_ERROR_HANDLING="1"; export OMP_NUM_THREADS="1"; '
           'export HDF5_USE_FILE_LOCKING="FALSE"; ')
    # the max-batch rung runs fewer steps: 1000 of them are predicted past the site's 240 min (site/schedule.py)
    for rule, verb, plan, target, spec, steps in (
            ("rung", "launch", "--ranks-per-node 8 --device cuda", fixed, "flava-2.7b/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8", 1000),
            # ... and its record says how many were configured (--shortened-from: steps_configured)
            ("rung_max", "maxbatch", "--plan-device a100-40gb --ranks-per-node 8 --device cuda --shortened-from 1000", mx,
             "flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax", _steps(wf, "a100", "flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/bmax"))):
        assert (steps < 1000) == (rule == "rung_max")
        args = ARGS.format(steps=steps, warmup=100, data="results/shards/224px/manifest.json", workers=7, out=target)
        log = target.replace("results/rungs/", "results/logs/rungs/").replace(".h5", ".log")
        assert shell_of(out, rule, target) == f"{env}{sl} {verb} --launcher {launcher} {plan} --spec {spec} {args} > {log} 2>&1"
        res = resources_of(out, rule, target)
        assert res["nodes"] == "1" and res["gres"] == "gpu:8" and res["slurm_extra"] == "--exclusive"
        assert res["tasks_per_node"] == "8" and res["mpi"] == "srun"  # the launcher's srun: one torchrun per node
    whole = dry_run(wf, "a100", "--config", "site={pack: false}")  # a job per rung (packed: test_workflow_logic's PACKED)
    full = job_counts(whole)
    # the seed's 6 FLAVA sizes x 3 strategies x {8, max}; beside it the same sizes under the
    # seed's reentrant AC and FSDP2 (3 strategies), and 4 ViT sizes x 8 FSDP1/FSDP2/compile rungs at 32,
    # 5 of them (no AC: those would outrun the time limit) at max; weak scaling of 2 ViT
    # sizes x 5 strategies over 1, 2 and 4 nodes, less the 6 one-node rungs the ViT block already has
    assert full["rung"] + full["rung_max"] + full["predicted_oom"] == 36 + 36 + 4 * 8 + 4 * 5 + 2 * 5 * 3 - 6
    # the multi-node rungs: one torchrun per node on every node of the job, a c10d rendezvous on the first
    n4 = "results/rungs/vit-1b/fsdp-hybrid8/bf16-mixed/pre-lag/n4/b32.h5"
    assert n4 in whole
    cmd = shell_of(dry_run(wf, "a100", n4), "rung", n4)
    assert "'srun -N4 -n4 --ntasks-per-node=1 -c64 " in cmd and " torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d " in cmd
    assert " --ranks-per-node 8 --device cuda --spec vit-1b/fsdp-hybrid8/bf16-mixed/pre-lag/n4/b32 " in cmd
    # A batch that fits at b8 may not fit... and still have a max-batch search: the planner puts
    # FLAVA-1.8B under DDP at a max batch of 4 on 8xA100-40GB (docs/planner.md), so its b8
    # is a predicted OOM while its search runs.
    assert "results/predicted/flava-1.8b/ddp/bf16-mixed/pre-lag/n1/b8.h5" in whole
    assert "results/rungs/flava-1.8b/ddp/bf16-mixed/pre-lag/n1/bmax.h5" in whole
    # ... and FLAVA-10B fits under the seed's reentrant AC and, since the rungs run FLAVA on SDPA
    # (no attention weights returned out of a checkpointed layer), under our default
    # AC too; TorchMultimodal's FLAVA kept every layer's T x T weights and did not fit there.
    assert "results/rungs/flava-10b/fsdp-full-ac-reentrant/bf16-mixed/pre-lag/n1/b8.h5" in whole
    assert "results/rungs/flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8.h5" in whole


@pytest.mark.process
def test_local_spawns_two_cpu_ranks(wf: Path) -> None:
    out = dry_run(wf, "local")
    target = "results/rungs/vit-debug/fsdp-full/fp32/post-nolag/n1/b4.h5"
    args = ARGS.format(steps=12, warmup=2, data="results/shards/32px/manifest.json", workers=0, out=target)
    log = "results/logs/rungs/vit-debug/fsdp-full/fp32/post-nolag/n1/b4.log"
    assert shell_of(out, "rung", target) == (
        'export OMP_NUM_THREADS="1"; export HDF5_USE_FILE_LOCKING="FALSE"; scaleladder launch '
        "--launcher 'scaleladder spawn --nproc-per-node 2 scaleladder' "  # no GPU here: 2 CPU ranks
        f"--ranks-per-node 2 --spec vit-debug/fsdp-full/fp32/post-nolag/n1/b4 {args} > {log} 2>&1"
    )
    mx = "results/rungs/flava-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax.h5"
    assert shell_of(out, "rung_max", mx).startswith(
        'export OMP_NUM_THREADS="1"; export HDF5_USE_FILE_LOCKING="FALSE"; scaleladder maxbatch '
        "--launcher 'scaleladder spawn --nproc-per-node 2 scaleladder' --max-batch-cap 4 "
        "--spec flava-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax --steps 12")
    counts = job_counts(out)
    assert counts["rung"] == 17 and counts["rung_max"] == 4 and counts["shard"] == 2  # 32 px (ViT) and 64 px (FLAVA)
    assert "results/rungs/vit-debug/fsdp2-full/fp32/pf0-u2/n1/b4.h5" in out  # the unit-size block's k = 2
    assert "slurm" not in out and "srun" not in out


@pytest.mark.process
def test_ci_profile_differs_from_frontier_only_in_site_values(wf: Path) -> None:
    rung = "results/rungs/vit-debug/fsdp-full/fp32/pre-lag/n1/b4.h5"
    out = dry_run(wf, "slurm-localhost")
    args = ARGS.format(steps=4, warmup=1, data="results/shards/32px/manifest.json", workers=0, out=rung)
    spec = "--spec vit-debug/fsdp-full/fp32/pre-lag/n1/b4"
    log = "results/logs/rungs/vit-debug/fsdp-full/fp32/pre-lag/n1/b4.log"
    assert shell_of(out, "rung", rung) == (
        f"rm -f {rung}.oom-rank*.json; "
        'export MASTER_PORT="29533"; export OMP_NUM_THREADS="1"; export HDF5_USE_FILE_LOCKING="FALSE"; '
        f"srun -N1 -n2 -c1 --kill-on-bad-exit=1 scaleladder run {spec} {args} > {log} 2>&1 && rc=0 || rc=$?; "
        f"scaleladder finalize --rc $rc {spec} {args} >> {log} 2>&1"
    )
    res = resources_of(out, "rung", rung)
    assert res["mpi"] == "srun" and res["tasks_per_node"] == "2" and res["nodes"] == "1"
    ci, fr = (yaml.safe_load((REPO / "profiles" / p / "site.yaml").read_text())["site"] for p in ("slurm-localhost", "frontier"))
    assert ci["supervise"] == fr["supervise"] == "finalize"  # so the same rule runs in both
    ci_p, fr_p = (yaml.safe_load((REPO / "profiles" / p / "config.v8+.yaml").read_text()) for p in ("slurm-localhost", "frontier"))
    assert ci_p["executor"] == fr_p["executor"] == "slurm"
    assert set(ci_p["set-resources"]["rung"]) <= set(fr_p["set-resources"]["rung"]) | {"mem_mb"}
    assert ci_p["slurm-status-command"] == "squeue"  # no accounting on the localhost cluster


SITE_WORDS = re.compile(r"hsn0|srun|apptainer|torchrun|rocm|--nv\b|frontier|a100|miopen|nccl|3442|lustre|olcf", re.I)


def test_no_site_detail_outside_profiles() -> None:
    files = [REPO / "Snakefile", *sorted((REPO / "workflow").rglob("*.smk")), *sorted((REPO / "config").rglob("*.yaml"))]
    offending = []
    for f in files:
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]  # comments may name the traps; code may not name a site
            if SITE_WORDS.search(code):
                offending.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offending, "\n".join(offending)


ACCOUNT = "abc123"

# The Slurm client tools the SLURM executor plugin (2.x) runs on the submit host before and
# around `sbatch`, each with the smallest answer the plugin parses. TRAP: on a machine without
# Slurm the plugin never reaches sbatch (its account check runs `sacctmgr` and dies on the
# missing binary), and with a real Slurm the answers are that cluster's (the localhost CI
# cluster has no accounting, so sacctmgr fails there and the plugin falls back to sshare).
# First on PATH, these shadow both, so the test sees the same plugin on every machine.
FAKE_SLURM = {
    # accounts.validate_account: `sacctmgr -n -s list user USER format=account%256`, one
    # account per line; an account not listed is refused. sshare is its fallback.
    "sacctmgr": f'echo "{ACCOUNT}"',
    "sshare": f'echo "{ACCOUNT}"',
    # `scontrol show config`: MaxArraySize (utils.get_max_array_size) and MinJobAge
    # (job_status_query.get_min_job_age), both parsed from "Key = value" lines.
    "scontrol": 'case "$*" in\n'
                '  "show config") printf "MaxArraySize            = 1001\\nMinJobAge               = 600 sec\\n" ;;\n'
                '  *) echo "scontrol $*: not faked by the test" >&2; exit 1 ;;\n'
                'esac',
    # `shutil.which("sinfo")` is the plugin's "is this a Slurm host?"; `sinfo -o %P` its
    # default partition (only for a job without slurm_partition) marked by "*".
    "sinfo": 'echo "PARTITION"; echo "batch*"',
    # status queries, the account guess, cancelling: no job was ever accepted, so nothing.
    "squeue": "exit 0",
    "sacct": "exit 0",
    "scancel": "exit 0",
}


def _submit_lines(wf: Path, tmp: Path, profile: str, *targets: str) -> subprocess.Popen[bytes]:
    """Run `snakemake --profile PROFILE TARGETS` with a fake `sbatch` first on PATH that
    records its arguments and refuses the job: what the SLURM plugin really submits. The
    other Slurm tools it asks first are faked beside it (FAKE_SLURM); every call of a fake
    is logged to `slurm-calls-PROFILE.log`, snakemake's own output to `snakemake-PROFILE.log`."""
    bin_dir = tmp / f"bin-{profile}"
    bin_dir.mkdir()
    log = tmp / f"sbatch-{profile}.log"
    calls = tmp / f"slurm-calls-{profile}.log"
    fakes = dict(FAKE_SLURM, sbatch=f'echo "$@" >> {log}\necho "sbatch: refused by the test" >&2\nexit 1')
    for tool, body in fakes.items():
        fake = bin_dir / tool
        fake.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n{body}\n')
        fake.chmod(0o755)
    env = snakemake_env(PATH=f"{bin_dir}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ['PATH']}", SCALELADDER_SLURM_ACCOUNT=ACCOUNT)
    with open(tmp / f"snakemake-{profile}.log", "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([os.path.join(VENV_BIN, "snakemake"), "--profile", f"profiles/{profile}", *targets,
                                 "--slurm-init-seconds-before-status-checks", "1",  # the plugin's 40 s wait, at exit too
                                 "--config", "data={source: synthetic}"], cwd=wf, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def _schedule(wf: Path, profile: str) -> site_schedule.Schedule:
    prof = load_profile(profile, wf, plan=True, overrides={"data": {"source": "synthetic"}})
    assert prof.ladder is not None
    sched = site_schedule.attach(prof.ladder, profile, wf)[1]
    assert sched is not None
    return sched


def _runtime(wf: Path, profile: str, target: str) -> int:
    """The minutes the rung's job asks for (site/schedule.py, as the rule's `runtime`)."""
    return _schedule(wf, profile).runtime_min(RunSpec.from_path(target.removeprefix("results/rungs/").removesuffix(".h5")))


def _steps(wf: Path, profile: str, spec: str) -> int:
    return _schedule(wf, profile).steps(RunSpec.from_path(spec))


def _sbatch_log(tmp: Path, profile: str) -> str:
    log = tmp / f"sbatch-{profile}.log"
    if not log.exists():  # say why instead of a bare FileNotFoundError
        calls = tmp / f"slurm-calls-{profile}.log"
        raise AssertionError(
            f"the {profile} run never called sbatch; Slurm tools it called: "
            f"{calls.read_text() if calls.exists() else 'none'}\n"
            f"snakemake said:\n{(tmp / f'snakemake-{profile}.log').read_text()[-4000:]}")
    return log.read_text()


@pytest.mark.process
def test_sbatch_lines_ask_for_whole_nodes_not_snakemakes_default_memory(tmp_path: Path) -> None:
    """TRAP: Snakemake gives every job mem_mb=1000 unless told otherwise, and the SLURM
    plugin turns it into `sbatch --mem 1000`: 8 ranks of a 10B model killed for host
    memory. The GPU profiles ask for no --mem (the whole node, with --exclusive)."""
    wf = workflow_copy(tmp_path / "wf")
    frontier = "results/rungs/vit-5b/fsdp-hybrid8/bf16-mixed/pre-lag/n2/b32.h5"  # predicted to fit: priced
    a100 = "results/rungs/flava-10b/fsdp-full-ac/bf16-mixed/pre-lag/n1/b8.h5"
    pack = "results/packs/n8-p1.json"  # a pack: one job for the rungs of one node count
    procs = [_submit_lines(wf, tmp_path, "frontier", frontier, pack), _submit_lines(wf, tmp_path, "a100", a100)]
    for p in procs:
        assert p.wait(timeout=300) != 0  # every submission was refused
    lines = {p: _sbatch_log(tmp_path, p) for p in ("frontier", "a100")}
    # each rung's job asks for its own time from the time model (-t), under the site's limit
    t_frontier, t_a100 = _runtime(wf, "frontier", frontier), _runtime(wf, "a100", a100)
    assert 5 < t_frontier < 120 and 5 < t_a100 < 240
    assert f" -A abc123 -p batch -t {t_frontier} --nodes=2 --ntasks-per-node=8 --cpus-per-task=7 --exclusive " \
           "--network=disable_rdzv_get " in lines["frontier"]
    assert f" -A abc123 -p gpu -t {t_a100} --nodes=1 --ntasks-per-node=8 --cpus-per-task=8 --exclusive " in lines["a100"]
    assert " --gres=gpu:8 " in lines["a100"]  # per node (--gpus=8 would be 8 for the whole job)
    # ... and a pack asks for its rungs' time with the margin, in one job of its node count
    assert re.search(r" -A abc123 -p batch -t (\d+) --nodes=8 --ntasks-per-node=8 --cpus-per-task=7 --exclusive "
                     r"--network=disable_rdzv_get ", lines["frontier"])
    assert lines["frontier"].count("\n") == 2
    for line in lines.values():
        assert "--mem" not in line, line


@pytest.mark.process
def test_max_batch_search_settings_come_from_the_config(wf: Path) -> None:
    mx = "results/rungs/flava-debug/fsdp-full-ac/fp32/pre-lag/n1/bmax.h5"
    out = dry_run(wf, "local", mx, "--config", "maxbatch={max_retries: 1, probe_steps: 3, probe_warmup: 1}")
    assert " --max-batch-cap 4 --max-retries 1 --probe-steps 3 --probe-warmup 1 --spec " in shell_of(out, "rung_max", mx)
    bad = snakemake(wf, "--profile", "profiles/local", "-n", "--config", "maxbatch={max_retries: -1}", check=False)
    assert bad.returncode != 0 and "config key 'maxbatch.max_retries'" in bad.stdout + bad.stderr


SITE_VALUES = re.compile(r"hsn0|lustre|3442|/opt/cray|miopen|aws-ofi|olcf|frontier|mi250x-gcd|a100-40gb", re.I)


def _code_tokens(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every token of a Python file but comments and docstrings."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            docstrings.add(body[0].lineno)
    return [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type != tokenize.COMMENT and not (t.type == tokenize.STRING and t.start[0] in docstrings)]


def test_the_package_names_no_site() -> None:
    """Model and strategy code never knows where it runs: no site value in src/ outside
    comments and docstrings (which may name a site's trap). Device *kinds* (the peak and
    memory tables) are hardware, not sites, and are allowed by name."""
    # the device tables, and the seeds' own hardware (planner/seeds.py): device keys, not sites
    allowed = {"devices.py", "device_peak.py", "memory.py", "plan.py", "seeds.py"}
    offending = []
    for f in sorted((REPO / "src" / "scaleladder").rglob("*.py")):
        for line, text in _code_tokens(f):
            m = SITE_VALUES.search(text)
            if m and not (f.name in allowed and m.group(0).lower() in ("mi250x-gcd", "a100-40gb")):
                offending.append(f"{f.relative_to(REPO)}:{line}: {text.strip()[:80]}")
    assert not offending, "\n".join(offending)


@pytest.mark.process
def test_frontier_writes_the_shards_where_snakemake_runs(wf: Path, tmp_path: Path) -> None:
    """site.local_data: a few MB of shards are not worth a whole exclusive Frontier node. The
    shard job runs locally (here it meets a fake apptainer that fails), never through sbatch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for tool in ("sbatch", "apptainer", "sinfo", "squeue", "sacct", "scontrol", "sacctmgr"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        (bin_dir / tool).chmod(0o755)
    env = snakemake_env(PATH=f"{bin_dir}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ['PATH']}", SCALELADDER_SLURM_ACCOUNT="abc123",
                        SCALELADDER_RCCL_NET_PLUGIN="/sw/rccl/lib/librccl-net.so", USER="tester")
    # one rung in the ladder: the DAG is built in seconds, and the shard rule is the same
    out = subprocess.run([os.path.join(VENV_BIN, "snakemake"), "--profile", "profiles/frontier", "results/shards/224px/manifest.json",
                          "--slurm-init-seconds-before-status-checks", "1",  # the plugin's 40 s default wait, at exit too
                          "--config", "ladders=[{models: [vit-base], strategies: [ddp], batches: [32]}]"],
                         cwd=wf, env=env, capture_output=True, text=True, timeout=300)
    log = calls.read_text() if calls.exists() else ""
    assert "localrule shard:" in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    assert "apptainer exec --workdir" in log and "sbatch" not in log


def test_a_missing_or_mistyped_profile_names_the_folder_and_the_profiles_there(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every scaleladder command that takes --profile answers one line naming the folder
    it looked in, the profiles there and the nearest name; from a subfolder, the checkout above."""
    from scaleladder.cli import main as cli
    from scaleladder.errors import SpecError
    from scaleladder.site.profiles import find_profile

    assert find_profile("profiles/frontier", REPO) == REPO / "profiles" / "frontier"  # as snakemake's --profile takes it
    for argv in (["doctor", "--profile", "frontir", "--repo", str(REPO)],
                 ["budget", "--profile", "profiles/frontir", "--repo", str(REPO)]):
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"in {REPO / 'profiles'} (a folder with site.yaml); the profiles there: a100, frontier, local" in err
        assert err.endswith("did you mean 'frontier'?")
    with pytest.raises(SpecError, match=rf"has no profiles/ folder; the checkout is {re.escape(str(REPO))}: run from there, or pass --repo"):
        find_profile("local", REPO / "docs")
    (tmp_path / "lone").mkdir()
    with pytest.raises(SpecError, match="has no profiles/ folder .run from the checkout's root"):
        find_profile("local", tmp_path / "lone")
