"""Containers, as far as they can be checked in seconds: the Dockerfiles pass hadolint and
need no SHELL (podman and buildah ignore it), the Apptainer definitions are thin wrappers over
the built images (one recipe), the mounted workstation config plans, and every pin agrees:
Dockerfile = constraints = Makefile, all within pyproject.toml. The images themselves are
built and run by `make image-check` (containers/image-check), CI's last step: minutes, not a test."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from conftest import REPO, VENV_BIN

C = REPO / "containers"
FLAVORS = ("cuda", "rocm")
IN_CI = os.environ.get("CI") == "true"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints(flavor: str) -> dict[str, str]:
    pins = {}
    for line in (C / f"constraints-{flavor}.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[norm(name)] = version
    return pins


def dockerfile_args(flavor: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", (C / f"Dockerfile.{flavor}").read_text(), re.M))


def _tool(name: str) -> str:
    path = shutil.which(name) or (os.path.join(VENV_BIN, name) if os.path.exists(os.path.join(VENV_BIN, name)) else None)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed (make setup installs it)")
        pytest.skip(f"{name} is not installed (make setup installs it)")
    return path


@pytest.mark.process
@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_passes_hadolint(flavor: str) -> None:
    out = subprocess.run([_tool("hadolint"), "--no-color", str(C / f"Dockerfile.{flavor}")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def run_bodies(flavor: str) -> list[str]:
    """Every RUN instruction of the Dockerfile, continuation lines joined, without `RUN`."""
    code = "\n".join(line for line in (C / f"Dockerfile.{flavor}").read_text().splitlines() if not line.lstrip().startswith("#"))
    return [" ".join(m.split()) for m in re.findall(r"^RUN\s+((?:.*\\\n)*.*)$", code, re.M)]


@pytest.mark.process
@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_builds_the_same_without_shell(flavor: str) -> None:
    """TRAP: SHELL is a Docker-format instruction; podman and buildah build OCI images by default
    and ignore it with a warning, so a RUN line that needed bash or pipefail would build
    differently there. No SHELL, and each RUN line parses under dash, Debian's /bin/sh."""
    text = (C / f"Dockerfile.{flavor}").read_text()
    assert not re.search(r"^SHELL\b", text, re.M)
    bodies = run_bodies(flavor)
    assert len(bodies) == 5
    for body in bodies:
        cmd = re.sub(r"^(--mount=\S+\s+)+", "", body.replace("\\ ", ""))
        unquoted = re.sub(r"'[^']*'", "''", cmd).replace("||", "")
        assert "|" not in unquoted or "bash -o pipefail -c" in cmd, cmd  # under sh a pipe hides a failure
        assert ";" not in cmd or cmd.startswith("set -eu;"), cmd  # `a; b` goes on after a failed a without -e
        sh = subprocess.run(["dash", "-n"], input=cmd, capture_output=True, text=True)
        assert sh.returncode == 0, f"{cmd}\n{sh.stderr}"
    # pip's cache is a build cache mount (not a layer), outside /tmp, where `--user` runs write
    installs = [b for b in bodies if "pip install" in b]
    assert installs and all(b.startswith("--mount=type=cache,id=scaleladder-pip,target=/root/.cache/pip ") for b in installs)
    assert all("PIP_CACHE_DIR=/root/.cache/pip" in b and "--no-cache-dir" not in b for b in installs)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11\.7-slim-bookworm\nFROM \$\{BASE_IMAGE\}$", text, re.M)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_apptainer_definition_wraps_the_built_image(flavor: str) -> None:
    """One recipe: the .def installs and sets nothing; it bootstraps from the archive that
    `podman save` (or `docker save`) writes of the image the Dockerfile builds, so the SIF
    cannot drift from the Docker image. It adds only the runscript a read-only image needs."""
    parsers = pytest.importorskip("spython.main.parse.parsers") if not IN_CI else __import__(
        "spython.main.parse.parsers", fromlist=["SingularityParser"])
    text = (C / f"scaleladder-{flavor}.def").read_text()
    archive = f"scaleladder-{flavor}.tar"
    assert dict(re.findall(r"^(Bootstrap|From):\s*(\S+)$", text, re.M)) == {"Bootstrap": "docker-archive", "From": archive}
    recipe = next(iter(parsers.SingularityParser(str(C / f"scaleladder-{flavor}.def")).recipe.values()))
    assert recipe.fromHeader == archive and not recipe.files
    # no %post, %files, %environment or %arguments: nothing installed, pinned or set twice
    assert set(re.findall(r"^%(\w+)", text, re.M)) == {"labels", "runscript", "test"}
    # the documented path: the Dockerfile's own build line and tag, saved to the archive From names
    docker = (C / f"Dockerfile.{flavor}").read_text()
    tag = f"scaleladder:{flavor}"
    assert f"build -f containers/Dockerfile.{flavor} -t {tag} " in docker and f"-t {tag} " in text
    assert f"podman save --format docker-archive -o {archive} {tag}" in text
    assert f"apptainer build containers/scaleladder-{flavor}.sif containers/scaleladder-{flavor}.def" in text
    # the runscript runs the image's CMD, from a writable copy of the workflow
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", docker, re.M).group(1))  # type: ignore[union-attr]
    assert f'exec {" ".join(cmd)} "$@"' in text
    readme = (REPO / "README.md").read_text()
    assert f"podman save --format docker-archive -o {archive} {tag}" in readme
    assert f"apptainer build containers/scaleladder-{flavor}.sif containers/scaleladder-{flavor}.def" in readme


