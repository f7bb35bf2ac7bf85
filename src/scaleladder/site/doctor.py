"""`scaleladder doctor --profile NAME [--compute] [--rehearse] [--only|--skip NAME,...] [--list]`: what would make
a campaign fail or lie, found on the login node in seconds, before anything is queued.

The checks (``doctor_checks``) print one line per finding, ``FATAL``/``WARN``/``ok`` + what is wrong +
the fix; exit 1 when any is fatal. ``--compute`` then runs one tiny job through the site's launcher
(``campaign/probe.py`` on the compute node). The reasoning: docs/workflow.md, "Before submitting".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scaleladder.errors import SpecError
from scaleladder.site import commands as swf
from scaleladder.site.doctor_checks import CHECKS, DRIVER_FLOOR, FATAL, OK, WARN, Context, Finding, compile_toolchain, run_checks, select
from scaleladder.site.profiles import fill_site, load_profile
from scaleladder.spec import RunSpec

# -- --compute: one tiny job through the site's launcher ------------------------------------


def compute_script(ctx: Context, out: Path, nodes: int) -> str:
    """The batch script: the site's exports and prologue, then the launcher starting 2 ranks of
    ``doctor --probe`` (inside the image where the site uses one)."""
    if ctx.profile.ladder is None:
        raise SpecError(f"profile {ctx.profile.name}: {ctx.profile.config_error}")
    site = ctx.profile.ladder.settings.site
    ranks = 2
    launcher = fill_site(site.launcher, site, ctx.rpn, nodes, ranks)
    device = f" --probe-device {site.device}"
    if site.supervise == "launch" and "torchrun" in launcher:
        # the launcher runs inside what site.scaleladder starts (the image), as `launch` does
        inner = launcher.replace(f"--nproc-per-node {ctx.rpn}", f"--nproc-per-node {ranks}")
        cmd = f"{swf.fill(site.scaleladder, site, ctx.rpn)} doctor --probe {shlex.quote(str(out))}{device} --probe-via {shlex.quote(inner)}"
    else:
        cmd = f"{launcher} doctor --probe {shlex.quote(str(out))}{device}"
    prologue = fill_site(site.prologue, site, ctx.rpn, nodes, ranks).strip()
    return ("#!/bin/bash\nset -euo pipefail\n" + f"cd {shlex.quote(str(ctx.profile.repo))}\n" + swf.env_exports(site).replace("; ", "\n")
            + (prologue + "\n" if prologue else "") + cmd + "\n")


def sbatch_args(ctx: Context, nodes: int, log: Path) -> list[str]:
    res = ctx.profile.resources("rung", nodes)
    args = ["--wait", "--parsable", "--job-name=scaleladder-doctor", f"--output={log}", f"--nodes={nodes}", "--time=10"]
    tasks = int(res.get("tasks_per_node") or 0)
    args.append(f"--ntasks-per-node={2 // nodes if tasks else 1}")
    if res.get("cpus_per_task"):
        args.append(f"--cpus-per-task={res['cpus_per_task']}")
    if res.get("gpu"):
        args.append(f"--gpus={res['gpu']}")
    if res.get("slurm_account") and not ctx.profile.smk.get("slurm-no-account"):
        args.append(f"--account={res['slurm_account']}")
    if res.get("slurm_partition"):
        args.append(f"--partition={res['slurm_partition']}")
    args += shlex.split(str(res.get("slurm_extra") or ""))
    return args


def _no_gpu_why(report: Mapping[str, Any], cuda: Any, driver: Any, floor: int, old_driver: bool) -> str:
    """Why the ranks see no GPU, as far as the probe's report tells."""
    if old_driver:
        return (f"NVIDIA driver {driver} is older than the {floor} that the image's CUDA {cuda} needs, so torch sees no GPU; "
                "build the CUDA image with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128")
    if cuda and not driver:
        return (f"no NVIDIA driver on {report.get('hostname')} (/proc/driver/nvidia/version unreadable) for the image's "
                f"CUDA {cuda}; check the partition and the job's GPU request")
    if report.get("hip_version"):
        return (f"the image's ROCm {report['hip_version']} build sees none under amdgpu driver "
                f"{report.get('amdgpu_driver') or 'unreadable'} (check apptainer --rocm, the job's GPU request, and that "
                "the node's amdgpu driver supports this ROCm: AMD's user-space/kernel-driver support matrix)")
    return "check apptainer --nv/--rocm and the job's GPU request"


