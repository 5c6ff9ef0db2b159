#!/usr/bin/env bash
# The second GPU run (after bench/device_run.sh): what the first one found, and the GPU paths built
# after it. Same setup (the image's python3, wheels in .whl/, data/corpus carried):
#
#     run(command="set -o pipefail; bash bench/device_followup.sh 2>&1 | tee $OUT/followup.log",
#         carry=[".whl", "data/corpus"], timeout_s=300)
#
# 1. the bf16 flash-attention GPU tests (the one-key case failed the first run on a zero tolerance);
# 2. `python -m trainer.health` on the GPU node: nvidia-smi's real answers (GPU count, ECC,
#    remapped rows, NVLink), torch.cuda, and the NCCL all-reduce of a one-node check step;
# 3. `python -m trainer` for 6 steps on the GPU (one rank, NCCL): the heartbeat's per-step compute
#    time from CUDA events (the straggler detector's input) next to the step's wall time.
set -u -o pipefail
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda TRITON_INTERPRET=0 PATH=$PATH:/usr/local/nvidia/bin
OUT=${OUT:-/tmp/device_followup_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
part() { echo; echo "=== $* (t=${SECONDS}s) ==="; }

part "wheels"
if compgen -G ".whl/*.whl" >/dev/null; then
  timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

part "1. flash attention bf16 on the GPU"
timeout 100 $PY -m pytest -q -rA -p no:cacheprovider tests/bloom_kernels/test_gpu.py -k "flash_attention_gpu and dtype1" \
  2>&1 | grep -E "gpu attention|passed|failed|Error" | tail -40
echo "attention tests: exit ${PIPESTATUS[0]}"

part "run directory (tiny model, cuda, 1 node x 1 GPU)"
RUN=$(mktemp -d /tmp/followup.XXXX)/run
timeout 60 $PY - "$RUN" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, ".")
from tests.trainer.runs import make_run_dir
make_run_dir(Path(sys.argv[1]), cluster={"accelerator": "cuda", "nodes": 1, "gpus_per_node": 1},
             checkpoint={"interval_steps": 3})
print("run dir", sys.argv[1])
EOF

part "2. trainer.health on the GPU node"
mkdir -p "$RUN/jobs/1"
SLURMD_NODENAME=gpu01 SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 \
SLURM_STEP_NUM_TASKS=1 SLURM_STEP_NUM_NODES=1 SLURM_STEP_NODELIST=gpu01 SLURM_JOB_NODELIST=gpu01 MASTER_ADDR=127.0.0.1 \
  timeout 150 $PY -m trainer.health --run-dir "$RUN" --job-dir "$RUN/jobs/1"
echo "health: exit $?"
cat "$RUN/jobs/1/health/gpu01.json"; echo
cp "$RUN/jobs/1/health/gpu01.json" "$OUT/health_gpu01.json" 2>/dev/null

part "3. python -m trainer, 6 steps on the GPU: compute time per step from CUDA events"
TRAINER_MAX_STEPS=6 TRAINER_TENSORBOARD=0 timeout 150 $PY -m trainer "$RUN" > "$OUT/trainer.log" 2>&1
echo "trainer: exit $?"; tail -5 "$OUT/trainer.log"
$PY - "$RUN" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
beat = json.loads((run / "heartbeats" / "rank-00000.json").read_text())
extra = beat.get("extra", {})
print("heartbeat:", {k: extra.get(k) for k in ("compute_seconds", "compute_step", "compute_group", "step_seconds")})
metrics = run / "metrics.jsonl"
for line in metrics.read_text().splitlines() if metrics.exists() else []:
    m = json.loads(line)
    print("metrics step", m.get("step"), "loss", m.get("loss"), "step_seconds", m.get("step_seconds"))
json.dump({"heartbeat_extra": extra}, open(sys.argv[1] + "/../compute.json", "w"), indent=1)
EOF
cp "$RUN/../compute.json" "$OUT/compute_gpu.json" 2>/dev/null
echo "device_followup: done in ${SECONDS}s"