@pytest.mark.parametrize("flavor", FLAVORS)
def test_pins_agree_with_each_other_and_pyproject(flavor: str) -> None:
    pins = constraints(flavor)
    args = dockerfile_args(flavor)
    assert "TORCH_VERSION" not in args  # one lock: no version pinned twice
    make = (REPO / "Makefile").read_text()
    assert f"torch=={pins['torch']} torchvision=={pins['torchvision']}" in make  # what CI and `make run` install
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["workflow"] + project["optional-dependencies"]["models"]]
    for req in required:
        name = norm(req.name)
        assert name in pins, f"{name} is a dependency but not pinned in constraints-{flavor}.txt"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), f"{name}=={pins[name]} violates {req}"
    dockerfile = (C / f"Dockerfile.{flavor}").read_text()
    assert f"lock=containers/constraints-{flavor}.txt" in dockerfile and '".[workflow,models,parquet,tensorboard,mlflow]"' in dockerfile
    env = (REPO / "workflow/envs/scaleladder.yaml").read_text()
    assert f"torch=={pins['torch']}" in env


def test_rocm_lock_is_the_cuda_lock_without_cuda() -> None:
    cuda, rocm = constraints("cuda"), constraints("rocm")
    # the ROCm wheel's own triton build instead of the CUDA one, at the same version
    assert rocm.pop("pytorch-triton-rocm") == cuda["triton"]
    assert set(rocm) <= set(cuda)
    assert all(re.match(r"nvidia-|cuda-|triton$", k) for k in set(cuda) - set(rocm))
    assert {k: cuda[k] for k in rocm} == rocm


