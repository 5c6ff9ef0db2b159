# The two commands of the README: `make demo` and `make test`. Each sets itself up on a fresh
# Debian machine (as root): a .venv with the CPU build of torch 2.13.0, DeepSpeed, Triton, the dev
# tools, the shipped corpus' index files; the tests and the demo bring up their own local SLURM.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU build for this machine; GPU clusters bring their own torch.
TORCH_PIN := torch==2.13.0
export DS_ACCELERATOR ?= cpu
export PYTHONUNBUFFERED := 1

.PHONY: demo test lint install data tools clean bench-cpu gpu-check

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (python3 >= 3.10)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[train,kernels,dev]'
	touch $(STAMP)

data: $(STAMP)
	$(PY) -m trainer.data.prepare_corpus --out data/corpus

test: $(STAMP) data lint tools
	$(PY) -m pytest -q

# Debian tools the tests run (SLURM itself is installed by the tests' local_cluster fixture):
# promtool, from the `prometheus` package, checks deploy/prometheus/ (tests/deploy/). Installed as
# root with apt-get when missing; elsewhere the test says what to install (and fails under CI).
tools:
	@command -v promtool >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "promtool missing: install Debian's prometheus package (tests/deploy/ needs it)"; fi; }

# `make demo DEMO_ARGS=--mock`: the demo on the mocked SLURM (NOT SLURM) where no local cluster can run.
demo: $(STAMP) data
	$(PY) -m orchestrator.demo $(DEMO_ARGS)

# `make test` runs these too (its `lint` prerequisite), so that CI keeps them true.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check orchestrator

bench-cpu: $(STAMP) data
	$(PY) bench/run_cpu.py

# On a machine with a GPU: GPU tests and benchmarks in one run, under 8 minutes (skips cleanly without one).
gpu-check: $(STAMP) data
	$(PY) bench/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache
