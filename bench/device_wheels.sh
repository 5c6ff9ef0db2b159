#!/usr/bin/env bash
# The Python packages the GPU machine's image lacks (bench/device_gpu_check.sh installs them from
# .whl/): fetched HERE, where pip reaches PyPI, for that machine's Python 3.12 on x86-64. The same
# set and versions as the run of 2026-11-30 (bench/results/device_run_gpu.log). Run from the repo root:
#     bash bench/device_wheels.sh        (then pass carry=[".whl", "data/corpus"] to the device run)
# DeepSpeed ships as a source archive only: its wheel is built here with DS_BUILD_OPS=0 (pure
# Python, ops built on first use), with this checkout's venv (its setup.py imports torch).
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
mkdir -p .whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  typing-extensions==4.16.0 hjson==3.1.0
if ! compgen -G ".whl/deepspeed-0.19.8-*.whl" >/dev/null; then
  DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
fi
ls -la .whl
du -sh .whl
