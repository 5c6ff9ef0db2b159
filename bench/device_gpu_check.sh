#!/usr/bin/env bash
# `make gpu-check` (bench/gpu_check.py) on a lent GPU machine, prepared for one run (issue 25): the
# GPU tests, the side-by-side kernel benchmark that rewrites bloom_kernels/dispatch_table.json, and the
# bloom-1b7 step beside transformers + AdamW with its profile. Under 8 minutes of checks. Here, once:
#     bash bench/device_wheels.sh
# then, with the device tool, from the repo root:
#     run(command="set -o pipefail; bash bench/device_gpu_check.sh 2>&1 | tee $OUT/device_gpu_check.log",
#         carry=[".whl", "data/corpus"], timeout_s=580)
# On that machine the image's python3 runs the code (torch, triton, transformers there); what it
# lacks travels as wheels in .whl/ and is installed with --target into /tmp/site (as
# bench/device_run.sh). Comes back in $OUT (8 files, the device tool's limit): the log, gpu_check.json,
# gpu_tests.xml, kernels_side_by_side.{json,md}, train_step_gpu.json, train_step_gpu_profile.md and
# dispatch_table.json: copy them to bench/results/ and bloom_kernels/, and commit them.
# GPU_CHECK_SECONDS (default 480) is gpu_check.py's budget; without a GPU everything skips, exit 0.
set -u -o pipefail
# TRITON_INTERPRET=0: tests/conftest.py turns the interpreter on when /dev/nvidiactl is missing
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda TRITON_INTERPRET=0 PATH=$PATH:/usr/local/nvidia/bin
export PYTEST_ADDOPTS="-rA -o junit_logging=all --durations=15"
OUT=${OUT:-/tmp/device_gpu_check_out}
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_SECONDS:-480}
mkdir -p "$OUT"
part() { echo; echo "=== $* (t=${SECONDS}s) ==="; }

part "machine"
date -u; nproc; $PY -V; nvidia-smi -L 2>&1 | head -3

part "wheels from .whl"
if compgen -G ".whl/*.whl" >/dev/null; then
  timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} \
    || echo "WHEEL INSTALL FAILED: the import check below names what is missing"
else
  echo "no wheels in .whl (bench/device_wheels.sh fetches them): using what $PY has"
fi

part "imports"
timeout 120 $PY - <<'PYEOF'
import importlib
import sys
sys.path.insert(0, ".")
for name in ["torch", "triton", "transformers", "deepspeed", "pydantic", "torch.nn.attention.flex_attention",
             "bloom_kernels.dispatch", "bloom_kernels.implementations", "trainer.engine", "trainer.model"]:
    try:
        module = importlib.import_module(name)
        print(f"ok       {name:36s} {getattr(module, '__version__', '')}")
    except Exception as exc:  # noqa: BLE001
        print(f"MISSING  {name:36s} {type(exc).__name__}: {exc}")
PYEOF

part "bench/gpu_check.py --budget-seconds $BUDGET"
# what comes back must be from this run: remove the recorded copies of what it writes (not the table:
# the benchmark merges its rows into it)
rm -f bench/results/gpu_check.json bench/results/gpu_tests.xml bench/results/kernels_side_by_side.json \
      bench/results/kernels_side_by_side.md bench/results/train_step_gpu.json bench/results/train_step_gpu_profile.md
timeout $((BUDGET + 60)) $PY bench/gpu_check.py --budget-seconds "$BUDGET"
echo "gpu_check: exit $?"

part "results"
for f in bench/results/gpu_check.json bench/results/gpu_tests.xml bench/results/kernels_side_by_side.json \
         bench/results/kernels_side_by_side.md bench/results/train_step_gpu.json \
         bench/results/train_step_gpu_profile.md bloom_kernels/dispatch_table.json; do
  [ -f "$f" ] && cp "$f" "$OUT/"
done
ls -la "$OUT"
cat bench/results/gpu_check.json 2>/dev/null
echo "device_gpu_check: done in ${SECONDS}s"
