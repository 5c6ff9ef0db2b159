#!/usr/bin/env bash
# Every GPU check of this project in one prepared script, for one run on a lent GPU machine (and a
# record of how the GPU results in bench/results/*gpu* were made). Run from the repo root:
#
#     set -o pipefail; OUT=/some/dir bash bench/device_run.sh 2>&1 | tee $OUT/device_run.log
#     (DEVICE_RUN_SECONDS=400: the time it plans for; PYTHON=python3, WHEELS=.whl: which ones)
#
# On that machine the image's python3 runs the code (torch, triton, transformers there); what it
# lacks travels as wheels in .whl/ (pydantic + pydantic-core cp312, annotated-types,
# typing-inspection, typing-extensions, hjson, deepspeed py3 built with DS_BUILD_OPS=0) and is
# installed with --target into /tmp/site. The corpus index (data/corpus, git-ignored) travels too.
# Parts, each under its own `timeout` so that one hang cannot eat the rest:
#   0. bench/async_checkpoint_gpu.py, in the background from the start (disk and host bound, little
#      GPU work: it overlaps the captures and the tests, and should end before the timed benchmarks)
#   1. nvidia-smi captures (stdout, stderr, exit code of each) -> $OUT/nvidia_smi.tar.gz
#   2. imports the GPU tests and benches need (a missing package is named, not a collection error)
#   3. bench/gpu_check.py (`make gpu-check`: pytest -m gpu, bench/kernels_side_by_side.py,
#      bench/train_step_gpu.py)
# Comes back in $OUT (at most 8 files): device_run.log, nvidia_smi.tar.gz, gpu_check.json,
# gpu_tests.xml, kernels_side_by_side.json, train_step_gpu.json, async_checkpoint_gpu.json, logs.tar.gz.
# (Since issue 25 bench/kernels_gpu.py is bench/kernels_side_by_side.py; bench/device_gpu_check.sh runs
# only `make gpu-check`, leaner, for the kernel and step figures.)
# Without a GPU every GPU part skips cleanly (exit 0), so it can be tried anywhere first.
# The run of 2026-11-30 (one H200): 269 s, everything passed except one test; the call was
#     run(command="set -o pipefail; DEVICE_RUN_SECONDS=400 bash bench/device_run.sh 2>&1 | tee $OUT/device_run.log",
#         carry=[".whl", "data/corpus"], timeout_s=410)
set -u -o pipefail
# TRITON_INTERPRET=0: tests/conftest.py turns the interpreter on when /dev/nvidiactl is missing;
# here the kernels must compile (the machine part below lists /dev/nvidia* to show which it was)
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda TRITON_INTERPRET=0 PATH=$PATH:/usr/local/nvidia/bin
# pytest: show the captured output (max errors) of passed tests too, and keep it in the JUnit XML
export PYTEST_ADDOPTS="-rA -o junit_logging=all --durations=15"
OUT=${OUT:-/tmp/device_run_out}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
LIMIT=${DEVICE_RUN_SECONDS:-400}
RESULTS=bench/results
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/device_run.XXXX)
left() { echo $((LIMIT - SECONDS)); }
part() { echo; echo "=== $* (t=${SECONDS}s, $(left)s left) ==="; }

part "machine"
date -u; uname -a; nproc; free -g | head -2; df -h /tmp | tail -1
$PY -V; command -v $PY; ls -la /dev/nvidia* 2>&1 | head

