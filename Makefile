# The two commands of the README: `make demo` and `make test`. Each sets itself up on a fresh
# Debian machine (as root): a .venv with exactly the versions of requirements/lock.txt (the CPU
# build of torch 2.13.0, DeepSpeed, Triton, the dev tools), the shipped corpus' index files; the
# tests and the demo bring up their own local SLURM.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LOCK := requirements/lock.txt
# CPU build for this machine; GPU clusters bring their own torch. `make lock` resolves with it.
TORCH_PIN := torch==2.13.0
export DS_ACCELERATOR ?= cpu
export PYTHONUNBUFFERED := 1

.PHONY: demo test lint install lock data tools clean bench-cpu gpu-check

install: $(STAMP)

# Exactly the lock, nothing resolved here (--no-deps), then our own package; `pip check` fails the
# install if the lock misses a requirement (setup.cfg gained one: run `make lock`).
$(STAMP): setup.cfg pyproject.toml $(LOCK)
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (python3 >= 3.10)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r $(LOCK)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(PY) -m pip check --disable-pip-version-check
	touch $(STAMP)

# A deliberate upgrade: the newest versions setup.cfg allows, resolved in a throwaway venv and
# written to the lock. Then `make clean test`, and commit the lock with what the suite needed.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	.lock-venv/bin/python -m pip install --quiet --disable-pip-version-check '.[train,kernels,dev]'
	{ sed -n '/^#/p' $(LOCK); .lock-venv/bin/python -m pip freeze --all --disable-pip-version-check \
	    --exclude bloomctl --exclude pip | sed -E 's/^torch==([0-9.]+)\+cpu$$/torch==\1/'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .lock-venv build bloomctl.egg-info

data: $(STAMP)
	$(PY) -m trainer.data.prepare_corpus --out data/corpus

# Two pytest sessions at once: the tests marked `idle` (in-process, no wall-clock deadline:
# tests/conftest.py) at nice 19, on the CPU the real-cluster tests leave while they wait, beside
# the rest; both must pass, and the idle session's report follows the other's.
test: $(STAMP) data lint tools
	@idle_log=$$(mktemp); \
	nice -n 19 $(PY) -m pytest -q -p no:cacheprovider -m idle >"$$idle_log" 2>&1 & idle=$$!; \
	$(PY) -m pytest -q -m "not idle"; main=$$?; \
	wait $$idle; idle_rc=$$?; \
	echo "== the tests marked idle, run beside the others at nice 19 (exit $$idle_rc):"; cat "$$idle_log"; rm -f "$$idle_log"; \
	[ $$main -eq 0 ] && [ $$idle_rc -eq 0 ]

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
	rm -rf $(VENV) .pytest_cache .lock-venv
