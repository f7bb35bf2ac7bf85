"""`scaleladder doctor`: every fault the Frontier/A100 review found, planted one at a time into a
copy of the profile, on a fake login node (fake sinfo, stat, apptainer, sbatch on PATH; the
site's absolute paths under a fake filesystem layout via --fs-root), must be caught by one
FATAL (or WARN) line naming the fix, with exit 1 when any is fatal. The untouched profile on
the fake Frontier passes. The real run, through the one-node Slurm, is in
tests/test_doctor_slurm.py."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from scaleladder.site import doctor, doctor_checks, profiles

PLUGIN = "/sw/frontier/rccl-net-plugin/1.0/lib/librccl-net.so"

FAKE_TOOLS = {
    # the partitions and nodes of a 2-node cluster
    "sinfo": """#!/bin/bash
if [[ " $* " == *" -N "* ]]; then printf 'frontier00001\\nfrontier00002\\n'; exit 0; fi
for a in "$@"; do [[ "$prev" == "-p" ]] && part=$a; prev=$a; done
[[ "$part" == "batch" || "$part" == "gpu" ]] && echo "$part"
exit 0
""",
    "stat": """#!/bin/bash
echo "${FAKE_FS_TYPE:-lustre}"
""",
    # `apptainer exec [--bind B] IMAGE CMD...`: torch's build, or ldd of the plugin
    "apptainer": """#!/bin/bash
if [[ " $* " == *" python -c "* ]]; then echo "${FAKE_TORCH:-2.14.1+rocm7.0 None 7.0.51831}"; exit 0; fi
if [[ " $* " == *" ldd "* ]]; then
  echo "	libfabric.so.1 => /opt/cray/libfabric/2.3.1/lib64/libfabric.so.1 (0x0)"
  echo "	libcxi.so.1 => /opt/host-lib64/libcxi.so.1 (0x0)"
  [[ -n "${FAKE_LDD_MISSING:-}" ]] && echo "	${FAKE_LDD_MISSING} => not found"
  exit 0
fi
exit 1
""",
    # sbatch --wait: the probe's report appears where the doctor reads it
    "sbatch": """#!/bin/bash
mkdir -p results/doctor && printf '%s' "$FAKE_PROBE" > results/doctor/compute.json && echo 4242
""",
}

FRONTIER_FILES = ("/opt/cray/libfabric/2.3.1/lib64/libfabric.so.1", "/var/spool/slurmd/.keep", "/lustre/orion/.keep",
                  "/usr/lib64/libcxi.so.1", "/usr/lib64/libjansson.so.4", PLUGIN, "/images/scaleladder-rocm.sif")


@pytest.fixture
def login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the workflow's profiles and config on a fake Frontier login node."""
    repo = tmp_path / "wf"
    for part in ("profiles", "config", "workflow", "containers"):
        shutil.copytree(REPO / part, repo / part)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in FAKE_TOOLS.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(stat.S_IRWXU)
    root = tmp_path / "root"
    for f in FRONTIER_FILES:
        (root / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / f.lstrip("/")).write_text("")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("USER", "tester")
    monkeypatch.setenv("SCALELADDER_SLURM_ACCOUNT", "abc123")
    monkeypatch.setenv("SCALELADDER_IMAGE", "/images/scaleladder-rocm.sif")
    monkeypatch.setenv("SCALELADDER_RCCL_NET_PLUGIN", PLUGIN)
    for var in ("SCALELADDER_SLURM_PARTITION", "LD_LIBRARY_PATH", "FAKE_LDD_MISSING", "FAKE_TORCH", "HDF5_USE_FILE_LOCKING"):
        monkeypatch.delenv(var, raising=False)
    return repo