def run_lock_step(tmp_path: Path, index: str) -> tuple[list[list[str]], str, str]:
    """The ROCm Dockerfile's torch RUN line (the one with --index-url), as the build runs it (dash, TORCH_INDEX_URL set as
    the build arg sets it, the lock copied in), with `pip` a recorder: the step's own shell
    decides what reaches pip. (pip installing torch takes minutes: `make image-check-rocm`.)
    Returns pip's argument lists, the lock the step left for the later installs, and stdout."""
    torch_step = next(b for b in run_bodies("rocm") if "--index-url" in b)
    body = re.sub(r"^(--mount=\S+\s+)+", "", torch_step.replace("\\ ", ""))
    (tmp_path / "containers").mkdir(parents=True)
    shutil.copy(C / "constraints-rocm.txt", tmp_path / "containers")
    (tmp_path / "bin").mkdir()
    pip = tmp_path / "bin" / "pip"
    pip.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\t" "$a"; done >> "$PIP_CALLS"; echo >> "$PIP_CALLS"\n')
    pip.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "TORCH_INDEX_URL": index,
           "PIP_CALLS": str(tmp_path / "calls")}
    out = subprocess.run(["dash", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    calls = [ln.rstrip("\t").split("\t") for ln in (tmp_path / "calls").read_text().splitlines()]
    return calls, (tmp_path / "containers/lock-used.txt").read_text(), out.stdout


@pytest.mark.process
def test_rocm_standin_replaces_only_the_rocm_index_pins(tmp_path: Path) -> None:
    """`make image-check-rocm` builds the real Dockerfile.rocm with TORCH_INDEX_URL=PyPI (the ROCm
    index cannot be reached here). Then, and only then, the ROCm-index-only pin is dropped
    (pytorch-triton-rocm: PyPI has no 3.8.0), torch and torchvision come from PyPI at the lock's
    versions, and the build says the ROCm torch was NOT installed; every other pin of the lock
    reaches the install unchanged. With the default index the step is the real one."""
    lock = (C / "constraints-rocm.txt").read_text()
    pins = constraints("rocm")
    rocm_index = dockerfile_args("rocm")["TORCH_INDEX_URL"]
    assert "download.pytorch.org" in rocm_index
    wheels = [f"torch=={pins['torch']}", f"torchvision=={pins['torchvision']}"]
    rest = ["install", "-c", "containers/lock-used.txt", "-r", "containers/lock-used.txt"]

    calls, used, said = run_lock_step(tmp_path / "real", rocm_index)
    assert calls == [["install", "--no-deps", "--index-url", rocm_index, *wheels,
                      f"pytorch-triton-rocm=={pins['pytorch-triton-rocm']}"], rest]
    assert used == lock and "NOT installed" not in said

    calls, used, said = run_lock_step(tmp_path / "standin", "https://pypi.org/simple")
    assert calls == [["install", "--no-deps", "--index-url", "https://pypi.org/simple", *wheels], rest]
    dropped = [ln for ln in lock.splitlines() if ln not in used.splitlines()]
    assert dropped == [f"pytorch-triton-rocm=={pins['pytorch-triton-rocm']}"]
    assert used == "".join(ln + "\n" for ln in lock.splitlines() if ln not in dropped)  # the rest byte for byte
    assert "STAND-IN: ROCm torch NOT installed" in said
    # the project's own install and `pip check` take the same lock the step left
    assert any('-c containers/lock-used.txt ".[workflow,models,parquet,tensorboard,mlflow]" && pip check' in b for b in run_bodies("rocm"))
    # wired: the make target, the build arg, the plain words in the output, a tag of its own
    script = (C / "image-check").read_text()
    assert re.search(r"^image-check-rocm:\n\tcontainers/image-check --rocm-standin$", (REPO / "Makefile").read_text(), re.M)
    assert 'build rocm "$tag" --build-arg TORCH_INDEX_URL=https://pypi.org/simple' in script
    assert 'notrocm="ROCm torch NOT installed: stand-in torch from PyPI' in script
    assert "tag=scaleladder:rocm-standin" in script


@pytest.mark.parametrize("flavor", FLAVORS)
def test_only_the_torch_wheels_come_from_the_torch_index(flavor: str) -> None:
    """TRAP: --index-url hides PyPI. The torch index step takes the torch wheels alone, without
    dependencies; everything else comes from PyPI under the same lock (verify_pins.py reads the
    same step to know which pin to look for where)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_pins", C / "verify_pins.py")
    vp = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(vp)  # type: ignore[union-attr]
    url, names = vp.torch_index(flavor)
    assert set(names) == ({"torch", "torchvision", "pytorch-triton-rocm"} if flavor == "rocm" else {"torch", "torchvision"})
    text = (C / f"Dockerfile.{flavor}").read_text()
    assert "--no-deps --index-url \"${TORCH_INDEX_URL}\"" in text
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert len(re.findall(r"--index-url", code)) == 1  # the project's own install uses PyPI
    plan = vp.plan(flavor)
    if url == vp.PYPI:  # PyPI's CUDA build: one index for every pin
        assert list(plan) == [vp.PYPI] and set(plan[vp.PYPI]) == set(constraints(flavor))
    else:
        assert set(plan[url]) == set(names) and not set(plan[vp.PYPI]) & set(names)
    if flavor == "cuda":
        assert url == vp.PYPI or "download.pytorch.org" in url  # PyPI's CUDA 13 build by default
        assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128" in text and "driver >= 580" in text


@pytest.mark.process
@pytest.mark.skipif(os.environ.get("SCALELADDER_NETWORK_TESTS") != "1",
                    reason="needs the package indexes (set SCALELADDER_NETWORK_TESTS=1; ~5 min)")
@pytest.mark.parametrize("flavor", FLAVORS)
def test_every_pin_resolves_on_its_index(flavor: str) -> None:
    out = subprocess.run([os.path.join(VENV_BIN, "python"), str(C / "verify_pins.py"), flavor], capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rocm_docker_run_adds_the_group_that_owns_dev_kfd() -> None:
    run = next(line for line in (C / "Dockerfile.rocm").read_text().splitlines() if "docker run" in line)
    # by gid: /dev/kfd belongs to `render` on current hosts, and the image has no group of that name
    assert '--group-add "$(stat -c %g /dev/kfd)"' in run and "--device /dev/kfd" in run


@pytest.mark.parametrize("flavor", FLAVORS)
def test_image_runs_the_local_profile_into_a_mounted_results(flavor: str) -> None:
    text = (C / f"Dockerfile.{flavor}").read_text()
    assert 'CMD ["snakemake", "--profile", "profiles/local"]' in text
    assert 'VOLUME ["/opt/scaleladder/results"]' in text and "WORKDIR /opt/scaleladder" in text
    for src in re.findall(r"^COPY (\S+)", text, re.M):
        if src not in ("README.md",) and not src.startswith("--"):
            assert (REPO / src).exists(), src
    assert "exec snakemake --profile profiles/local" in (C / f"scaleladder-{flavor}.def").read_text()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_images_bake_in_the_provenance_a_record_needs(flavor: str) -> None:
    # Without these, a docker run records git_commit and container_image as "".
    text = (C / f"Dockerfile.{flavor}").read_text()
    args = dockerfile_args(flavor)
    assert "GIT_COMMIT" in args and "IMAGE_TAG" in args
    env = re.search(r"^ENV SCALELADDER_GIT_COMMIT=\$\{GIT_COMMIT\} \\\n\s+SCALELADDER_IMAGE=\$\{IMAGE_TAG\}$", text, re.M)
    assert env, "ENV SCALELADDER_GIT_COMMIT/SCALELADDER_IMAGE from the build args"
    # TRAP (podman/buildah): an ENV step's cache ignores the ARG it reads; a RUN reading both
    # ARGs just before it is keyed on their values, so a new commit rebuilds the ENV
    last_run = text[:env.start()].rstrip().splitlines()[-1]
    assert last_run.startswith("RUN ") and "${GIT_COMMIT}" in last_run and "${IMAGE_TAG}" in last_run
    assert '--build-arg GIT_COMMIT="$(git rev-parse HEAD)"' in text
    # the SIF carries the image's ENV (its .def sets none of its own) and the same build line
    assert '--build-arg GIT_COMMIT="$(git rev-parse HEAD)"' in (C / f"scaleladder-{flavor}.def").read_text()


@pytest.mark.parametrize("flavor", FLAVORS)
def test_docker_run_works_as_any_host_user(flavor: str) -> None:
    text = (C / f"Dockerfile.{flavor}").read_text()
    # the documented line: results/ made by the user first, then written as that user
    run = next(line for line in text.splitlines() if "docker run" in line)
    assert run.startswith("#   mkdir -p results && docker run ") and '--user "$(id -u):$(id -g)"' in run
    assert '-v "$PWD/results:/opt/scaleladder/results"' in run and run.endswith(f"scaleladder:{flavor}")
    # a uid the image does not know has HOME=/: every cache must live somewhere writable
    env = text[text.index("ENV PIP_DISABLE_PIP_VERSION_CHECK"):text.index("WORKDIR")]
    assert "HOME=/tmp" in env and "XDG_CACHE_HOME=/tmp/" in env and "MPLCONFIGDIR=/tmp/" in env
    assert "chmod -R a+rX /opt/scaleladder" in text and "chmod 0777 results .snakemake" in text
    assert re.search(r"^USER 1000:1000$", text, re.M)  # non-root by default


@pytest.mark.parametrize("flavor", FLAVORS)
def test_images_carry_what_compile_rungs_build_with(flavor: str) -> None:
    """Without a C compiler in the image every -compile rung fails (inductor's
    C++ kernels on a CPU; Triton's launcher, driver.c including Python.h, on a GPU). The one
    stage installs gcc, g++ and libc6-dev, without recommends; Python.h is the base's (checked
    before the torch layer); and the build itself builds and imports a C and a C++ extension
    (campaign/toolchain.py). The Apptainer SIF's %test runs the same."""
    text = (C / f"Dockerfile.{flavor}").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 1  # one stage: what is installed is what runs
    bodies = run_bodies(flavor)
    (apt,) = [b for b in bodies if "apt-get install" in b]
    assert "apt-get install -y --no-install-recommends gcc g++ libc6-dev;" in apt and "rm -rf /var/lib/apt/lists/*" in apt
    assert 'os.path.join(sysconfig.get_paths()["include"], "Python.h")' in apt
    torch_layer = next(i for i, b in enumerate(bodies) if "--index-url" in b)
    assert bodies.index(apt) < torch_layer  # a missing header fails the build before the 3 GB layer
    (own,) = [b.replace("\\ ", "") for b in bodies if '".[workflow,models,parquet,tensorboard,mlflow]"' in b]
    assert own.endswith("&& pip check && python3 -m scaleladder.campaign.toolchain"), own
    assert "    python3 -m scaleladder.campaign.toolchain\n" in (C / f"scaleladder-{flavor}.def").read_text()
    # the stand-in base make image-check builds from carries the headers the python image has
    script = (C / "image-check").read_text()
    assert "debootstrap --variant=minbase --include=python3,libpython3.11-dev," in script
    assert re.search(r'^recipe="standin-v\d+ bookworm \$mirror python3 libpython3.11-dev ', script, re.M)


def test_image_check_runs_the_readme_default_line_and_a_compile_rung() -> None:
    """`make image-check` runs the image's default command, whose local ladder
    holds a -compile rung, so CI sees whether it produces a report. It runs the README's line
    with NO command (the image's CMD), requires the ladder, the figures and both reports, and
    reads the ladder back requiring a -compile rung compiled by inductor with a compile_s."""
    script = (C / "image-check").read_text()
    line = 'default_line=(podman run --rm --shm-size 8g --user "$user_id" -v "$PWD/results:/opt/scaleladder/results" "$tag")'
    assert line in script and '\n"${default_line[@]}" >"$work/default.log" 2>&1 ||' in script
    readme = (REPO / "README.md").read_text()
    readme_line = ('mkdir -p results && docker run --rm --gpus all --shm-size 8g --user "$(id -u):$(id -g)" '
                   '-v "$PWD/results:/opt/scaleladder/results" scaleladder:cuda\n')
    assert readme_line in readme
    outputs = script[script.index("outputs() {"):script.index("readback() {")]
    for f in ("ladder.h5", "report.html", "report.md", "plots/pareto.png", "plots/throughput_by_model.png"):
        assert f'"$1/{f}"' in outputs, f
    assert re.search(r"^outputs results\nsay .*\n.*\nreadback results 1 \|\| die", script, re.M)
    assert 'compile_backend") == "inductor"' in script and 'r.get("compile_s", 0) > 0' in script
    assert re.search(r"^toolchain \"\$tag\"$", script, re.M) and re.search(r"^  toolchain \"\$tag\"$", script, re.M)
    # the default ladder holds the -compile rung the read-back requires
    from scaleladder.spec import parse_strategy

    site = yaml_load(REPO / "profiles/local/site.yaml")
    assert any(parse_strategy(s).compile for ladder in site["ladders"] for s in ladder["strategies"])


def yaml_load(path: Path) -> dict:  # type: ignore[type-arg]
    import yaml

    return yaml.safe_load(path.read_text())


def test_provenance_reads_the_commit_baked_into_an_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from scaleladder.rung import provenance

    def no_git(*a: object, **k: object) -> None:
        raise FileNotFoundError("git")  # an image has no git and no .git

    monkeypatch.setattr("subprocess.run", no_git)
    monkeypatch.setenv("SCALELADDER_GIT_COMMIT", "0123abc")
    monkeypatch.setenv("SCALELADDER_IMAGE", "scaleladder:cuda")
    for var in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"):
        monkeypatch.delenv(var, raising=False)
    got = provenance.collect("dev")
    assert got["git_commit"] == "0123abc" and got["container_image"] == "scaleladder:cuda"


@pytest.mark.process
def test_the_conda_env_installs_this_checkout_from_snakemakes_copy_of_it(tmp_path: Path) -> None:
    """--software-deployment-method conda: Snakemake builds the env from a COPY of
    workflow/envs/scaleladder.yaml under .snakemake/conda/, so its pip lines must not be
    relative to the file. They name ${SCALELADDER_REPO}, which pip expands and
    workflow/rules/common.smk sets. Checked the way conda would run them, from elsewhere
    (no conda here: the pip step is the part that broke)."""
    env = (REPO / "workflow/envs/scaleladder.yaml").read_text()
    lines = [re.sub(r"\s+#.*$", "", m) for m in re.findall(r"^\s+- (-[ce] .*)$", env, re.M)]
    assert lines and all("${SCALELADDER_REPO}" in ln and "../" not in ln for ln in lines)
    (tmp_path / "req.txt").write_text("\n".join(lines) + "\n")
    pip = [os.path.join(VENV_BIN, "python"), "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
           "--no-build-isolation", "-r", "req.txt"]
    ok = subprocess.run(pip, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "SCALELADDER_REPO": str(REPO)})
    assert ok.returncode == 0 and "Would install scaleladder" in ok.stdout, ok.stderr[-2000:]
    assert "swf.export_repo(" in (REPO / "workflow/rules/common.smk").read_text()
    import scaleladder.site.commands as swf

    saved = os.environ.pop("SCALELADDER_REPO", None)
    try:
        swf.export_repo(str(REPO / "workflow" / "rules" / ".." / ".."))
        assert os.environ["SCALELADDER_REPO"] == str(REPO)
    finally:
        os.environ.pop("SCALELADDER_REPO", None)
        if saved is not None:
            os.environ["SCALELADDER_REPO"] = saved


@pytest.mark.process
def test_the_mounted_ladder_config_plans_without_a_rebuild(tmp_path: Path) -> None:
    """containers/ladder.yaml, mounted into the image and read after the profile's site.yaml
    (README "Containers"; `make image-check` runs it inside the image): `site:` merges key by
    key, so its max_batch_cap reaches the max rung; `ladders:` replaces the profile's."""
    import yaml

    from conftest import snakemake, workflow_copy

    mounted = yaml.safe_load((C / "ladder.yaml").read_text())
    site = yaml.safe_load((REPO / "profiles/local/site.yaml").read_text())["site"]
    cap = mounted["site"]["max_batch_cap"]
    assert cap != site["max_batch_cap"]  # else the run inside the image could not tell the mount worked
    wf = workflow_copy(tmp_path / "wf")
    shutil.copy(C / "ladder.yaml", wf / "ladder.yaml")
    out = snakemake(wf, "-n", "-p", "--profile", "profiles/local", "--configfile", "profiles/local/site.yaml", "ladder.yaml").stdout
    assert re.search(r"^rung\s+3$", out, re.M) and re.search(r"^rung_max\s+1$", out, re.M)
    assert f"--max-batch-cap {cap} " in out and f"--steps {mounted['steps']} " in out


@pytest.mark.process
def test_image_check_runs_the_readme_lines_in_ci() -> None:
    """The README's container commands are the ones `make image-check` runs (CI's last step),
    but for --gpus all (no GPU in CI) and the uid, a stand-in for the host user's."""
    script = (C / "image-check").read_text()
    assert subprocess.run(["bash", "-n", str(C / "image-check")]).returncode == 0
    assert re.search(r"^image-check:\n\tcontainers/image-check$", (REPO / "Makefile").read_text(), re.M)
    assert re.search(r"^make image-check$", (REPO / ".ci/run").read_text(), re.M)
    readme = (REPO / "README.md").read_text()
    run = 'run --rm --shm-size 8g --user "$user_id" -v "$PWD/results:/opt/scaleladder/results"'
    assert f"podman {run}" in script
    assert run.replace('--shm-size 8g --user "$user_id"', '--gpus all --shm-size 8g --user "$(id -u):$(id -g)"') in readme
    mount = '-v "$PWD/ladder.yaml:/opt/scaleladder/ladder.yaml:ro"'
    configured = "snakemake --profile profiles/local --configfile profiles/local/site.yaml ladder.yaml"
    assert mount in script and configured in script and mount in readme and configured in readme
    assert "podman build --pull=never -f \"containers/Dockerfile.$flavor\" -t \"$image\"" in script
    assert "--build-arg GIT_COMMIT=\"$commit\" --build-arg IMAGE_TAG=\"$image\"" in script
    # the stand-in base is never tagged as the real one: a later build with a registry would take it
    standin = re.search(r"^standin=(\S+)$", script, re.M).group(1)  # type: ignore[union-attr]
    assert "python" not in standin and standin.startswith("localhost/")


def test_dockerignore_keeps_what_the_images_copy() -> None:
    """The build context is the repository root: leave out the venv, results and bytecode (which
    would rebuild the source layers on every test run), but nothing an image COPYs."""
    ignored = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert {".venv", "results", ".git", "**/__pycache__", "**/*.egg-info"} <= set(ignored)
    for flavor in FLAVORS:
        for src in re.findall(r"^COPY (\S+)", (C / f"Dockerfile.{flavor}").read_text(), re.M):
            assert not any(src == ig or src.startswith(ig.rstrip("/") + "/") for ig in ignored), src


def _pipefail_scripts() -> list[Path]:
    scripts = [p for d in (REPO / ".ci", C, REPO / "scripts") if d.is_dir() for p in sorted(d.iterdir()) if p.is_file()]
    return [p for p in scripts if p.read_text(errors="replace").startswith("#!") and "pipefail" in p.read_text()]


@pytest.mark.parametrize("script", _pipefail_scripts(), ids=lambda p: p.name)
def test_no_pipe_into_grep_q_under_pipefail(script: Path) -> None:
    """`cmd | grep -q x` under pipefail fails when grep exits at its first match and cmd then dies
    of SIGPIPE: CI's image check at e8527cd refused an image that did record its commit. Here-
    strings (`grep -q x <<<"$(cmd)"`) do not race. A `head -1 | grep` is safe (one write)."""
    lines = script.read_text().splitlines()
    bad = [f"{script.name}:{i}: {ln.strip()}" for i, ln in enumerate(lines, 1)
           if not ln.lstrip().startswith("#")
           and re.search(r"\|\s*grep\s+-\w*q", ln) and not re.search(r"\bhead -1[^|]*\|", ln)]
    assert not bad, "\n".join(bad)