def read_probe(ctx: Context, report: Mapping[str, Any]) -> list[Finding]:
    """The findings of the probe's report from the compute node (``campaign/probe.py``)."""
    expected = ctx.rpn if ctx.gpu_site else 0
    seen = int(report.get("gpus_seen", 0))
    cuda, driver = report.get("cuda_version"), report.get("nvidia_driver")
    floor = DRIVER_FLOOR.get(int(str(cuda).split(".")[0]), 0) if cuda else 0
    old_driver = bool(cuda and driver and int(str(driver).split(".")[0]) < floor)
    out = []
    if ctx.gpu_site and seen == 0:
        # TRAP: under a driver older than the build's floor (CUDA 13 wheels: 580) torch sees NO GPU
        # at all, and every rung would fail with NoGPUError; name the driver, not the bind flags.
        why = _no_gpu_why(report, cuda, driver, floor, old_driver)
        out.append(Finding(FATAL, f"compute: the ranks see no GPU where the site expects {expected} per node "
                                  f"({report.get('gpu_expected') or 'site.device cuda'}): {why}"))
        if old_driver:
            return out  # said: the rest of the probe ran on no GPU
    else:
        out.append(Finding(OK, f"compute: GPUs seen {seen} per rank's node, expected {expected} ({report.get('hostname')})"))
    if cuda and driver:
        if old_driver:
            out.append(Finding(FATAL, f"compute: NVIDIA driver {driver} is older than the {floor} that the image's CUDA {cuda} needs; "
                                      "build the CUDA image with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128"))
        else:
            out.append(Finding(OK, f"compute: NVIDIA driver {driver} runs the image's CUDA {cuda}"))
    elif report.get("hip_version"):
        out.append(Finding(OK, f"compute: ROCm {report['hip_version']} build, amdgpu driver {report.get('amdgpu_driver') or 'unreadable'}"))
    bw = float(report.get("busbw_gbps", 0.0))
    line = (f"compute: 2-rank all-reduce ({report.get('backend')}, {len(report.get('hosts', []))} node(s)) "
            f"{bw:.2f} GB/s bus bandwidth")
    if not report.get("allreduce_ok", False):
        out.append(Finding(FATAL, line + ": WRONG SUM, the network corrupts data"))
    elif ctx.gpu_site and len(report.get("hosts", [])) > 1 and bw < 5.0:
        out.append(Finding(FATAL, line + ": far below Slingshot/InfiniBand; NCCL/RCCL fell back to TCP sockets (check the plugin)"))
    else:
        out.append(Finding(OK, line))
    return out + compile_toolchain(ctx, report)


def run_compute(ctx: Context, timeout_s: int) -> list[Finding]:
    """Submit the probe job (``sbatch --wait``) and read what it reports."""
    prof = ctx.profile
    if prof.executor != "slurm" or not ctx.which("sbatch"):
        return [Finding(FATAL, f"compute: needs sbatch on PATH and a SLURM profile (profile {prof.name} runs {prof.executor})")]
    nodes = 2 if ctx.max_nodes > 1 else 1
    folder = prof.repo / "results" / "doctor"
    folder.mkdir(parents=True, exist_ok=True)
    out, log = folder / "compute.json", folder / "compute.log"
    out.unlink(missing_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".sh", dir=folder, delete=False) as f:
        f.write(compute_script(ctx, out, nodes))
    try:
        run = subprocess.run(["sbatch", *sbatch_args(ctx, nodes, log), f.name], capture_output=True, text=True,
                             env=ctx.env, timeout=timeout_s, cwd=prof.repo)
    except subprocess.TimeoutExpired:
        return [Finding(FATAL, f"compute: the probe job did not end within {timeout_s} s (queue wait?); see {log}")]
    finally:
        os.unlink(f.name)
    if run.returncode != 0 or not out.exists():
        tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
        return [Finding(FATAL, f"compute: the probe job failed (sbatch rc {run.returncode}: "
                               f"{run.stderr.strip() or ' | '.join(tail) or 'no output'}); see {log}")]
    return read_probe(ctx, json.loads(out.read_text()))


def rehearse_profile(profile: str, repo: Path, overrides: Mapping[str, object] | None = None, jobs: int = 1,
                     trace: bool = True, bound: float | None = None, out: Callable[[str], None] = print) -> int:
    """``scaleladder rehearse``: the profile's ladder (``select`` applied) rehearsed by campaign/rehearse.py.
    Bad input is a SpecError (one line, exit 2): no ladder, a ``select`` selecting nothing, a rung at a
    world size its strategy cannot take."""
    from scaleladder.campaign import rehearse as rh
    from scaleladder.planner.memory import predict
    from scaleladder.site import ladder as site_ladder

    prof = load_profile(profile, repo, plan=True, overrides=overrides)
    if not (prof.config or {}).get("ladders"):
        raise SpecError(f"profile {profile} has no ladder to rehearse (no 'ladders' in its config)")
    if prof.config_error or prof.ladder is None:
        raise SpecError(f"profile {profile}: {prof.config_error}")
    ladder = prof.ladder
    worlds = [w for w in ladder.skipped if "does not divide the world size" in w]
    if worlds:
        raise SpecError(f"profile {profile}: {len(worlds)} rung(s) at a world size the strategy cannot take, first {worlds[0]}")
    rpn, device = ladder.ranks_per_node, ladder.settings.site.plan_device or ""

    def why(spec: RunSpec) -> str:
        world, r = site_ladder.rank_args(spec, rpn)
        p = predict(spec, world, r, device)
        cap = f" of {p.capacity_bytes / rh.GIB:.2f}" if p.capacity_bytes else ""
        return f"e.g. {spec.path} needs {p.peak_bytes / rh.GIB:.1f} GiB{cap} on {device}"

    rungs = [(s, site_ladder.rank_args(s, rpn)[0]) for s in ladder.selected]
    return rh.rehearse(rungs, ladder.predicted_oom, ladder.config["ladders"], why, jobs, trace,
                       rh.PEAK_BOUND if bound is None else bound, out, f"profile {profile}, ")


