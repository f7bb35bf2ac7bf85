"""Containers, as far as they can be checked without building them (no image builds on
our machines): the Dockerfiles pass hadolint, the Apptainer definitions parse, and every
pin agrees: Dockerfile = .def = constraints = Makefile, all within pyproject.toml."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_passes_hadolint(flavor: str) -> None:
    out = subprocess.run([_tool("hadolint"), "--no-color", str(C / f"Dockerfile.{flavor}")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("flavor", FLAVORS)
def test_apptainer_definition_parses(flavor: str) -> None:
    parsers = pytest.importorskip("spython.main.parse.parsers") if not IN_CI else __import__(
        "spython.main.parse.parsers", fromlist=["SingularityParser"])
    text = (C / f"scaleladder-{flavor}.def").read_text()
    header = dict(re.findall(r"^(Bootstrap|From):\s*(\S+)$", text, re.M))
    assert header["Bootstrap"] == "docker"
    recipe = next(iter(parsers.SingularityParser(str(C / f"scaleladder-{flavor}.def")).recipe.values()))
    # the same base as the Dockerfile, so the two images differ only in how they are built
    docker_from = re.search(r"^FROM (\S+)", (C / f"Dockerfile.{flavor}").read_text(), re.M).group(1)  # type: ignore[union-attr]
    assert recipe.fromHeader == header["From"] == docker_from
    sections = set(re.findall(r"^%(\w+)", text, re.M))
    assert sections == {"labels", "files", "post", "arguments", "environment", "runscript", "test"}
    files = {line.split()[0] for line in recipe.files}
    for src in files - {"README.md"}:  # README.md is the project's; the rest must exist here
        assert (REPO / src).exists(), src
    assert f"containers/constraints-{flavor}.txt" in files
    post = "\n".join(recipe.install)
    args = dockerfile_args(flavor)
    # versions from the one lock, as in the Dockerfile; the torch index is a build argument with the same default
    assert f"lock=containers/constraints-{flavor}.txt" in post and "TORCH_VERSION" not in text
    assert '"torch==$(sed -n \'s/^torch==//p\' "$lock")"' in post and '--no-deps --index-url "$TORCH_INDEX_URL"' in post
    assert f"TORCH_INDEX_URL={args['TORCH_INDEX_URL']}" in text[text.index("%arguments"):]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_pins_agree_with_each_other_and_pyproject(flavor: str) -> None:
    pins = constraints(flavor)
    args = dockerfile_args(flavor)
    assert "TORCH_VERSION" not in args  # one lock: no version pinned twice
    make = (REPO / "Makefile").read_text()
    assert f"torch=={pins['torch']} torchvision=={pins['torchvision']}" in make  # what CI and `make run` install
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["workflow"]]
    for req in required:
        name = norm(req.name)
        assert name in pins, f"{name} is a dependency but not pinned in constraints-{flavor}.txt"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), f"{name}=={pins[name]} violates {req}"
    dockerfile = (C / f"Dockerfile.{flavor}").read_text()
    assert f"lock=containers/constraints-{flavor}.txt" in dockerfile and '".[workflow]"' in dockerfile
    env = (REPO / "workflow/envs/scaleladder.yaml").read_text()
    assert f"torch=={pins['torch']}" in env


def test_rocm_lock_is_the_cuda_lock_without_cuda() -> None:
    cuda, rocm = constraints("cuda"), constraints("rocm")
    # the ROCm wheel's own triton build instead of the CUDA one, at the same version
    assert rocm.pop("pytorch-triton-rocm") == cuda["triton"]
    assert set(rocm) <= set(cuda)
    assert all(re.match(r"nvidia-|cuda-|triton$", k) for k in set(cuda) - set(rocm))
    assert {k: cuda[k] for k in rocm} == rocm


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
    assert '--build-arg GIT_COMMIT="$(git rev-parse HEAD)"' in text
    definition = (C / f"scaleladder-{flavor}.def").read_text()
    assert re.search(r"^%arguments\n\s+GIT_COMMIT=\n\s+IMAGE_TAG=\n", definition, re.M)  # defaults: apptainer fails on an undefined {{ }}
    assert 'export SCALELADDER_GIT_COMMIT="{{ GIT_COMMIT }}"' in definition and 'export SCALELADDER_IMAGE="{{ IMAGE_TAG }}"' in definition
    assert '--build-arg GIT_COMMIT="$(git rev-parse HEAD)"' in definition


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


def test_provenance_reads_the_commit_baked_into_an_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from scaleladder.rung import provenance

    def no_git(*a: object, **k: object) -> None:
        raise FileNotFoundError("git")  # an image has no git and no .git

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    monkeypatch.setenv("SCALELADDER_GIT_COMMIT", "0123abc")
    monkeypatch.setenv("SCALELADDER_IMAGE", "scaleladder:cuda")
    for var in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"):
        monkeypatch.delenv(var, raising=False)
    got = provenance.collect("dev")
    assert got["git_commit"] == "0123abc" and got["container_image"] == "scaleladder:cuda"


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
    import scaleladder.workflow as swf

    saved = os.environ.pop("SCALELADDER_REPO", None)
    try:
        swf.export_repo(str(REPO / "workflow" / "rules" / ".." / ".."))
        assert os.environ["SCALELADDER_REPO"] == str(REPO)
    finally:
        os.environ.pop("SCALELADDER_REPO", None)
        if saved is not None:
            os.environ["SCALELADDER_REPO"] = saved
