"""The doctor's checks, each a unit: a name, one line saying what it checks (``doctor --list``), and a
function that takes a :class:`Context` (the profile, the login node's environment) and returns
:class:`Finding` lines. Register one with ``@check``; ``scaleladder doctor`` runs them in order
(``--only``/``--skip`` choose). What each reads and why: docs/workflow.md, "Before submitting"."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from scaleladder.errors import SpecError
from scaleladder.site.profiles import SiteProfile, bind_entries, bind_sources, bind_specs, expand, fill_site

FATAL, WARN, OK = "FATAL", "WARN", "ok"

#: torch's CUDA major -> the oldest NVIDIA driver that runs it (NVIDIA's CUDA compatibility
#: table; 12.x and 13.x by minor-version compatibility: docs/workflow.md, "Sources")
DRIVER_FLOOR = {13: 580, 12: 525, 11: 450}

#: environment the Slingshot sites list as "strongly recommended ... for both correctness and best
#: performance at scale" for RCCL/NCCL with the libfabric plugin (docs/workflow.md, "Sources")
SLINGSHOT_ENV = ("NCCL_CROSS_NIC", "HSA_FORCE_FINE_GRAIN_PCIE", "FI_MR_CACHE_MONITOR", "FI_CXI_DISABLE_HOST_REGISTER",
                 "FI_CXI_DEFAULT_CQ_SIZE", "FI_CXI_DEFAULT_TX_SIZE", "FI_CXI_RX_MATCH_MODE", "FI_CXI_RDZV_PROTO")

#: filesystems only the node that mounts them sees (``stat -f -c %T`` names); anything else is
#: taken for a network or parallel filesystem, where HDF5's flock-based file locking fails or hangs
LOCAL_FS = ("ext2/ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlayfs", "zfs", "f2fs", "ramfs", "squashfs")

#: rules that take seconds on one core: never worth a cluster job (a rule not named here, a rung
#: or a training job, is the workflow's to place)
LIGHT_RULES = {"aggregate", "plots", "plan_plots", "report", "predicted_oom"}

DEPRECATED_ENV = {"NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                  "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT"}


@dataclass(frozen=True)
class Finding:
    level: str
    what: str

    def line(self) -> str:
        return f"{self.level:5} {self.what}"


@dataclass
class Context:
    """What every check reads: the profile, the login node's environment, and where the site's
    absolute paths are (``fs_root``: a fake layout in tests). Every tool is called by name from
    this PATH (sbatch, sinfo, apptainer, stat), so tests plant faults with fake tools."""

    profile: SiteProfile
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    fs_root: str = ""

    def path(self, p: str) -> Path:
        return Path(self.fs_root + p) if self.fs_root and p.startswith("/") else Path(p)

    def which(self, tool: str) -> bool:
        return shutil.which(tool, path=self.env.get("PATH")) is not None

    @property
    def site(self) -> dict[str, Any]:
        return self.profile.site

    @property
    def rpn(self) -> int:
        return self.profile.ladder.ranks_per_node if self.profile.ladder else 1

    @property
    def max_nodes(self) -> int:
        rungs = self.profile.ladder.rungs if self.profile.ladder else ()
        return max((s.nodes for s in rungs), default=1)

    @property
    def gpu_site(self) -> bool:
        return self.site.get("device") == "cuda"

    @property
    def rocm(self) -> bool:
        return "--rocm" in str(self.site.get("launcher", ""))

    @cached_property
    def env_expansion(self) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """``site.env`` as the job's exports expand it, in order (a later value may use an earlier
        one): the values that expand, and (key, bash's complaint) for those that stop the shell."""
        env, expanded, failed = dict(self.env), {}, []
        for key, value in (self.site.get("env") or {}).items():
            text, why = expand(str(value), env)
            if text is None:
                failed.append((key, why))
                continue
            env[key] = text
            expanded[key] = text
        return expanded, failed

    @property
    def expanded_env(self) -> dict[str, str]:
        return self.env_expansion[0]

    def apptainer(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        env = dict(self.env) | {f"APPTAINERENV_{k[len('APPTAINERENV_'):]}": v for k, v in self.expanded_env.items()
                                if k.startswith("APPTAINERENV_")}
        return subprocess.run(["apptainer", *args], capture_output=True, text=True, env=env, timeout=300)

    def command_lines(self) -> list[tuple[str, str]]:
        """(key, line) of the site's launcher, scaleladder and prologue, filled for the largest rung."""
        if self.profile.ladder is None:  # an invalid config: its own finding says so
            return []
        site, rpn, nodes = self.profile.ladder.settings.site, self.rpn, self.max_nodes
        return [(key, fill_site(str(getattr(site, key)), site, rpn, nodes, nodes * rpn))
                for key in ("launcher", "scaleladder", "prologue") if getattr(site, key)]


# -- the checks: each a name, one line saying what it checks, and a function -----------------


CheckFn = Callable[[Context], list[Finding]]


@dataclass(frozen=True)
class Check:
    name: str
    about: str  # one line: what it checks (`doctor --list`)
    run: CheckFn


#: every check by name, in the order they run (the order of the doctor's lines)
CHECKS: dict[str, Check] = {}


def check(name: str, about: str) -> Callable[[CheckFn], CheckFn]:
    """Register the decorated function as the check ``name``; the order of registration is the order they run."""
    def register(fn: CheckFn) -> CheckFn:
        CHECKS[name] = Check(name, about, fn)
        return fn
    return register


@check("config", "the merged config, through the workflow's own validation; how many rungs")
def check_config(ctx: Context) -> list[Finding]:
    prof = ctx.profile
    if prof.config_error:
        return [Finding(FATAL, f"config: {prof.config_error} (fix profiles/{prof.name}/site.yaml)")]
    assert prof.ladder is not None
    return [Finding(OK, f"config: valid; {len(prof.ladder.rungs)} rungs (scaleladder budget: what they cost)")]


@check("slurm", "the account and partition the SLURM executor submits with (sinfo asked where present)")
def check_slurm(ctx: Context) -> list[Finding]:
    prof = ctx.profile
    if prof.executor != "slurm":
        return []
    out = []
    res = prof.resources("rung")
    account = res.get("slurm_account")
    if not prof.smk.get("slurm-no-account") and not account:
        out.append(Finding(FATAL, "slurm account: none; set SCALELADDER_SLURM_ACCOUNT to your project (e.g. abc123), "
                                  f"or slurm_account in profiles/{prof.name}/config.v8+.yaml"))
    partition = str(res.get("slurm_partition") or "")
    if not partition:
        out.append(Finding(FATAL, "slurm partition: none; set SCALELADDER_SLURM_PARTITION"))
    elif ctx.which("sinfo"):
        run = subprocess.run(["sinfo", "-h", "-p", partition, "-o", "%P"], capture_output=True, text=True, env=ctx.env, timeout=60)
        if run.returncode != 0 or not run.stdout.strip():
            out.append(Finding(FATAL, f"slurm partition {partition!r}: sinfo does not know it; set SCALELADDER_SLURM_PARTITION "
                                      "to one `sinfo -s` lists"))
        else:
            out.append(Finding(OK, f"slurm: account {account or '(none needed)'}, partition {partition}"))
    else:
        out.append(Finding(WARN, "slurm: no sinfo on PATH, so the partition was not checked (run the doctor on the login node)"))
    return out


@check("local-rules", "under SLURM, the light rules (aggregate, plots, report, ...) are local rules, not cluster jobs")
def check_local_rules(ctx: Context) -> list[Finding]:
    """Under a SLURM executor every rule but the rungs' must be a local rule: a few MB of
    shards or a plot as a cluster job costs a whole exclusive node (where the partition
    allocates whole nodes) and hours of queue."""
    prof = ctx.profile
    if prof.executor != "slurm":
        return []
    rules_dir = prof.repo / "workflow" / "rules"
    text = "\n".join(p.read_text() for p in sorted(rules_dir.glob("*.smk")))
    rules = set(re.findall(r"^\s*rule (\w+):", text, re.M))
    local = {name for block in re.findall(r"^localrules:\n((?:\s+\w+,?\n)+)", text, re.M)
             for name in re.findall(r"\w+", block)}
    remote = rules - local
    light = sorted(remote & LIGHT_RULES)
    # big inputs may deserve an allocation (data.slices); site.local_data makes them local rules
    data = [] if ctx.site.get("local_data") else sorted(rules & {"shard", "shard_slice"})
    out = []
    if light:
        out.append(Finding(FATAL, f"workflow: rule(s) {', '.join(light)} would each be a cluster job (a whole node on an "
                                  "exclusive partition) for seconds of work; list them under localrules: in workflow/rules/"))
    if data:
        res = prof.resources("shard")
        out.append(Finding(WARN, f"workflow: {', '.join(data)} run as cluster jobs ({res.get('runtime', '?')} min each; on a "
                                 "partition that allocates whole nodes, a whole node each): for a small data set set "
                                 f"site.local_data: true in profiles/{prof.name}/site.yaml"))
    return out


@check("env", "every site.env value expanded as the job's shell will (set -euo pipefail), and torch's deprecated names")
def check_env(ctx: Context) -> list[Finding]:
    out = [Finding(FATAL, f"site.env.{key}: the job's shell (set -u) stops on it: {why}; set that variable, "
                          "or write ${VAR:-default} in the profile") for key, why in ctx.env_expansion[1]]
    for old, new in DEPRECATED_ENV.items():
        if old in (ctx.site.get("env") or {}):
            out.append(Finding(WARN, f"site.env.{old} is deprecated in torch 2.x; rename it {new}"))
    return out


def _image(ctx: Context, out: list[Finding]) -> str | None:
    """``site.image`` as the job's shell expands it; a FATAL line in ``out`` where it cannot."""
    image = ctx.site.get("image")
    if not image:
        return None
    text, why = expand(str(image), ctx.env)
    if text is None:
        out.append(Finding(FATAL, f"site.image: {why}"))
        return None
    return text


@check("image", "the image exists, is readable, holds the torch build the launcher's --nv/--rocm needs; its driver floor")
def check_image(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    image = _image(ctx, out)
    uses = any("apptainer" in str(ctx.site.get(k, "")) for k in ("launcher", "scaleladder"))
    if image is None or not uses:
        return out
    p = ctx.path(image)
    if not p.is_file():
        return out + [Finding(FATAL, f"image {image}: no such file; build it (containers/scaleladder-*.def) or set SCALELADDER_IMAGE")]
    if not os.access(p, os.R_OK):
        return out + [Finding(FATAL, f"image {image}: not readable by you; chmod a+r it or copy it where you can read it")]
    if not ctx.which("apptainer"):
        return out + [Finding(FATAL, "apptainer: not on PATH (module load apptainer, or the site's equivalent)")]
    probe = "import torch; print(torch.__version__, torch.version.cuda, getattr(torch.version, 'hip', None))"
    run = ctx.apptainer(["exec", str(p), "python", "-c", probe])
    if run.returncode != 0:
        return out + [Finding(FATAL, f"image {image}: python/torch does not start in it: {(run.stderr.strip().splitlines() or ['?'])[-1]}")]
    torch_v, cuda_v, hip_v = (run.stdout.split() + ["None"] * 3)[:3]
    build = f"ROCm {hip_v}" if hip_v != "None" else (f"CUDA {cuda_v}" if cuda_v != "None" else "CPU-only")
    if ctx.gpu_site and build == "CPU-only":
        out.append(Finding(FATAL, f"image {image}: torch {torch_v} is a CPU-only build; the site runs on GPUs: rebuild the image"))
    elif ctx.rocm and hip_v == "None":
        out.append(Finding(FATAL, f"image {image}: torch {torch_v} is a {build} build but the launcher runs apptainer --rocm: use the ROCm image"))
    elif "--nv" in str(ctx.site.get("launcher", "")) + str(ctx.site.get("scaleladder", "")) and cuda_v == "None":
        out.append(Finding(FATAL, f"image {image}: torch {torch_v} is a {build} build but the site runs apptainer --nv: use the CUDA image"))
    else:
        out.append(Finding(OK, f"image {image}: torch {torch_v}, {build}"))
    if cuda_v != "None":
        floor = DRIVER_FLOOR.get(int(cuda_v.split(".")[0]))
        out.append(Finding(WARN if floor and floor >= 580 else OK,
                           f"image {image}: its CUDA {cuda_v} needs NVIDIA driver >= {floor}; `--compute` reads the compute nodes' "
                           "driver (older nodes: build with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128)"))
    return out


@check("binds", "every --bind source exists and stays one path; every folder of the image's LD_LIBRARY_PATH is bound")
def check_binds(ctx: Context) -> list[Finding]:
    """Apptainer refuses a missing bind source, so one kills every rung."""
    env = dict(ctx.env) | ctx.expanded_env
    seen: set[str] = set()
    out = []
    for key, line in ctx.command_lines():
        for src in bind_sources(line):
            if src in seen:
                continue
            seen.add(src)
            text, why = expand(src, env)
            if text is None:
                out.append(Finding(FATAL, f"site.{key}: bind source {src}: {why}"))
            elif "," in text or ":" in text:
                # TRAP: apptainer splits --bind at ',' and ':' AFTER the shell has expanded it,
                # so a path holding one is cut in two (apptainer/singularity#5923, #5959)
                out.append(Finding(FATAL, f"site.{key}: bind source {src} expands to {text!r}, which holds ',' or ':' where "
                                          "apptainer's --bind splits; move it to a path without them"))
            elif not ctx.path(text).exists():
                out.append(Finding(FATAL, f"site.{key}: bind source {text} does not exist, and apptainer refuses a missing one "
                                          "(every rung would die at start); fix the path in the profile or the variable it names"))
    out += _library_path(ctx, env)
    # "ok" only when no bind check above found a fault (the FATAL lines speak for themselves)
    if seen and not any(f.level == FATAL for f in out):
        out.append(Finding(OK, f"binds: {len(seen)} sources checked"))
    return out


def _library_path(ctx: Context, env: Mapping[str, str]) -> list[Finding]:
    """Every folder of the image's LD_LIBRARY_PATH is under a bind (else only the image's own
    files are there), and a host folder bound as itself exists (a library moved in an upgrade)."""
    ld = ctx.expanded_env.get("APPTAINERENV_LD_LIBRARY_PATH")
    if not ld:
        return []
    entries = [e for _, line in ctx.command_lines() for e in bind_entries(line)]
    binds = [expand(src, env)[0] or "" for src, dst in entries if src == dst]
    targets = [expand(dst, env)[0] or "" for src, dst in entries if src != dst]

    def related(a: str, b: str) -> bool:  # one folder inside the other
        return bool(b) and (a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/"))

    out = []
    for folder in filter(None, ld.split(":")):
        inside = any(related(folder, t) for t in targets)
        host = any(folder == b or folder.startswith(b.rstrip("/") + "/") for b in binds if b)
        if not inside and not host:
            out.append(Finding(WARN, f"APPTAINERENV_LD_LIBRARY_PATH: {folder} is not under any bind; only the image's own files are there"))
        elif host and not ctx.path(folder).is_dir():
            out.append(Finding(FATAL, f"APPTAINERENV_LD_LIBRARY_PATH: {folder} does not exist on this system (a library "
                                      "moved in a system upgrade?); fix the path in the profile or the variable it names"))
    return out


@check("network", "a multi-node GPU site's network plugin: forced, its libraries resolve in the image, Slingshot's settings")
def check_network(ctx: Context) -> list[Finding]:
    if not (ctx.gpu_site and ctx.max_nodes > 1):
        return []  # one node: NVLink/xGMI inside it, no network plugin involved
    declared = ctx.site.get("env") or {}
    plugin = ctx.expanded_env.get("NCCL_NET_PLUGIN")
    slingshot = "libcxi" in str(ctx.site.get("launcher", ""))  # the CXI provider: a Slingshot network
    if not slingshot and "NCCL_NET_PLUGIN" not in declared:
        # InfiniBand (an A100 cluster): NCCL's own IB transport needs no plugin; a fall back to
        # sockets shows in `doctor --compute`'s bus bandwidth and NET line instead
        return [Finding(OK, "network: no network plugin named: NCCL's own InfiniBand transport (doctor --compute measures it)")]
    out = []
    if "NCCL_NET_PLUGIN" not in declared:
        out.append(Finding(FATAL, "network: no NCCL_NET_PLUGIN in site.env, so RCCL/NCCL loads no network plugin and runs "
                                  "multi-node rungs over TCP sockets; set it to the plugin (librccl-net.so; module rccl-net-plugin)"))
    elif plugin is not None and not ctx.path(plugin).is_file():
        out.append(Finding(FATAL, f"network: NCCL_NET_PLUGIN={plugin} is not a file; point SCALELADDER_RCCL_NET_PLUGIN at librccl-net.so"))
    if "NCCL_NET" not in declared:
        out.append(Finding(FATAL, "network: NCCL_NET is not forced, so a plugin that fails to load falls back to TCP sockets "
                                  "without an error; set NCCL_NET (OFI on more than one node)"))
    if slingshot:
        out += _slingshot(ctx, declared)
    if plugin and ctx.path(plugin).is_file() and ctx.which("apptainer"):
        out += _plugin_libraries(ctx, plugin)
    return out


def _slingshot(ctx: Context, declared: Mapping[str, Any]) -> list[Finding]:
    """The libfabric CXI settings a Slingshot site documents (the profile binds libcxi)."""
    out = []
    missing = [k for k in SLINGSHOT_ENV if k not in declared]
    if missing:
        out.append(Finding(FATAL, f"network: Slingshot settings the site requires are missing from site.env: {', '.join(missing)} "
                                  "(docs/workflow.md lists them with their values and source)"))
    if declared.get("FI_MR_CACHE_MONITOR") == "memhooks":
        out.append(Finding(FATAL, "network: FI_MR_CACHE_MONITOR=memhooks deadlocks with the RCCL plugin; use kdreg2"))
    extra = str(ctx.profile.resources("rung").get("slurm_extra", ""))
    alt = str(declared.get("FI_CXI_RDZV_PROTO", "")) == "alt_read"
    if alt != ("disable_rdzv_get" in extra):
        out.append(Finding(FATAL, "network: FI_CXI_RDZV_PROTO=alt_read and sbatch --network=disable_rdzv_get go together "
                                  f"(the site's docs); the profile has {'only the first' if alt else 'only the second'}: "
                                  "set both (slurm_extra of the rung rule, site.env)"))
    return out


def _plugin_libraries(ctx: Context, plugin: str) -> list[Finding]:
    """``ldd`` the plugin INSIDE the image with the launcher's binds and LD_LIBRARY_PATH: a
    dependency the binds do not bring (libcxi's own, say) shows as 'not found'."""
    out: list[Finding] = []
    image = _image(ctx, out)
    launcher = next((line for key, line in ctx.command_lines() if key == "launcher"), "")
    specs = ",".join(bind_specs(launcher))
    binds, _ = expand(specs, dict(ctx.env) | ctx.expanded_env)
    if image is None or binds is None:
        return out
    run = ctx.apptainer(["exec", "--bind", binds, str(ctx.path(image)), "ldd", plugin])
    missing = re.findall(r"^\s*(\S+) => not found", run.stdout, re.M)
    if run.returncode != 0 and not missing:
        out.append(Finding(WARN, f"network: could not ldd {plugin} in the image: {(run.stderr.strip().splitlines() or ['?'])[-1]}"))
    for lib in missing:
        out.append(Finding(FATAL, f"network: the plugin needs {lib}, which is not found inside the image with the profile's binds; "
                                  "bind the host's copy (e.g. /usr/lib64/{0}:/opt/host-lib64/{0})".format(lib)))
    if run.returncode == 0 and not missing:
        out.append(Finding(OK, f"network: plugin {plugin} and its libraries resolve inside the image"))
    return out


@check("threads", "ranks per node x (OMP threads + loader workers) within the cores a rung job asks for")
def check_threads(ctx: Context) -> list[Finding]:
    prof = ctx.profile
    if prof.executor != "slurm" or not prof.ladder:
        return []
    res = prof.resources("rung")
    cpus = int(res.get("cpus_per_task") or 1) * int(res.get("tasks_per_node") or 1)
    omp_text = ctx.expanded_env.get("OMP_NUM_THREADS", "1")
    omp = int(omp_text) if omp_text.isdigit() else 1
    loader = prof.config.get("loader") or {}  # the input pipeline's own count, where a profile sets one
    given = loader.get("workers", prof.config.get("workers", 0))
    if str(given) == "auto":  # what `run --workers auto` picks on this share of cores (data/cores.py)
        from scaleladder.data.cores import auto_workers

        workers = auto_workers(max(cpus // max(ctx.rpn, 1) - (omp - 1), 1), str(loader.get("decode", "cpu")))
    else:
        workers = int(given)
    need = ctx.rpn * (omp + workers)
    if need > cpus:
        return [Finding(FATAL, f"threads: {ctx.rpn} ranks x (OMP_NUM_THREADS {omp} + workers {workers}) = {need} threads on the "
                               f"{cpus} cores a rung job asks for; the ranks would fight for cores and the step times lie. "
                               f"Lower OMP_NUM_THREADS or workers (per rank: at most {cpus // ctx.rpn})")]
    return [Finding(OK, f"threads: {need} on {cpus} cores per node")]


def _fs_type(ctx: Context, folder: Path) -> str:
    run = subprocess.run(["stat", "-f", "-c", "%T", str(folder)], capture_output=True, text=True, env=ctx.env, timeout=30)
    return run.stdout.strip() if run.returncode == 0 else "unknown"


def _cluster_nodes(ctx: Context) -> int:
    if not ctx.which("sinfo"):
        return 0
    run = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=ctx.env, timeout=60)
    if run.returncode != 0:
        return 0
    # Machines, not node names: a node that is a network namespace of THIS machine
    # (`.ci/slurm-up --nodes N`: /run/netns/<node>) shares its disk, so all such nodes
    # count as this one machine.
    names = set(run.stdout.split())
    here = {n for n in names if os.path.exists(f"/run/netns/{n}")}
    return len(names - here) + (1 if here else 0)


@check("results-fs", "results/ on a filesystem every node sees, and HDF5_USE_FILE_LOCKING=FALSE on a network one")
def check_results_fs(ctx: Context) -> list[Finding]:
    results = ctx.profile.repo / "results"
    folder = results if results.exists() else ctx.profile.repo
    kind = _fs_type(ctx, folder)
    shared = kind not in LOCAL_FS and kind != "unknown"
    out = []
    if ctx.profile.executor == "slurm" and not shared and _cluster_nodes(ctx) != 1:
        # (a one-node cluster, as in CI, sees its own disk)
        out.append(Finding(FATAL, f"results/: on {kind} ({folder}), which the compute nodes do not see; run the workflow from "
                                  "the site's parallel or network filesystem"))
    if shared and ctx.expanded_env.get("HDF5_USE_FILE_LOCKING", ctx.env.get("HDF5_USE_FILE_LOCKING")) != "FALSE":
        out.append(Finding(FATAL, f"results/ is on {kind}, a network filesystem, but HDF5_USE_FILE_LOCKING is not FALSE: HDF5's "
                                  "flock fails or hangs there; add HDF5_USE_FILE_LOCKING: \"FALSE\" to site.env"))
    return out or [Finding(OK, f"results/: {kind}")]


def compile_rungs(ctx: Context) -> int:
    """How many of the ladder's rungs are ``-compile`` rungs (torch.compile per block)."""
    return sum(s.strategy.compile for s in (ctx.profile.ladder.rungs if ctx.profile.ladder else ()))


@check("compile", "with -compile rungs in the ladder: their C/C++ compiler and Python.h are checked where they run (--compute)")
def check_compile(ctx: Context) -> list[Finding]:
    """Nothing to test on the login node: its compilers are not the image's. The probe job of
    ``--compute`` builds a C and a C++ extension inside the image (``compile_toolchain``)."""
    n = compile_rungs(ctx)
    if not n:
        return []
    return [Finding(OK, f"compile: {n} -compile rung(s) need a C/C++ compiler and Python.h where they run; "
                        "`doctor --compute` builds an extension there, inside the image")]


def compile_toolchain(ctx: Context, report: Mapping[str, Any]) -> list[Finding]:
    """The probe's toolchain report (``campaign/toolchain.py``, run by rank 0 of the probe job,
    inside the image on a compute node) against what the ladder's ``-compile`` rungs need."""
    from scaleladder.campaign.toolchain import missing, summary

    n = compile_rungs(ctx)
    if not n:
        return []
    image = _image(ctx, [])
    where = f"on {report.get('hostname')}" + (f", inside {image}" if image else "")
    tool = report.get("toolchain")
    if not isinstance(tool, Mapping):
        return [Finding(FATAL, f"compute: the probe {where} did not report its compile toolchain (a scaleladder older than "
                               "the doctor's in the image?); rebuild the image from this checkout")]
    lacking = missing(dict(tool))
    if lacking:
        # TRAP: one line naming every piece, with the image to rebuild: a GPU rung finds out only
        # at its first compile (Triton's launcher build), after the job has waited in the queue
        return [Finding(FATAL, f"compute: {n} -compile rung(s) would fail {where}: {'; '.join(lacking)} "
                               "(the images install gcc g++ libc6-dev: containers/Dockerfile.*; rebuild)")]
    return [Finding(OK, f"compute: {summary(dict(tool))} {where}")]


@check("snakemake", "Snakemake (and under SLURM its executor plugin) installed where the doctor runs, at the lock's versions")
def check_snakemake(ctx: Context) -> list[Finding]:
    want = ["snakemake"] + (["snakemake-executor-plugin-slurm"] if ctx.profile.executor == "slurm" else [])
    lock = ctx.profile.repo / "containers" / "constraints-cuda.txt"
    pins = dict(line.split("==") for line in lock.read_text().splitlines() if "==" in line) if lock.exists() else {}
    out = []
    for dist in want:
        try:
            have = version(dist)
        except PackageNotFoundError:
            out.append(Finding(FATAL, f"{dist}: not installed where the doctor runs; pip install {dist}=={pins.get(dist, '')}".rstrip("=")))
            continue
        if dist == "snakemake" and int(have.split(".")[0]) < 9:
            out.append(Finding(FATAL, f"snakemake {have}: the Snakefile needs >= 9.0; pip install snakemake=={pins.get(dist, '9')}"))
        elif dist in pins and pins[dist] != have:
            out.append(Finding(WARN, f"{dist} {have}: the tested lock has {pins[dist]} (pip install {dist}=={pins[dist]})"))
        else:
            out.append(Finding(OK, f"{dist} {have}"))
    return out


def select(only: str | None = None, skip: str | None = None) -> list[Check]:
    """The checks ``--only`` and ``--skip`` (comma-separated names) leave, in their running order;
    a name that is no check is one line naming it and the checks there are (exit 2)."""
    def names(text: str | None, flag: str) -> set[str]:
        chosen = {n.strip() for n in (text or "").split(",") if n.strip()}
        unknown = sorted(chosen - set(CHECKS))
        if unknown:
            raise SpecError(f"{flag}: no check named {', '.join(map(repr, unknown))}; the checks are {', '.join(CHECKS)} "
                            "(doctor --list says what each does)")
        return chosen

    keep, drop = names(only, "--only"), names(skip, "--skip")
    return [c for name, c in CHECKS.items() if (not keep or name in keep) and name not in drop]


def run_checks(ctx: Context, checks: list[Check] | None = None) -> list[Finding]:
    return [f for c in (list(CHECKS.values()) if checks is None else checks) for f in c.run(ctx)]