def diagnose(repo: Path, profile: str = "frontier", compute: bool = False, only: str | None = None,
             skip: str | None = None) -> tuple[int, list[str]]:
    lines: list[str] = []
    args = argparse.Namespace(profile=profile, compute=compute, repo=str(repo), timeout=60, only=only, skip=skip, list=False,
                              fs_root=str(repo.parent / "root"), probe=None, probe_device="auto", probe_via=None)
    return doctor.main(args, out=lines.append), lines


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def fatal(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FATAL")]


@pytest.mark.process
def test_the_fixed_frontier_profile_passes_on_a_frontier_login_node(login: Path) -> None:
    rc, lines = diagnose(login)
    assert rc == 0 and not fatal(lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "plugin /sw/frontier/rccl-net-plugin/1.0/lib/librccl-net.so and its libraries resolve inside the image" in text
    assert "threads: 56 on 56 cores per node" in text and "results/: lustre" in text
    assert lines[-1] == f"doctor: 0 fatal, {sum(x.startswith('WARN') for x in lines)} warnings (profile frontier)"


SITE = "profiles/frontier/site.yaml"
CONF = "profiles/frontier/config.v8+.yaml"

# (what the review found, the file, the text planted back, what the doctor must say)
PLANTED = [
    ("the default OFI bind path does not exist", SITE, ("/lustre/orion,", "/lustre/orion,${SCALELADDER_OFI_RCCL:-/lustre/orion/world-shared/aws-ofi-rccl},"),
     "bind source /lustre/orion/world-shared/aws-ofi-rccl does not exist"),
    ("libfabric 1.15.2.0 is gone", SITE, ("${SCALELADDER_LIBFABRIC:-/opt/cray/libfabric/2.3.1}", "/opt/cray/libfabric/1.15.2.0"),
     "/opt/cray/libfabric/1.15.2.0/lib64 does not exist"),
    ("NCCL_NET is not forced", SITE, ("    NCCL_NET: $(", "    X_NCCL_NET: $("), "NCCL_NET is not forced"),
    ("no plugin at all", SITE, ("    NCCL_NET_PLUGIN: ", "    X_PLUGIN: "), "no NCCL_NET_PLUGIN in site.env"),
    ("FI_CXI_* and FI_MR_CACHE_MONITOR missing", SITE, ("    FI_MR_CACHE_MONITOR: kdreg2", "    X_MONITOR: kdreg2"),
     "missing from site.env: FI_MR_CACHE_MONITOR"),
    ("memhooks deadlocks with the plugin", SITE, ("FI_MR_CACHE_MONITOR: kdreg2", "FI_MR_CACHE_MONITOR: memhooks"), "memhooks deadlocks"),
    ("NCCL_CROSS_NIC missing", SITE, ("    NCCL_CROSS_NIC: 1", "    X_CROSS_NIC: 1"), "missing from site.env: NCCL_CROSS_NIC"),
    ("HSA_FORCE_FINE_GRAIN_PCIE missing", SITE, ("    HSA_FORCE_FINE_GRAIN_PCIE: 1", "    X_HSA: 1"),
     "missing from site.env: HSA_FORCE_FINE_GRAIN_PCIE"),
    ("alt_read without disable_rdzv_get", CONF, (" --network=disable_rdzv_get", ""), "only the first"),
    ("$LD_LIBRARY_PATH under set -u", SITE, (":/opt/host-lib64\n", ":/opt/host-lib64:$LD_LIBRARY_PATH\n"),
     "site.env.APPTAINERENV_LD_LIBRARY_PATH: the job's shell (set -u) stops on it: LD_LIBRARY_PATH: unbound variable"),
    ("8 ranks x (OMP + workers) oversubscribe", SITE, ("    OMP_NUM_THREADS: 1\n", "    OMP_NUM_THREADS: 7\n"),
     "threads: 8 ranks x (OMP_NUM_THREADS 7 + workers 6) = 104 threads on the 56 cores"),
    ("HDF5 file locking on Lustre", SITE, ('    HDF5_USE_FILE_LOCKING: "FALSE"', '    HDF5_X: "FALSE"'),
     "HDF5_USE_FILE_LOCKING is not FALSE"),
    ("a bad config", SITE, ("\nworkers: 6\n", "\nworkers: six\n"), "config key 'workers': 'six' is not of type 'integer'"),
    ("a light rule as a cluster job", "workflow/rules/report.smk", ("    aggregate,\n", ""),
     "rule(s) aggregate would each be a cluster job"),
]


@pytest.mark.process
@pytest.mark.parametrize("finding, rel, change, says", PLANTED, ids=[p[0] for p in PLANTED])
def test_each_planted_fault_is_one_fatal_line(login: Path, finding: str, rel: str, change: tuple[str, str], says: str) -> None:
    edit(login / rel, *change)
    rc, lines = diagnose(login)
    assert rc == 1, "\n".join(lines)
    hits = [line for line in fatal(lines) if says in line]
    assert len(hits) == 1, f"{finding}: expected one FATAL saying {says!r}:\n" + "\n".join(lines)


@pytest.mark.process
def test_libcxi_dependencies_must_resolve_inside_the_image(login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_LDD_MISSING", "libnl-3.so.200")
    rc, lines = diagnose(login)
    assert rc == 1 and any("the plugin needs libnl-3.so.200" in line and "/opt/host-lib64/libnl-3.so.200" in line
                           for line in fatal(lines)), lines


@pytest.mark.process
@pytest.mark.parametrize("env, says", [
    ({"SCALELADDER_SLURM_ACCOUNT": ""}, "slurm account: none; set SCALELADDER_SLURM_ACCOUNT"),
    ({"SCALELADDER_SLURM_PARTITION": "gpu-a100"}, "slurm partition 'gpu-a100': sinfo does not know it"),
    ({"SCALELADDER_IMAGE": "/images/missing.sif"}, "image /images/missing.sif: no such file"),
    ({"FAKE_TORCH": "2.14.1 13.0 None"}, "is a CUDA 13.0 build but the launcher runs apptainer --rocm"),
    ({"FAKE_TORCH": "2.14.1+cpu None None"}, "is a CPU-only build"),
    ({"SCALELADDER_RCCL_NET_PLUGIN": "/sw/nowhere/librccl-net.so"}, "bind source /sw/nowhere does not exist"),
    # apptainer splits --bind at ',' and ':' after the shell expanded it
    ({"SCALELADDER_RCCL_NET_PLUGIN": "/sw/a,b/librccl-net.so"}, "which holds ',' or ':' where apptainer's --bind splits"),
    ({"FAKE_FS_TYPE": "ext2/ext3"}, "results/: on ext2/ext3"),
])
def test_environment_faults(login: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, lines = diagnose(login)
    assert rc == 1 and any(says in line for line in fatal(lines)), "\n".join(lines)


@pytest.mark.process
def test_missing_plugin_variable_names_itself(login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SCALELADDER_RCCL_NET_PLUGIN")
    rc, lines = diagnose(login)
    assert rc == 1 and any("site.env.NCCL_NET_PLUGIN" in line and "set SCALELADDER_RCCL_NET_PLUGIN to librccl-net.so" in line
                           for line in fatal(lines)), lines


@pytest.mark.process
def test_snakemake_plugin_missing(login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = doctor_checks.version

    def version(dist: str) -> str:
        if dist == "snakemake-executor-plugin-slurm":
            raise doctor_checks.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(doctor_checks, "version", version)
    rc, lines = diagnose(login)
    assert rc == 1 and any(line.startswith("FATAL snakemake-executor-plugin-slurm: not installed") for line in lines), lines


@pytest.mark.process
def test_a100_deprecated_name_and_threads(login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = login / "profiles/a100/site.yaml"
    edit(site, "    TORCH_NCCL_ASYNC_ERROR_HANDLING: 1", "    NCCL_ASYNC_ERROR_HANDLING: 1")
    edit(site, "    OMP_NUM_THREADS: 1\n", "    OMP_NUM_THREADS: 8\n")
    monkeypatch.setenv("SCALELADDER_IMAGE", "/images/scaleladder-rocm.sif")  # present; the build is what matters
    monkeypatch.setenv("FAKE_TORCH", "2.14.1 13.0 None")
    rc, lines = diagnose(login, "a100")
    assert rc == 1
    assert any(line.startswith("WARN") and "NCCL_ASYNC_ERROR_HANDLING is deprecated" in line and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in line
               for line in lines), lines
    assert any("8 ranks x (OMP_NUM_THREADS 8 + workers 7) = 120 threads on the 64 cores" in line for line in fatal(lines)), lines
    # the CUDA 13 image: the driver floor is said before anything is queued
    assert any("CUDA 13.0 needs NVIDIA driver >= 580" in line for line in lines), lines


@pytest.mark.process
def test_compute_reports_a_driver_older_than_the_image_needs(login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_TORCH", "2.14.1 13.0 None")
    probe = {"gpus_seen": 8, "hostname": "gpu001", "cuda_version": "13.0", "hip_version": None, "nvidia_driver": "550.54.15",
             "backend": "nccl", "hosts": ["gpu001"], "busbw_gbps": 180.0, "allreduce_ok": True}
    monkeypatch.setenv("FAKE_PROBE", json.dumps(probe))
    rc, lines = diagnose(login, "a100", compute=True)
    assert rc == 1
    assert any("NVIDIA driver 550.54.15 is older than the 580 that the image's CUDA 13.0 needs" in line and "cu128" in line
               for line in fatal(lines)), lines
    assert any(line.startswith("ok    compute: GPUs seen 8") for line in lines)


@pytest.mark.process
def test_compute_sees_a_socket_fallback_between_nodes(login: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = {"gpus_seen": 8, "hostname": "frontier00001", "cuda_version": None, "hip_version": "7.0.51831",
             "backend": "nccl", "hosts": ["frontier00001", "frontier00002"], "busbw_gbps": 1.2, "allreduce_ok": True}
    monkeypatch.setenv("FAKE_PROBE", json.dumps(probe))
    rc, lines = diagnose(login, compute=True)
    assert rc == 1 and any("fell back to TCP sockets" in line for line in fatal(lines)), lines


def test_compute_script_uses_the_site_launcher(login: Path) -> None:
    d = doctor_checks.Context(profiles.load_profile("frontier", login))
    script = doctor.compute_script(d, login / "results/doctor/compute.json", nodes=2)
    assert "srun -N2 -n2 -c7 --gpus-per-task=1" in script and "apptainer exec --rocm" in script
    assert re.search(r"scaleladder doctor --probe \S+compute.json --probe-device cuda\n$", script)
    assert "export NCCL_NET_PLUGIN=" in script and "set -euo pipefail" in script
    args = doctor.sbatch_args(d, 2, login / "log")
    assert "--network=disable_rdzv_get" in args and "--account=abc123" in args and "--nodes=2" in args


def test_unknown_profile_is_one_line(login: Path) -> None:
    with pytest.raises(doctor.SpecError, match="no profile 'summit'"):
        diagnose(login, "summit")


def test_every_frontier_bind_source_is_a_documented_path_or_a_checked_variable() -> None:
    site = yaml.safe_load((REPO / SITE).read_text())["site"]
    sources = profiles.bind_sources(site["launcher"]) + profiles.bind_sources(site["scaleladder"])
    documented = {"/opt/cray", "/var/spool/slurmd", "/lustre/orion", "/usr/lib64/libcxi.so.1", "/usr/lib64/libjansson.so.4"}
    for src in sources:
        assert src in documented or src.startswith("${SCALELADDER_"), src


@pytest.mark.process
@pytest.mark.slurm
@pytest.mark.slow
def test_compute_through_the_real_one_node_slurm(tmp_path: Path) -> None:
    """`doctor --compute` on the CI's one-node Slurm: sbatch, then the profile's own srun starts
    2 CPU ranks of the probe (gloo); the report comes back from the compute node. Skipped
    without Slurm, except under CI=true, where it fails (as tests/test_workflow_slurm.py)."""
    import subprocess

    from conftest import VENV_BIN, workflow_copy
    from test_workflow_slurm import _slurm_state

    why = _slurm_state()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but no Slurm cluster is up ({why}); .ci/slurm-up starts one")
        pytest.skip(f"no Slurm cluster is up ({why}); run .ci/slurm-up")
    wf = workflow_copy(tmp_path / "wf")
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ["PATH"])
    run = subprocess.run([os.path.join(VENV_BIN, "scaleladder"), "doctor", "--profile", "slurm-localhost", "--compute",
                          "--timeout", "300"], cwd=wf, env=env, capture_output=True, text=True, timeout=400)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "ok    compute: GPUs seen 0 per rank's node, expected 0" in out
    m = re.search(r"ok    compute: 2-rank all-reduce \(gloo, 1 node\(s\)\) (\d+\.\d+) GB/s bus bandwidth", out)
    assert m and float(m.group(1)) > 0, out
    report = json.loads((wf / "results/doctor/compute.json").read_text())
    assert report["world"] == 2 and report["launcher"] == "slurm" and report["allreduce_ok"] is True
    # rank 0 built a C and a C++ extension where the ranks ran
    assert report["toolchain"]["c_extension"] == report["toolchain"]["cxx_extension"] == "ok", report["toolchain"]


def _read_probe(login: Path, profile: str, probe: dict[str, object]) -> list[str]:
    """The probe's findings alone (the rest of the doctor is other tests' business)."""
    d = doctor_checks.Context(profiles.load_profile(profile, login))
    return [f.line() for f in doctor.read_probe(d, probe)]


#: what campaign/toolchain.py reports inside an image that has what -compile rungs need
TOOLCHAIN = {"cc": "/usr/bin/gcc", "cxx": "/usr/bin/g++", "python_include": "/usr/local/include/python3.11", "python_h": True,
             "python": "/usr/local/bin/python3", "c_extension": "ok", "cxx_extension": "ok"}


@pytest.mark.process
@pytest.mark.parametrize("fault, says", [
    ({"cc": None, "cxx": None, "c_extension": "not tried", "cxx_extension": "not tried"},
     "no C compiler (Triton builds its launcher with $CC, gcc or clang): install gcc and libc6-dev; no C++ compiler"),
    ({"python_h": False, "c_extension": "not tried", "cxx_extension": "not tried"},
     "no Python.h in /usr/local/include/python3.11 (Triton's launcher includes it)"),
    ({"c_extension": "/usr/bin/gcc failed: fatal error: stdio.h: No such file or directory"},
     "a C extension does not build: /usr/bin/gcc failed: fatal error: stdio.h"),
], ids=["no compiler", "no headers", "no libc headers"])
def test_compute_checks_the_compile_toolchain_inside_the_image(login: Path, fault: dict[str, object], says: str) -> None:
    """Without gcc in the image every -compile rung fails. The probe job builds
    a C and a C++ extension where the rungs run (inside the image); a missing piece is one FATAL
    line naming it, and only where the ladder holds -compile rungs."""
    probe = {"gpus_seen": 8, "hostname": "frontier00001", "cuda_version": None, "hip_version": "7.0.51831",
             "backend": "nccl", "hosts": ["frontier00001"], "busbw_gbps": 80.0, "allreduce_ok": True}
    lines = _read_probe(login, "frontier", {**probe, "toolchain": {**TOOLCHAIN, **fault}})
    (line,) = fatal(lines)
    assert "-compile rung(s) would fail on frontier00001, inside /images/scaleladder-rocm.sif: " in line and says in line, line
    ok = _read_probe(login, "frontier", {**probe, "toolchain": TOOLCHAIN})
    assert not fatal(ok) and any("compute: toolchain: cc /usr/bin/gcc, c++ /usr/bin/g++" in ln for ln in ok), ok
    (old,) = fatal(_read_probe(login, "frontier", probe))  # an image whose scaleladder predates the check
    assert "did not report its compile toolchain" in old, old
    # no -compile rung in the ladder: nothing to say, whatever the image lacks
    edit(login / SITE, "fsdp2-full-compile]", "fsdp2-full]")
    assert not fatal(_read_probe(login, "frontier", {**probe, "toolchain": {**TOOLCHAIN, **fault}}))


@pytest.mark.process
def test_the_real_toolchain_probe_names_a_missing_compiler(tmp_path: Path) -> None:
    """campaign/toolchain.py on this machine: with gcc/g++ it builds and imports both modules;
    with $CC naming no compiler, and with an empty PATH, it names what is missing."""
    from scaleladder.campaign import toolchain

    if not (shutil.which("gcc") and shutil.which("g++")):
        pytest.skip("no gcc/g++ here")
    report = toolchain.probe()
    assert toolchain.missing(report) == [] and report["c_extension"] == report["cxx_extension"] == "ok", report
    bad = toolchain.probe({"PATH": os.environ["PATH"], "CC": "/bin/false"})
    assert toolchain.missing(bad) == ["a C extension does not build: /bin/false failed: no output"], bad
    assert toolchain.missing(toolchain.probe({"PATH": str(tmp_path)}))[:2] == [
        "no C compiler (Triton builds its launcher with $CC, gcc or clang): install gcc and libc6-dev",
        "no C++ compiler (inductor uses $CXX or g++): install g++"]


@pytest.mark.process
def test_compute_names_the_old_driver_when_torch_sees_no_gpu(login: Path) -> None:
    # CUDA 13 wheels on a 550 driver see NO GPU; the cause is the driver, not apptainer --nv,
    # and doctor --compute says so before the ladder's first rung fails with NoGPUError
    probe = {"gpus_seen": 0, "hostname": "gpu001", "cuda_version": "13.0", "hip_version": None, "nvidia_driver": "550.54.15",
             "backend": "gloo", "hosts": ["gpu001"], "busbw_gbps": 0.1, "allreduce_ok": True}
    lines = _read_probe(login, "a100", probe)
    (line,) = [ln for ln in fatal(lines) if "see no GPU" in ln]
    assert "NVIDIA driver 550.54.15 is older than the 580 that the image's CUDA 13.0 needs, so torch sees no GPU" in line, line
    assert "apptainer --nv" not in line
    assert len(lines) == 1  # the rest of the probe ran on no GPU: nothing more to say
    ok = _read_probe(login, "a100", {**probe, "gpus_seen": 8, "nvidia_driver": "580.65.06", "backend": "nccl", "busbw_gbps": 180.0,
                                     "toolchain": TOOLCHAIN})
    assert not fatal(ok) and any("NVIDIA driver 580.65.06 runs the image's CUDA 13.0" in ln for ln in ok), ok


@pytest.mark.process
def test_compute_on_rocm_with_no_gpu_names_the_amdgpu_driver(login: Path) -> None:
    probe = {"gpus_seen": 0, "hostname": "frontier00001", "cuda_version": None, "hip_version": "7.0.51831",
             "amdgpu_driver": "6.8.5", "backend": "gloo", "hosts": ["frontier00001"], "busbw_gbps": 0.1, "allreduce_ok": True}
    lines = _read_probe(login, "frontier", probe)
    assert any("ROCm 7.0.51831 build sees none under amdgpu driver 6.8.5" in ln for ln in fatal(lines)), lines


@pytest.mark.process
def test_no_ok_for_binds_after_a_fatal_bind(login: Path) -> None:
    """Bind FATALs are not followed by an 'ok binds: N sources checked' line summing them up."""
    edit(login / SITE, *PLANTED[0][2])
    rc, lines = diagnose(login)
    assert rc == 1 and any("bind source" in line for line in fatal(lines))
    assert not any(line.startswith("ok") and "binds:" in line for line in lines), "\n".join(lines)


@pytest.mark.process
def test_an_infiniband_site_needs_no_network_plugin(login: Path) -> None:
    """The A100 profile climbs nodes over InfiniBand, which NCCL serves itself: no RCCL/OFI plugin
    is asked of it (only a Slingshot site, which binds libcxi, needs one)."""
    _, lines = diagnose(login, "a100")
    assert not [line for line in fatal(lines) if "network" in line], lines
    assert any(line.startswith("ok") and "NCCL's own InfiniBand transport" in line for line in lines), lines


# -- the checks as units: each runs alone, and --only/--skip choose them ----------------------


def _context(login: Path, profile: str = "frontier") -> doctor_checks.Context:
    return doctor_checks.Context(profiles.load_profile(profile, login), fs_root=str(login.parent / "root"))


def test_every_check_has_a_name_and_one_line_saying_what_it_checks() -> None:
    assert list(doctor_checks.CHECKS) == ["config", "slurm", "local-rules", "env", "image", "binds", "network", "threads",
                                          "results-fs", "compile", "snakemake"]
    for name, c in doctor_checks.CHECKS.items():
        assert c.name == name and c.about and "\n" not in c.about, name


@pytest.mark.process
def test_one_check_runs_alone(login: Path) -> None:
    """A check is a function of the context: no other check needs to run first (the env check's
    expansions, which threads and binds read, are the context's own)."""
    threads = doctor_checks.CHECKS["threads"].run
    assert [f.line() for f in threads(_context(login))] == ["ok    threads: 56 on 56 cores per node"]
    edit(login / SITE, "    OMP_NUM_THREADS: 1\n", "    OMP_NUM_THREADS: 7\n")
    (found,) = threads(_context(login))
    assert found.level == doctor_checks.FATAL and "threads: 8 ranks x (OMP_NUM_THREADS 7 + workers 6) = 104" in found.what
    edit(login / SITE, ":/opt/host-lib64\n", ":/opt/host-lib64:$LD_LIBRARY_PATH\n")
    (found,) = doctor_checks.check_env(_context(login))
    assert found.what.startswith("site.env.APPTAINERENV_LD_LIBRARY_PATH: the job's shell (set -u) stops on it"), found
    assert doctor_checks.check_network(_context(login, "local")) == []  # one CPU node: nothing to say


@pytest.mark.process
def test_only_and_skip_choose_the_checks(login: Path) -> None:
    _, every = diagnose(login)
    rc, lines = diagnose(login, only="threads,config")  # the running order, not the order asked
    assert rc == 0 and lines == ["ok    config: valid; 345 rungs (scaleladder budget: what they cost)",
                                 "ok    threads: 56 on 56 cores per node", "doctor: 0 fatal, 0 warnings (profile frontier)"]
    _, lines = diagnose(login, skip="snakemake,results-fs")
    assert lines == [ln for ln in every if not ln.startswith(("ok    snakemake", "ok    results/:"))]
    _, lines = diagnose(login, only="network,binds", skip="binds")
    assert [ln.split(":")[0] for ln in lines] == ["ok    network", "doctor"]
    # a fault outside the chosen checks is not looked for
    edit(login / SITE, "    OMP_NUM_THREADS: 1\n", "    OMP_NUM_THREADS: 7\n")
    assert diagnose(login, skip="threads")[0] == 0 and diagnose(login, only="threads")[0] == 1


def test_an_unknown_check_is_one_line_naming_it_and_the_known_ones(login: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scaleladder import cli

    rc = cli.main(["doctor", "--profile", "frontier", "--repo", str(login), "--skip", "snakemake,thread"])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("scaleladder doctor: error: --skip: no check named 'thread'; the checks are config, slurm, "
                               "local-rules, env, image, binds, network, threads, results-fs, compile, snakemake (doctor --list says "
                               "what each does)\n"), err


def test_list_and_help_name_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    from scaleladder import cli

    assert cli.main(["doctor", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(doctor_checks.CHECKS)
    assert listed[0] == f"{'config':12} {doctor_checks.CHECKS['config'].about}"
    with pytest.raises(SystemExit):
        cli.main(["doctor", "--help"])
    assert "results-fs" in " ".join(capsys.readouterr().out.split())
