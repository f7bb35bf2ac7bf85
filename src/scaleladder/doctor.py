"""`scaleladder doctor --profile NAME [--compute]`: find, on the login node and in seconds,
what would make a campaign fail or lie, before anything is queued.

Each problem is ONE line, ``FATAL``/``WARN`` + what is wrong + the fix; the exit code is 1 when
any is fatal. The checks read the profile exactly as Snakemake will run it:

* the config, through the workflow's own validation (:func:`scaleladder.workflow.prepare`);
* the account and partition the SLURM executor will submit with (``sinfo`` asked where present);
* every ``site.env`` value, expanded by bash under ``set -euo pipefail`` as the job's shell will
  (an unset ``$LD_LIBRARY_PATH`` kills every job there), and torch's deprecated names;
* the image: it exists, is readable, and what torch build it holds (``apptainer exec``);
* every ``--bind`` source of the launch lines, and every folder of the image's
  ``LD_LIBRARY_PATH``: Apptainer refuses a missing bind source, so one kills every rung;
* the network plugin of a multi-node GPU site: forced (``NCCL_NET_PLUGIN`` + ``NCCL_NET``), so a
  missing plugin fails instead of RCCL/NCCL falling back to TCP sockets; its shared-library
  dependencies resolve inside the image with the binds (``ldd``); on a Slingshot site (the
  profile binds libcxi) the libfabric CXI settings the site documents;
  ``FI_CXI_RDZV_PROTO=alt_read`` only together with ``--network=disable_rdzv_get``;
* threads: ranks per node x (OMP threads + loader workers) within the cores the job asks for;
* ``results/`` on a filesystem every node sees, and ``HDF5_USE_FILE_LOCKING=FALSE`` there;
* Snakemake and the SLURM executor plugin installed, at the lock's versions.

``--compute`` then submits ONE tiny job (``sbatch --wait``) through the site's real launcher:
``campaign/probe.py`` reports from the compute node the GPUs seen against those expected, the
driver against the image's CUDA/ROCm build, and a 2-rank all-reduce bandwidth.

Every tool is called by name from PATH (sbatch, sinfo, apptainer, stat), so tests plant faults
with fake tools; ``--fs-root`` puts the site's absolute paths under a fake filesystem layout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from io import StringIO
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from scaleladder import workflow as swf
from scaleladder.errors import SpecError

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


@dataclass
class Finding:
    level: str
    what: str

    def line(self) -> str:
        return f"{self.level:5} {self.what}"


@dataclass
class Profile:
    """A profile as Snakemake will run it: its folder, the merged config, its ladder and the
    Snakemake options of config.v8+.yaml."""

    name: str
    folder: Path
    repo: Path
    smk: dict[str, Any]
    ladder: swf.Ladder | None
    config: dict[str, Any]
    config_error: str | None = None

    @property
    def site(self) -> dict[str, Any]:
        site: dict[str, Any] = self.config.get("site", {})
        return site

    @property
    def executor(self) -> str:
        return str(self.smk.get("executor", "local"))

    def resources(self, rule: str, nodes: int = 1) -> dict[str, Any]:
        """The rule's resources: default-resources overlaid by set-resources, each evaluated as
        Snakemake does (a Python expression; a YTE ``?expr`` in the profile's own pass)."""
        merged = dict(self.smk.get("default-resources") or {}) | dict((self.smk.get("set-resources") or {}).get(rule) or {})
        return {k: _evaluate(v, nodes) for k, v in merged.items()}


def _evaluate(value: Any, nodes: int) -> Any:
    if not isinstance(value, str):
        return value
    names = {"os": os, "int": int, "repr": repr}
    if value.startswith("?"):  # YTE's pass first: `?repr(os.environ.get(...))` -> "'abc123'"
        value = eval(value[1:], names)  # noqa: S307 - the profile's own expressions
        if not isinstance(value, str):
            return value
    try:  # then Snakemake's: a resource string is a Python expression ("'srun'", "int(wildcards.nodes)")
        return eval(value, names, {"wildcards": argparse.Namespace(nodes=str(nodes))})  # noqa: S307
    except Exception:  # noqa: BLE001 - a bare word is a string resource
        return value


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Snakemake's configfile merge: nested dicts updated key by key, anything else replaced."""
    for k, v in top.items():
        base[k] = _merge(dict(base[k]), v) if isinstance(v, Mapping) and isinstance(base.get(k), dict) else v
    return base


def load_profile(name: str, repo: Path, plan: bool = False) -> Profile:
    """The profile's merged config, validated by the workflow's own code; with ``plan`` also the
    planner's verdict on every rung (a second or more on a big ladder: the doctor does not need it)."""
    folder = repo / "profiles" / name
    if not (folder / "site.yaml").is_file():
        have = ", ".join(sorted(p.name for p in (repo / "profiles").iterdir() if p.is_dir())) if (repo / "profiles").is_dir() else "none"
        raise SpecError(f"no profile {name!r} in {repo / 'profiles'} (have: {have})")
    smk = yaml.safe_load((folder / "config.v8+.yaml").read_text()) or {}
    cfg = yaml.safe_load((repo / "config" / "config.yaml").read_text()) or {}
    cfg = _merge(cfg, yaml.safe_load((folder / "site.yaml").read_text()) or {})
    schema = repo / "workflow" / "schemas" / "config.schema.yaml"
    try:
        if plan:
            ladder = swf.prepare(cfg, schema, log=StringIO(), gpu_count=lambda: 0)
        else:
            swf.validate_config(cfg, schema)
            rpn = swf.resolve_ranks_per_node(cfg["site"], lambda: 0)
            rungs, skipped = swf.expand_ladder(cfg["ladders"], rpn)
            ladder = swf.Ladder(cfg, rpn, tuple(rungs), tuple(skipped), tuple(rungs), frozenset())
        return Profile(name, folder, repo, smk, ladder, cfg)
    except swf.ConfigError as e:
        return Profile(name, folder, repo, smk, None, cfg, " ".join(str(e).split()))


# -- shell: what the job's bash makes of a site string --------------------------------------


def expand(value: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """``value`` as the job's ``export K="value"`` expands it, under ``set -euo pipefail``
    (Snakemake's shell prefix): (text, '') or (None, bash's complaint)."""
    script = f'set -euo pipefail\nprintf "%s" "{value}"\n'
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=dict(env), timeout=30)
    if run.returncode != 0:
        return None, (run.stderr.strip().splitlines() or ["bash failed"])[-1].replace("bash: line 2: ", "")
    return run.stdout, ""


def split_outside(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep``, except inside ``${...}``/``$(...)`` (``${VAR:-/a,b}`` stays whole)."""
    parts, depth, cur = [], 0, ""
    for i, ch in enumerate(text):
        if ch in "{(" and i and text[i - 1] == "$":
            depth += 1
        elif ch in "})" and depth:
            depth -= 1
        if ch == sep and not depth:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def bind_entries(command: str) -> list[tuple[str, str]]:
    """(source, destination) of each ``--bind``/``-B`` entry ``src[:dst[:opts]]`` of an
    apptainer command line, unexpanded; the destination is the source where none is given."""
    out: list[tuple[str, str]] = []
    for spec in _bind_specs(command):
        for entry in filter(None, split_outside(spec, ",")):
            fields = split_outside(entry, ":")
            out.append((fields[0], fields[1] if len(fields) > 1 else fields[0]))
    return out


def bind_sources(command: str) -> list[str]:
    return [src for src, _ in bind_entries(command)]


def fill_site(template: str, site: Mapping[str, Any], rpn: int, nodes: int, ranks: int) -> str:
    out = swf.fill(template, site, rpn)
    return out.replace("{nodes}", str(nodes)).replace("{ranks}", str(ranks))


# -- the checks ---------------------------------------------------------------------------


@dataclass
class Doctor:
    profile: Profile
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    fs_root: str = ""  # prefix for the site's absolute paths (a fake layout in tests)
    findings: list[Finding] = field(default_factory=list)
    expanded_env: dict[str, str] = field(default_factory=dict)

    def add(self, level: str, what: str) -> None:
        self.findings.append(Finding(level, what))

    def path(self, p: str) -> Path:
        return Path(self.fs_root + p) if self.fs_root and p.startswith("/") else Path(p)

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

    def run_all(self) -> list[Finding]:
        for check in (self.check_config, self.check_slurm, self.check_local_rules, self.check_env, self.check_image,
                      self.check_binds, self.check_network, self.check_threads, self.check_results_fs, self.check_snakemake):
            check()
        return self.findings

    def check_config(self) -> None:
        if self.profile.config_error:
            self.add(FATAL, f"config: {self.profile.config_error} (fix profiles/{self.profile.name}/site.yaml)")
        else:
            ladder = self.profile.ladder
            assert ladder is not None
            self.add(OK, f"config: valid; {len(ladder.rungs)} rungs (scaleladder budget: what they cost)")

    def check_slurm(self) -> None:
        if self.profile.executor != "slurm":
            return
        res = self.profile.resources("rung")
        account = res.get("slurm_account")
        if not self.profile.smk.get("slurm-no-account") and not account:
            self.add(FATAL, "slurm account: none; set SCALELADDER_SLURM_ACCOUNT to your project (e.g. abc123), "
                            f"or slurm_account in profiles/{self.profile.name}/config.v8+.yaml")
        partition = str(res.get("slurm_partition") or "")
        if not partition:
            self.add(FATAL, "slurm partition: none; set SCALELADDER_SLURM_PARTITION")
        elif shutil.which("sinfo", path=self.env.get("PATH")):
            run = subprocess.run(["sinfo", "-h", "-p", partition, "-o", "%P"], capture_output=True, text=True, env=self.env, timeout=60)
            if run.returncode != 0 or not run.stdout.strip():
                self.add(FATAL, f"slurm partition {partition!r}: sinfo does not know it; set SCALELADDER_SLURM_PARTITION "
                                "to one `sinfo -s` lists")
            else:
                self.add(OK, f"slurm: account {account or '(none needed)'}, partition {partition}")
        else:
            self.add(WARN, "slurm: no sinfo on PATH, so the partition was not checked (run the doctor on the login node)")

    def check_local_rules(self) -> None:
        """Under a SLURM executor every rule but the rungs' must be a local rule: a few MB of
        shards or a plot as a cluster job costs a whole exclusive node (where the partition
        allocates whole nodes) and hours of queue."""
        if self.profile.executor != "slurm":
            return
        rules_dir = self.profile.repo / "workflow" / "rules"
        text = "\n".join(p.read_text() for p in sorted(rules_dir.glob("*.smk")))
        rules = set(re.findall(r"^\s*rule (\w+):", text, re.M))
        local = {name for block in re.findall(r"^localrules:\n((?:\s+\w+,?\n)+)", text, re.M)
                 for name in re.findall(r"\w+", block)}
        remote = rules - local
        light = sorted(remote & LIGHT_RULES)
        # big inputs may deserve an allocation (data.slices); site.local_data makes them local rules
        data = [] if self.site.get("local_data") else sorted(rules & {"shard", "shard_slice"})
        if light:
            self.add(FATAL, f"workflow: rule(s) {', '.join(light)} would each be a cluster job (a whole node on an "
                            "exclusive partition) for seconds of work; list them under localrules: in workflow/rules/")
        if data:
            res = self.profile.resources("shard")
            self.add(WARN, f"workflow: {', '.join(data)} run as cluster jobs ({res.get('runtime', '?')} min each; on a "
                           "partition that allocates whole nodes, a whole node each): for a small data set set "
                           f"site.local_data: true in profiles/{self.profile.name}/site.yaml")

    def check_env(self) -> None:
        env = dict(self.env)
        for key, value in (self.site.get("env") or {}).items():
            text, why = expand(str(value), env)
            if text is None:
                self.add(FATAL, f"site.env.{key}: the job's shell (set -u) stops on it: {why}; set that variable, "
                                "or write ${VAR:-default} in the profile")
                continue
            env[key] = text  # later values may use earlier ones, as in the job's exports
            self.expanded_env[key] = text
        for old, new in DEPRECATED_ENV.items():
            if old in (self.site.get("env") or {}):
                self.add(WARN, f"site.env.{old} is deprecated in torch 2.x; rename it {new}")

    def _image(self) -> str | None:
        image = self.site.get("image")
        if not image:
            return None
        text, why = expand(str(image), self.env)
        if text is None:
            self.add(FATAL, f"site.image: {why}")
            return None
        return text

    def apptainer(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        env = dict(self.env) | {f"APPTAINERENV_{k[len('APPTAINERENV_'):]}": v for k, v in self.expanded_env.items()
                                if k.startswith("APPTAINERENV_")}
        return subprocess.run(["apptainer", *args], capture_output=True, text=True, env=env, timeout=300)

    def check_image(self) -> None:
        image = self._image()
        uses = any("apptainer" in str(self.site.get(k, "")) for k in ("launcher", "scaleladder"))
        if image is None or not uses:
            return
        p = self.path(image)
        if not p.is_file():
            self.add(FATAL, f"image {image}: no such file; build it (containers/scaleladder-*.def) or set SCALELADDER_IMAGE")
            return
        if not os.access(p, os.R_OK):
            self.add(FATAL, f"image {image}: not readable by you; chmod a+r it or copy it where you can read it")
            return
        if not shutil.which("apptainer", path=self.env.get("PATH")):
            self.add(FATAL, "apptainer: not on PATH (module load apptainer, or the site's equivalent)")
            return
        probe = "import torch; print(torch.__version__, torch.version.cuda, getattr(torch.version, 'hip', None))"
        run = self.apptainer(["exec", str(p), "python", "-c", probe])
        if run.returncode != 0:
            self.add(FATAL, f"image {image}: python/torch does not start in it: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
            return
        torch_v, cuda_v, hip_v = (run.stdout.split() + ["None"] * 3)[:3]
        build = f"ROCm {hip_v}" if hip_v != "None" else (f"CUDA {cuda_v}" if cuda_v != "None" else "CPU-only")
        if self.gpu_site and build == "CPU-only":
            self.add(FATAL, f"image {image}: torch {torch_v} is a CPU-only build; the site runs on GPUs: rebuild the image")
        elif self.rocm and hip_v == "None":
            self.add(FATAL, f"image {image}: torch {torch_v} is a {build} build but the launcher runs apptainer --rocm: use the ROCm image")
        elif "--nv" in str(self.site.get("launcher", "")) + str(self.site.get("scaleladder", "")) and cuda_v == "None":
            self.add(FATAL, f"image {image}: torch {torch_v} is a {build} build but the site runs apptainer --nv: use the CUDA image")
        else:
            self.add(OK, f"image {image}: torch {torch_v}, {build}")
        if cuda_v != "None":
            floor = DRIVER_FLOOR.get(int(cuda_v.split(".")[0]))
            self.add(WARN if floor and floor >= 580 else OK,
                     f"image {image}: its CUDA {cuda_v} needs NVIDIA driver >= {floor}; `--compute` reads the compute nodes' "
                     "driver (older nodes: build with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128)")

    def _command_lines(self) -> list[tuple[str, str]]:
        rpn, nodes = self.rpn, self.max_nodes
        out = []
        for key in ("launcher", "scaleladder", "prologue"):
            if self.site.get(key):
                out.append((key, fill_site(str(self.site[key]), self.site, rpn, nodes, nodes * rpn)))
        return out

    def check_binds(self) -> None:
        env = dict(self.env) | self.expanded_env
        seen: set[str] = set()
        before = len(self.findings)
        for key, line in self._command_lines():
            for src in bind_sources(line):
                if src in seen:
                    continue
                seen.add(src)
                text, why = expand(src, env)
                if text is None:
                    self.add(FATAL, f"site.{key}: bind source {src}: {why}")
                elif "," in text or ":" in text:
                    # TRAP: apptainer splits --bind at ',' and ':' AFTER the shell has expanded it,
                    # so a path holding one is cut in two (apptainer/singularity#5923, #5959)
                    self.add(FATAL, f"site.{key}: bind source {src} expands to {text!r}, which holds ',' or ':' where "
                                    "apptainer's --bind splits; move it to a path without them")
                elif not self.path(text).exists():
                    self.add(FATAL, f"site.{key}: bind source {text} does not exist, and apptainer refuses a missing one "
                                    "(every rung would die at start); fix the path in the profile or the variable it names")
        ld = self.expanded_env.get("APPTAINERENV_LD_LIBRARY_PATH")
        if ld:
            entries = [e for _, line in self._command_lines() for e in bind_entries(line)]
            binds = [expand(src, env)[0] or "" for src, dst in entries if src == dst]
            targets = [expand(dst, env)[0] or "" for src, dst in entries if src != dst]

            def related(a: str, b: str) -> bool:  # one folder inside the other
                return bool(b) and (a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/"))

            for folder in filter(None, ld.split(":")):
                inside = any(related(folder, t) for t in targets)
                host = any(folder == b or folder.startswith(b.rstrip("/") + "/") for b in binds if b)
                if not inside and not host:
                    self.add(WARN, f"APPTAINERENV_LD_LIBRARY_PATH: {folder} is not under any bind; only the image's own files are there")
                elif host and not self.path(folder).is_dir():
                    self.add(FATAL, f"APPTAINERENV_LD_LIBRARY_PATH: {folder} does not exist on this system (a library "
                                    "moved in a system upgrade?); fix the path in the profile or the variable it names")
        # "ok" only when no bind check above found a fault (the FATAL lines speak for themselves)
        if seen and not any(f.level == FATAL for f in self.findings[before:]):
            self.add(OK, f"binds: {len(seen)} sources checked")

    def check_network(self) -> None:
        if not (self.gpu_site and self.max_nodes > 1):
            return  # one node: NVLink/xGMI inside it, no network plugin involved
        env = self.expanded_env
        declared = self.site.get("env") or {}
        plugin = env.get("NCCL_NET_PLUGIN")
        slingshot = "libcxi" in str(self.site.get("launcher", ""))  # the CXI provider: a Slingshot network
        if not slingshot and "NCCL_NET_PLUGIN" not in declared:
            # InfiniBand (an A100 cluster): NCCL's own IB transport needs no plugin; a fall back to
            # sockets shows in `doctor --compute`'s bus bandwidth and NET line instead
            self.add(OK, "network: no network plugin named: NCCL's own InfiniBand transport (doctor --compute measures it)")
            return
        if "NCCL_NET_PLUGIN" not in declared:
            self.add(FATAL, "network: no NCCL_NET_PLUGIN in site.env, so RCCL/NCCL loads no network plugin and runs "
                            "multi-node rungs over TCP sockets; set it to the plugin (librccl-net.so; module rccl-net-plugin)")
        elif plugin is not None and not self.path(plugin).is_file():
            self.add(FATAL, f"network: NCCL_NET_PLUGIN={plugin} is not a file; point SCALELADDER_RCCL_NET_PLUGIN at librccl-net.so")
        if "NCCL_NET" not in declared:
            self.add(FATAL, "network: NCCL_NET is not forced, so a plugin that fails to load falls back to TCP sockets "
                            "without an error; set NCCL_NET (OFI on more than one node)")
        if slingshot:
            missing = [k for k in SLINGSHOT_ENV if k not in declared]
            if missing:
                self.add(FATAL, f"network: Slingshot settings the site requires are missing from site.env: {', '.join(missing)} "
                                "(docs/workflow.md lists them with their values and source)")
            if declared.get("FI_MR_CACHE_MONITOR") == "memhooks":
                self.add(FATAL, "network: FI_MR_CACHE_MONITOR=memhooks deadlocks with the RCCL plugin; use kdreg2")
            extra = str(self.profile.resources("rung").get("slurm_extra", ""))
            alt = str(declared.get("FI_CXI_RDZV_PROTO", "")) == "alt_read"
            if alt != ("disable_rdzv_get" in extra):
                self.add(FATAL, "network: FI_CXI_RDZV_PROTO=alt_read and sbatch --network=disable_rdzv_get go together "
                                f"(the site's docs); the profile has {'only the first' if alt else 'only the second'}: "
                                "set both (slurm_extra of the rung rule, site.env)")
        if plugin and self.path(plugin).is_file() and shutil.which("apptainer", path=self.env.get("PATH")):
            self.check_plugin_libraries(plugin)

    def check_plugin_libraries(self, plugin: str) -> None:
        """``ldd`` the plugin INSIDE the image with the launcher's binds and LD_LIBRARY_PATH: a
        dependency the binds do not bring (libcxi's own, say) shows as 'not found'."""
        image = self._image()
        launcher = next((line for key, line in self._command_lines() if key == "launcher"), "")
        specs = ",".join(_bind_specs(launcher))
        env = dict(self.env) | self.expanded_env
        binds, _ = expand(specs, env)
        if image is None or binds is None:
            return
        run = self.apptainer(["exec", "--bind", binds, str(self.path(image)), "ldd", plugin])
        missing = re.findall(r"^\s*(\S+) => not found", run.stdout, re.M)
        if run.returncode != 0 and not missing:
            self.add(WARN, f"network: could not ldd {plugin} in the image: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
        for lib in missing:
            self.add(FATAL, f"network: the plugin needs {lib}, which is not found inside the image with the profile's binds; "
                            "bind the host's copy (e.g. /usr/lib64/{0}:/opt/host-lib64/{0})".format(lib))
        if run.returncode == 0 and not missing:
            self.add(OK, f"network: plugin {plugin} and its libraries resolve inside the image")

    def check_threads(self) -> None:
        if self.profile.executor != "slurm" or not self.profile.ladder:
            return
        res = self.profile.resources("rung")
        cpus = int(res.get("cpus_per_task") or 1) * int(res.get("tasks_per_node") or 1)
        omp_text = self.expanded_env.get("OMP_NUM_THREADS", "1")
        omp = int(omp_text) if omp_text.isdigit() else 1
        loader = self.profile.config.get("loader") or {}  # the input pipeline's own count, where a profile sets one
        workers = int(loader.get("workers", self.profile.config.get("workers", 0)))
        need = self.rpn * (omp + workers)
        if need > cpus:
            self.add(FATAL, f"threads: {self.rpn} ranks x (OMP_NUM_THREADS {omp} + workers {workers}) = {need} threads on the "
                            f"{cpus} cores a rung job asks for; the ranks would fight for cores and the step times lie. "
                            f"Lower OMP_NUM_THREADS or workers (per rank: at most {cpus // self.rpn})")
        else:
            self.add(OK, f"threads: {need} on {cpus} cores per node")

    def fs_type(self, folder: Path) -> str:
        run = subprocess.run(["stat", "-f", "-c", "%T", str(folder)], capture_output=True, text=True, env=self.env, timeout=30)
        return run.stdout.strip() if run.returncode == 0 else "unknown"

    def cluster_nodes(self) -> int:
        if not shutil.which("sinfo", path=self.env.get("PATH")):
            return 0
        run = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, env=self.env, timeout=60)
        if run.returncode != 0:
            return 0
        # Machines, not node names: a node that is a network namespace of THIS machine
        # (`.ci/slurm-up --nodes N`: /run/netns/<node>) shares its disk, so all such nodes
        # count as this one machine.
        names = set(run.stdout.split())
        here = {n for n in names if os.path.exists(f"/run/netns/{n}")}
        return len(names - here) + (1 if here else 0)

    def check_results_fs(self) -> None:
        results = self.profile.repo / "results"
        folder = results if results.exists() else self.profile.repo
        kind = self.fs_type(folder)
        shared = kind not in LOCAL_FS and kind != "unknown"
        fatal = False
        if self.profile.executor == "slurm" and not shared and self.cluster_nodes() != 1:
            fatal = True  # (a one-node cluster, as in CI, sees its own disk)
            self.add(FATAL, f"results/: on {kind} ({folder}), which the compute nodes do not see; run the workflow from "
                            "the site's parallel or network filesystem")
        if shared and self.expanded_env.get("HDF5_USE_FILE_LOCKING", self.env.get("HDF5_USE_FILE_LOCKING")) != "FALSE":
            fatal = True
            self.add(FATAL, f"results/ is on {kind}, a network filesystem, but HDF5_USE_FILE_LOCKING is not FALSE: HDF5's "
                            "flock fails or hangs there; add HDF5_USE_FILE_LOCKING: \"FALSE\" to site.env")
        if not fatal:
            self.add(OK, f"results/: {kind}")

    def check_snakemake(self) -> None:
        want = {"snakemake": None}
        if self.profile.executor == "slurm":
            want["snakemake-executor-plugin-slurm"] = None
        lock = self.profile.repo / "containers" / "constraints-cuda.txt"
        pins = dict(line.split("==") for line in lock.read_text().splitlines() if "==" in line) if lock.exists() else {}
        for dist in want:
            try:
                have = version(dist)
            except PackageNotFoundError:
                self.add(FATAL, f"{dist}: not installed where the doctor runs; pip install {dist}=={pins.get(dist, '')}".rstrip("="))
                continue
            if dist == "snakemake" and int(have.split(".")[0]) < 9:
                self.add(FATAL, f"snakemake {have}: the Snakefile needs >= 9.0; pip install snakemake=={pins.get(dist, '9')}")
            elif dist in pins and pins[dist] != have:
                self.add(WARN, f"{dist} {have}: the tested lock has {pins[dist]} (pip install {dist}=={pins[dist]})")
            else:
                self.add(OK, f"{dist} {have}")


def _bind_specs(command: str) -> list[str]:
    """The ``--bind``/``-B`` values of a command line, without the double quotes a profile puts
    around one so that an expanded path with a space stays one word (docs/workflow.md,
    "Shell keys and data keys")."""
    words = command.split()
    specs = [words[i + 1] for i, w in enumerate(words) if w in ("--bind", "-B") and i + 1 < len(words)] + \
        [w.split("=", 1)[1] for w in words if w.startswith("--bind=")]
    return [w[1:-1] if len(w) > 1 and w[0] == w[-1] == '"' else w for w in specs]


# -- --compute: one tiny job through the site's launcher ------------------------------------


def compute_script(d: Doctor, out: Path, nodes: int) -> str:
    """The batch script: the site's exports and prologue, then the launcher starting 2 ranks of
    ``doctor --probe`` (inside the image where the site uses one)."""
    site = d.site
    ranks = 2
    launcher = fill_site(str(site["launcher"]), site, d.rpn, nodes, ranks)
    device = f" --probe-device {site.get('device', 'auto')}"
    if site.get("supervise") == "launch" and "torchrun" in launcher:
        # the launcher runs inside what site.scaleladder starts (the image), as `launch` does
        inner = launcher.replace(f"--nproc-per-node {d.rpn}", f"--nproc-per-node {ranks}")
        cmd = f"{swf.fill(str(site['scaleladder']), site, d.rpn)} doctor --probe {shlex.quote(str(out))}{device} --probe-via {shlex.quote(inner)}"
    else:
        cmd = f"{launcher} doctor --probe {shlex.quote(str(out))}{device}"
    prologue = fill_site(str(site.get("prologue", "")), site, d.rpn, nodes, ranks).strip()
    return ("#!/bin/bash\nset -euo pipefail\n" + f"cd {shlex.quote(str(d.profile.repo))}\n" + swf.env_exports(site).replace("; ", "\n")
            + (prologue + "\n" if prologue else "") + cmd + "\n")


def sbatch_args(d: Doctor, nodes: int, log: Path) -> list[str]:
    res = d.profile.resources("rung", nodes)
    args = ["--wait", "--parsable", f"--job-name=scaleladder-doctor", f"--output={log}", f"--nodes={nodes}", "--time=10"]
    tasks = int(res.get("tasks_per_node") or 0)
    args.append(f"--ntasks-per-node={2 // nodes if tasks else 1}")
    if res.get("cpus_per_task"):
        args.append(f"--cpus-per-task={res['cpus_per_task']}")
    if res.get("gpu"):
        args.append(f"--gpus={res['gpu']}")
    if res.get("slurm_account") and not d.profile.smk.get("slurm-no-account"):
        args.append(f"--account={res['slurm_account']}")
    if res.get("slurm_partition"):
        args.append(f"--partition={res['slurm_partition']}")
    args += shlex.split(str(res.get("slurm_extra") or ""))
    return args


def read_probe(d: Doctor, report: Mapping[str, Any]) -> None:
    expected = d.rpn if d.gpu_site else 0
    seen = int(report.get("gpus_seen", 0))
    cuda, driver = report.get("cuda_version"), report.get("nvidia_driver")
    floor = DRIVER_FLOOR.get(int(str(cuda).split(".")[0]), 0) if cuda else 0
    old_driver = bool(cuda and driver and int(str(driver).split(".")[0]) < floor)
    if d.gpu_site and seen == 0:
        # TRAP: under a driver older than the build's floor (CUDA 13 wheels: 580) torch sees NO GPU
        # at all, and every rung would fail with NoGPUError; name the driver, not the bind flags.
        if old_driver:
            why = (f"NVIDIA driver {driver} is older than the {floor} that the image's CUDA {cuda} needs, so torch sees no GPU; "
                   "build the CUDA image with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128")
        elif cuda and not driver:
            why = (f"no NVIDIA driver on {report.get('hostname')} (/proc/driver/nvidia/version unreadable) for the image's "
                   f"CUDA {cuda}; check the partition and the job's GPU request")
        elif report.get("hip_version"):
            why = (f"the image's ROCm {report['hip_version']} build sees none under amdgpu driver "
                   f"{report.get('amdgpu_driver') or 'unreadable'} (check apptainer --rocm, the job's GPU request, and that "
                   "the node's amdgpu driver supports this ROCm: AMD's user-space/kernel-driver support matrix)")
        else:
            why = "check apptainer --nv/--rocm and the job's GPU request"
        d.add(FATAL, f"compute: the ranks see no GPU where the site expects {expected} per node "
                     f"({report.get('gpu_expected') or 'site.device cuda'}): {why}")
        if old_driver:
            return  # said: the rest of the probe ran on no GPU
    else:
        d.add(OK, f"compute: GPUs seen {seen} per rank's node, expected {expected} ({report.get('hostname')})")
    if cuda and driver:
        if old_driver:
            d.add(FATAL, f"compute: NVIDIA driver {driver} is older than the {floor} that the image's CUDA {cuda} needs; "
                         "build the CUDA image with --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128")
        else:
            d.add(OK, f"compute: NVIDIA driver {driver} runs the image's CUDA {cuda}")
    elif report.get("hip_version"):
        d.add(OK, f"compute: ROCm {report['hip_version']} build, amdgpu driver {report.get('amdgpu_driver') or 'unreadable'}")
    bw = float(report.get("busbw_gbps", 0.0))
    line = (f"compute: 2-rank all-reduce ({report.get('backend')}, {len(report.get('hosts', []))} node(s)) "
            f"{bw:.2f} GB/s bus bandwidth")
    if not report.get("allreduce_ok", False):
        d.add(FATAL, line + ": WRONG SUM, the network corrupts data")
    elif d.gpu_site and len(report.get("hosts", [])) > 1 and bw < 5.0:
        d.add(FATAL, line + ": far below Slingshot/InfiniBand; NCCL/RCCL fell back to TCP sockets (check the plugin)")
    else:
        d.add(OK, line)


def run_compute(d: Doctor, timeout_s: int) -> None:
    if d.profile.executor != "slurm" or not shutil.which("sbatch", path=d.env.get("PATH")):
        d.add(FATAL, f"compute: needs sbatch on PATH and a SLURM profile (profile {d.profile.name} runs {d.profile.executor})")
        return
    nodes = 2 if d.max_nodes > 1 else 1
    folder = d.profile.repo / "results" / "doctor"
    folder.mkdir(parents=True, exist_ok=True)
    out, log = folder / "compute.json", folder / "compute.log"
    out.unlink(missing_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".sh", dir=folder, delete=False) as f:
        f.write(compute_script(d, out, nodes))
    try:
        run = subprocess.run(["sbatch", *sbatch_args(d, nodes, log), f.name], capture_output=True, text=True,
                             env=d.env, timeout=timeout_s, cwd=d.profile.repo)
    except subprocess.TimeoutExpired:
        d.add(FATAL, f"compute: the probe job did not end within {timeout_s} s (queue wait?); see {log}")
        return
    finally:
        os.unlink(f.name)
    if run.returncode != 0 or not out.exists():
        tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
        d.add(FATAL, f"compute: the probe job failed (sbatch rc {run.returncode}: {run.stderr.strip() or ' | '.join(tail) or 'no output'}); see {log}")
        return
    read_probe(d, json.loads(out.read_text()))


# -- the command ----------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="a folder name under profiles/")
    p.add_argument("--compute", action="store_true", help="also submit one tiny job through the site's launcher")
    p.add_argument("--repo", default=".", help="the workflow's folder (default: here)")
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
    if not args.profile:
        raise SpecError("doctor needs --profile NAME (a folder under profiles/)")
    doctor = Doctor(load_profile(args.profile, Path(args.repo).resolve()), fs_root=args.fs_root)
    doctor.run_all()
    if args.compute and not any(f.level == FATAL for f in doctor.findings):
        run_compute(doctor, args.timeout)
    elif args.compute:
        doctor.add(WARN, "compute: not submitted, fix the FATAL lines first (a job would only fail on them)")
    for f in doctor.findings:
        out(f.line())
    fatal = sum(f.level == FATAL for f in doctor.findings)
    out(f"doctor: {fatal} fatal, {sum(f.level == WARN for f in doctor.findings)} warnings (profile {args.profile})")
    return 1 if fatal else 0
