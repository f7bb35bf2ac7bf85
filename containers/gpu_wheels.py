"""`make gpu-wheels`: the wheels `make gpu-check` needs on a GPU machine with no registry.

The GPU machines we borrow (and many clusters' compute nodes) have a python3 (3.12) with
torch, numpy, h5py, tokenizers, pillow, matplotlib and pyyaml, but not torchmultimodal,
webdataset or scaleladder, and cannot reach a package registry. So, on a machine that can
(this one), we download what is missing into ``.whl/`` (git-ignored) and carry it along;
``make gpu-check`` there installs it with ``pip install --no-index --no-deps --target``.

    python containers/gpu_wheels.py             # download + build into .whl/, then verify
    python containers/gpu_wheels.py --verify    # only verify an existing .whl/
    python containers/gpu_wheels.py --verify-smoke   # verify, then run `gpu_check.py --device cpu --smoke` in isolation (~3 min)

What is carried, and why (everything else comes with the machine):

* torchmultimodal-nightly: FLAVA and the ViT layers (models/build.py);
* iopath: ``import torchmultimodal`` imports iopath's PathManager at once. torchmultimodal's
  other requirements (ftfy, DALL-E, regex) are never imported on our path, and iopath's own
  (portalocker, tqdm) are in the image;
* webdataset and braceexpand: the shard writer and the loader (data/shard.py, data/loader.py);
* scaleladder itself, as a wheel (``pip wheel --no-deps``), and ``COMMIT``, the commit it was
  built from: the machine may get a copy of the tree without .git, and every record should still
  name its commit.

NOT carried: torch and torchvision (the machine's build matches its driver; ours is 2.14, a
CUDA 13 build of 2 GB), numpy, h5py, pillow, matplotlib, pyyaml, tokenizers; jsonschema and
snakemake (only the workflow uses them, never `gpu-check`).

Traps this handles:

* ``pip download --platform/--python-version`` needs ``--only-binary=:all:``, and some pure
  packages publish no wheel for the pinned version (iopath 0.1.10 is an sdist only): those
  are BUILT here (``pip wheel --no-deps``), and the result must be a ``py3-none-any`` wheel,
  which installs anywhere.
* Two versions of one package in ``.whl/`` make the install fail (``--upgrade`` refuses
  duplicates): the folder's old wheels are removed first.
* ``pip wheel .`` in the checkout leaves ``build/`` behind: scaleladder is built from a
  temporary copy of what the wheel needs (pyproject.toml, README.md, src/).

Versions come from containers/constraints-cuda.txt, the tested lock the images install.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "containers" / "constraints-cuda.txt"

# (name as pip knows it, how to get a wheel): "binary" = a published wheel for cp312 x86_64,
# "build" = a pure-python sdist built into a py3-none-any wheel here.
CARRY: tuple[tuple[str, str], ...] = (
    ("torchmultimodal-nightly", "binary"),
    ("iopath", "build"),
    ("webdataset", "binary"),
    ("braceexpand", "binary"),
)
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

# What the GPU image we target already holds (the lent H100/H200 machines' image, as read on
# 2026-11-17): the isolation check below pretends to be that machine by offering only these
# from this environment, plus whatever torch itself requires (it comes with its own there).
GPU_IMAGE = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()

# A wheel installs on the GPU machine if it is pure or built for CPython 3.12 on x86_64 Linux.
OK_TAG = re.compile(r"-(py3|py2\.py3|py3\d*|cp312)-(none|cp312)-(any|manylinux[_0-9a-z]*x86_64)\.whl$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned() -> dict[str, str]:
    """name -> version from the lock the container images install."""
    out = {}
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def pip(*args: str, quiet: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", *args] + (["-q"] if quiet else [])
    print("gpu-wheels: $ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def git_commit() -> str:
    """The tree's commit (scaleladder.gitinfo: git with -dirty, else SCALELADDER_GIT_COMMIT), or "unknown".
    Loaded from the tree's src/: this script may run where scaleladder is not installed, and
    gitinfo imports nothing of scaleladder's."""
    if str(REPO / "src") not in sys.path:
        sys.path.insert(0, str(REPO / "src"))
    from scaleladder.gitinfo import git_commit as commit

    return commit(REPO) or "unknown"


def download(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    versions = pinned()
    for name, how in CARRY:
        spec = f"{name}=={versions[norm(name)]}"
        if how == "binary":
            plat = [a for p in PLATFORMS for a in ("--platform", p)]
            pip("download", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
                *plat, "-d", str(out), spec)
        else:
            pip("wheel", "--no-deps", "-w", str(out), spec)
    with tempfile.TemporaryDirectory(prefix="scaleladder-wheel-") as tmp:
        src = Path(tmp) / "scaleladder"
        shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for f in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / f, src / f)
        try:  # the venv's setuptools: no registry needed for the build itself
            import setuptools  # noqa: F401
            import wheel  # noqa: F401

            isolation = ["--no-build-isolation"]
        except ImportError:
            isolation = []
        pip("wheel", "--no-deps", *isolation, "-w", str(out), str(src))
    bad = [w.name for w in out.glob("*.whl") if not OK_TAG.search(w.name)]
    if bad:
        raise SystemExit(f"gpu-wheels: not installable on a cp312 x86_64 machine: {', '.join(bad)}")
    (out / "COMMIT").write_text(git_commit() + "\n")
    print(f"gpu-wheels: {len(list(out.glob('*.whl')))} wheels in {out}: "
          + ", ".join(sorted(w.name for w in out.glob('*.whl'))), flush=True)