def add_rehearse_arguments(p: argparse.ArgumentParser) -> None:
    from scaleladder.campaign.rehearse import PEAK_BOUND

    p.add_argument("--profile", required=True, help="a folder name under profiles/")
    p.add_argument("--config", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides as Snakemake's --config takes them (select={models: [vit-base]})")
    p.add_argument("--repo", default=".", help="the workflow's folder (default: here)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: the CPUs)")
    p.add_argument("--no-trace", action="store_true", help="build and wrap every rung; trace none")
    p.add_argument("--bound", type=float, default=PEAK_BOUND,
                   help=f"a traced peak's planned/tracked - 1 that fails the rehearsal (default {PEAK_BOUND})")


def rehearse_main(args: argparse.Namespace) -> int:
    from scaleladder.site.profiles import parse_config

    return rehearse_profile(args.profile, Path(args.repo).resolve(), parse_config(args.config) or None, args.jobs,
                            not args.no_trace, args.bound)


def run_rehearse(ctx: Context) -> list[Finding]:
    """``--rehearse``: :func:`rehearse_profile` on the profile; each of its FAIL lines a FATAL finding, its
    summary an ok one (opt-in: on a whole campaign it takes minutes, not seconds)."""
    lines: list[str] = []
    try:
        rehearse_profile(ctx.profile.name, ctx.profile.repo, out=lines.append, jobs=os.cpu_count() or 1)
    except SpecError as e:
        return [Finding(FATAL, f"rehearse: {e}")]
    out = [Finding(FATAL, f"rehearse: {ln[5:]}") for ln in lines if ln.startswith("FAIL")]
    return out + [Finding(OK if not out else WARN, lines[-1])] if lines else out


# -- the command ----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = ", ".join(CHECKS)
    p.add_argument("--profile", help="a folder name under profiles/")
    p.add_argument("--compute", action="store_true", help="also submit one tiny job through the site's launcher")
    p.add_argument("--only", metavar="NAME[,NAME]", help=f"run only these checks ({names})")
    p.add_argument("--skip", metavar="NAME[,NAME]", help="run all checks but these")
    p.add_argument("--list", action="store_true", help="list the checks, each with what it checks, and exit")
    p.add_argument("--repo", default=".", help="the workflow's folder (default: here)")
    p.add_argument("--rehearse", action="store_true",
                   help="also rehearse the campaign: every rung built and wrapped at its world size on fake tensors, one "
                        "of each kind traced, empty seed panels named (scaleladder rehearse; a whole campaign takes minutes)")
    p.add_argument("--timeout", type=int, default=3600, help="seconds to wait for the --compute job (queue included)")
    p.add_argument("--fs-root", default="", help=argparse.SUPPRESS)  # tests: a fake filesystem layout
    p.add_argument("--probe", metavar="OUT", help=argparse.SUPPRESS)  # the per-rank probe of --compute
    p.add_argument("--probe-device", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--probe-via", help=argparse.SUPPRESS)  # a launcher to start the probe's ranks with


def main(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    if args.probe:
        if args.probe_via:
            cmd = shlex.split(args.probe_via) + ["doctor", "--probe", args.probe, "--probe-device", args.probe_device]
            return subprocess.call(cmd)
        from scaleladder.campaign.probe import run

        run(args.probe, args.probe_device)
        return 0
    if args.list:
        for c in CHECKS.values():
            out(f"{c.name:12} {c.about}")
        return 0
    checks = select(args.only, args.skip)
    if not args.profile:
        raise SpecError("doctor needs --profile NAME (a folder under profiles/)")
    ctx = Context(load_profile(args.profile, Path(args.repo).resolve()), fs_root=args.fs_root)
    findings = run_checks(ctx, checks)
    if args.compute and not any(f.level == FATAL for f in findings):
        findings += run_compute(ctx, args.timeout)
    elif args.compute:
        findings.append(Finding(WARN, "compute: not submitted, fix the FATAL lines first (a job would only fail on them)"))
    if getattr(args, "rehearse", False):
        findings += run_rehearse(ctx)
    for f in findings:
        out(f.line())
    fatal = sum(f.level == FATAL for f in findings)
    out(f"doctor: {fatal} fatal, {sum(f.level == WARN for f in findings)} warnings (profile {args.profile})")
    return 1 if fatal else 0