# -- wheels ------------------------------------------------------------------------------------
part "wheels from $WHEELS"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  ls -la "$WHEELS"
  if timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target /tmp/site "$WHEELS"/*.whl; then
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "WHEEL INSTALL FAILED (exit $?): the checks below will name what is missing"
  fi
else
  echo "no wheels in $WHEELS: using what $PY has"
fi
$PY -m pip list 2>/dev/null > "$WORK/pip_list.txt"; echo "pip list: $(wc -l < "$WORK/pip_list.txt") lines"

# -- async checkpoint on the GPU, in the background from now on: it is disk and host bound (little
# GPU work), so it overlaps the nvidia-smi captures and the tests, ideally not the timed benchmarks
part "bench/async_checkpoint_gpu.py in the background"
timeout 240 $PY bench/async_checkpoint_gpu.py --out "$WORK/async_checkpoint_gpu.json" --xl-step-delay 2.5 \
  > "$WORK/async_checkpoint_gpu.log" 2>&1 &
ASYNC=$!

# -- 1. nvidia-smi -----------------------------------------------------------------------------
part "nvidia-smi captures"
SMI=$WORK/nvidia_smi
mkdir -p "$SMI"
capture() {  # capture NAME ARGS...: NAME.txt (stdout), NAME.stderr.txt, NAME.rc, a line in commands.tsv
  local name=$1; shift
  timeout 30 nvidia-smi "$@" > "$SMI/$name.txt" 2> "$SMI/$name.stderr.txt"
  local rc=$?
  echo "$rc" > "$SMI/$name.rc"
  printf '%s\t%s\t%s\n' "$name" "$rc" "nvidia-smi $*" >> "$SMI/commands.tsv"
  echo "nvidia-smi $* -> exit $rc, $(wc -c < "$SMI/$name.txt") bytes"
  return $rc
}
if command -v nvidia-smi >/dev/null; then
  FIELDS=index,name,uuid,pci.bus_id,ecc.mode.current,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure
  try=0
  until capture "query_gpu_health" --query-gpu=$FIELDS --format=csv,noheader,nounits; do
    try=$((try + 1))
    for f in txt stderr.txt rc; do mv "$SMI/query_gpu_health.$f" "$SMI/query_gpu_health.rejected$try.$f"; done
    sed -i "\$s/^query_gpu_health\t/query_gpu_health.rejected$try\t/" "$SMI/commands.tsv"
    # nvidia-smi names the field it rejects: 'Field "x.y" is not a valid field to query.'
    bad=$(grep -ho 'Field "[^"]*"' "$SMI/query_gpu_health.rejected$try".{txt,stderr.txt} | head -1 | cut -d'"' -f2)
    [ -n "$bad" ] && [ $try -lt 5 ] || break
    echo "field $bad rejected: retrying without it"
    FIELDS=$(echo ",$FIELDS," | sed "s/,$bad,/,/; s/^,//; s/,\$//")
  done
  capture "nvlink_status" nvlink --status
  capture "nvlink_s" nvlink -s
  capture "q_ecc" -q -d ECC
  capture "query_gpu_count" --query-gpu=count --format=csv,noheader
  capture "topo_m" topo -m
  capture "list_gpus" -L
  capture "summary" 
  cat "$SMI/query_gpu_health.txt" "$SMI/query_gpu_count.txt" "$SMI/nvlink_status.txt" 2>/dev/null | head -20
else
  echo "no nvidia-smi on PATH" | tee "$SMI/NO_NVIDIA_SMI"
fi
tar -czf "$OUT/nvidia_smi.tar.gz" -C "$WORK" nvidia_smi

# -- 2. imports --------------------------------------------------------------------------------
part "imports the GPU tests and benches need"
timeout 90 $PY - <<'EOF'
import importlib
import sys
sys.path.insert(0, ".")
missing = []
for name in ["torch", "triton", "numpy", "pydantic", "pydantic_core", "deepspeed", "transformers", "tokenizers",
             "yaml", "jinja2", "rich", "prometheus_client", "matplotlib", "hypothesis", "pytest", "pytest_timeout",
             "orchestrator.plan.config", "trainer.model", "trainer.engine", "trainer.async_checkpoint",
             "bloom_kernels.dispatch"]:
    try:
        module = importlib.import_module(name)
        print(f"ok       {name:26s} {getattr(module, '__version__', '')}")
    except Exception as exc:  # noqa: BLE001
        missing.append(name)
        print(f"MISSING  {name:26s} {type(exc).__name__}: {exc}")
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("missing:", missing or "none")
EOF
echo "imports: exit $?"

# -- 3. gpu_check (tests, kernel and train-step benchmarks) + async checkpoint alongside ------
part "bench/gpu_check.py"
BUDGET=$(( $(left) - 25 ))
[ $BUDGET -gt 350 ] && BUDGET=350
timeout $((BUDGET + 30)) $PY bench/gpu_check.py --budget-seconds $BUDGET
echo "gpu_check: exit $?"
part "waiting for the async checkpoint bench"
wait $ASYNC
echo "async_checkpoint_gpu: exit $?"
cat "$WORK/async_checkpoint_gpu.log"

# -- results -----------------------------------------------------------------------------------
part "results"
for f in gpu_check.json gpu_tests.xml kernels_side_by_side.json train_step_gpu.json; do
  [ -f "$RESULTS/$f" ] && cp "$RESULTS/$f" "$OUT/"
done
[ -f "$WORK/async_checkpoint_gpu.json" ] && cp "$WORK/async_checkpoint_gpu.json" "$OUT/"
cp "$RESULTS/kernels_side_by_side.md" "$RESULTS/train_step_gpu_profile.md" bloom_kernels/dispatch_table.json "$WORK/" 2>/dev/null
# rank logs of a failed async run (a passing row deletes its run directories)
find /tmp/bench-async-checkpoint-gpu -name 'rank-*.log' 2>/dev/null | while read -r f; do
  mkdir -p "$WORK/async_rank_logs"; cp "$f" "$WORK/async_rank_logs/$(echo "${f#/tmp/}" | tr / _)"; done
tar -czf "$OUT/logs.tar.gz" -C "$WORK" --exclude nvidia_smi .
ls -la "$OUT"
cat "$RESULTS/gpu_check.json" 2>/dev/null
echo "device_run: done in ${SECONDS}s"