def gpu_like_site(dest: Path) -> list[str]:
    """Links to the distributions of THIS environment that the GPU image also has (plus torch's own
    requirements): a stand-in for that machine's site-packages. Returns what it linked."""
    site = Path(sysconfig.get_paths()["purelib"])
    allowed = {norm(n) for n in GPU_IMAGE}
    # torch's requirements come with torch there (a CUDA build brings its nvidia-* and triton).
    todo, seen = ["torch", "torchvision"], set()
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for r in reqs:
            if "extra ==" not in r:
                todo.append(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0])
    allowed |= seen
    linked = []
    dest.mkdir(parents=True, exist_ok=True)
    for dist in md.distributions(path=[str(site)]):
        if norm(dist.metadata["Name"]) not in allowed:
            continue
        linked.append(dist.metadata["Name"])
        for f in dist.files or []:
            top = Path(f).parts[0]
            if top.startswith("..") or top.endswith(".pth") or top == "__pycache__":
                continue
            target, link = site / top, dest / top
            if target.exists() and not link.exists():
                link.symlink_to(target)
    return sorted(linked)


# Run with `python -S`: no site-packages at all, only PYTHONPATH = the installed wheels + the stand-in.
IMPORTS = r"""
import sys, os
target = sys.argv[1]
import scaleladder, scaleladder.rung.run, scaleladder.data.loader, scaleladder.data.shard, scaleladder.site.plan
import torchmultimodal, webdataset, braceexpand
assert scaleladder.__file__.startswith(target), f"scaleladder came from {scaleladder.__file__}, not the wheel"
from scaleladder.models.build import build_model
from scaleladder.flavors import get_flavor
for f in ("vit-debug", "flava-debug"):
    build_model(get_flavor(f), "cpu")
print("gpu-wheels: imports and model builds OK; scaleladder from", os.path.dirname(scaleladder.__file__))
"""


def verify(out: Path, smoke: bool) -> None:
    wheels = sorted(str(w) for w in out.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"gpu-wheels: no wheels in {out} (run `make gpu-wheels`)")
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-verify-") as tmp:
        t = Path(tmp)
        # The install command of `make gpu-check`, verbatim but for the folder.
        pip("install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target",
            str(t / "site"), *wheels)
        linked = gpu_like_site(t / "image")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(PYTHONPATH=f"{t / 'site'}:{t / 'image'}", PYTHONNOUSERSITE="1", CUDA_VISIBLE_DEVICES="")
        py = [sys.executable, "-S"]
        print(f"gpu-wheels: verifying with `python -S`, PYTHONPATH = the wheels + {len(linked)} distributions "
              "of this environment that the GPU image also has", flush=True)
        subprocess.run([*py, "-c", IMPORTS, str(t / "site")], env=env, check=True, cwd=tmp)
        # A real rung of each family, and the shard writer + loader (webdataset, braceexpand) at work.
        runs = [
            ["-m", "scaleladder", "shard", "--out", str(t / "shards"), "--samples", "16", "--per-shard", "8",
             "--image-size", "32", "--quiet"],
            ["-m", "scaleladder", "run", "--spec", "vit-debug/single/fp32/pre-lag/n1/b2", "--steps", "2", "--warmup", "1",
             "--device", "cpu", "--data", str(t / "shards"), "--workers", "1", "--out", str(t / "vit.h5")],
            ["-m", "scaleladder", "run", "--spec", "flava-debug/single/fp32/pre-lag/n1/b2", "--steps", "2", "--warmup", "1",
             "--device", "cpu", "--out", str(t / "flava.h5")],
        ]
        if smoke:
            runs.append([str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--smoke", "--out", str(t / "gpu-check")])
        for r in runs:
            print("gpu-wheels: $ python -S " + " ".join(r), flush=True)
            subprocess.run([*py, *r], env=env, check=True, cwd=tmp,
                           stdout=None if smoke and r[0].endswith("gpu_check.py") else subprocess.DEVNULL)
    print("gpu-wheels: verified: the wheels plus what the GPU image has import scaleladder, torchmultimodal and "
          "webdataset, and train both families", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--out", type=Path, default=REPO / ".whl", help="wheel folder (default .whl/, git-ignored)")
    ap.add_argument("--verify", action="store_true", help="only verify the wheels already in --out")
    ap.add_argument("--no-verify", action="store_true", help="download/build only")
    ap.add_argument("--verify-smoke", action="store_true", help="verify, also running gpu_check.py --device cpu --smoke isolated")
    a = ap.parse_args()
    if not (a.verify or a.verify_smoke):
        download(a.out)
    if not a.no_verify or a.verify or a.verify_smoke:
        try:
            verify(a.out, a.verify_smoke)
        except subprocess.CalledProcessError as e:
            # The child's own error (e.g. "No module named 'iopath'": a wheel to add to CARRY) is just above.
            step = " ".join(str(x) for x in e.cmd[2:4]) if len(e.cmd) > 3 and str(e.cmd[2]) != "-c" else "the import check"
            print(f"gpu-wheels: verification FAILED at {step} (exit {e.returncode}); see the error above", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
