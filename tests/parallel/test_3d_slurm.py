"""A 4-node job on the real local SLURM cluster (one rank per emulated node, tp=2 x pp=2, gloo)
trains the tiny BLOOM, and its losses and gradient norms match the single-process run (fp32, 1e-5).
What this adds to tests/parallel/test_3d_trainer.py (the trainer at every layout, started with
srun's variables by hand): the ranks are started by a real srun from the rendered sbatch script.

The job is the rendered sbatch of configs/demo-cpu-4node.yaml (4 nodes x 1 rank, MASTER_ADDR/PORT
exported by the script), submitted with `orchestrator.runs.submit_run`; srun starts the 3D harness,
which reads SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID through trainer.launch like the trainer does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.parallel.three_d_runs import compare

# ~150 s on 2 cores (cluster up + a 4-rank DeepSpeed job). `slow` is a label only: `make test` runs
# every test, this one included (deselect with -m 'not slow' for a quick local pass).
pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("deepspeed")

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo-cpu-4node.yaml"
HARNESS = REPO / "tests" / "parallel" / "three_d_harness.py"
ENDED = ("completed", "failed", "cancelled", "timeout", "node_fail")


def test_four_node_tp2_pp2_job_matches_single_process(local_cluster, slurm_scheduler, single_process, tmp_path):
    from orchestrator.runs import job_table, submit_run

    out = tmp_path / "slurm-result.json"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"tp": 2, "pp": 2, "dp": 1, "dtype": "fp32", "steps": 10, "out": str(out)}))
    run_dir = tmp_path / "run"
    result = submit_run(DEMO, run_dir, slurm_scheduler, command=[sys.executable, str(HARNESS), str(spec)])
    (job,) = result.job_ids
    deadline = time.time() + 400
    rows: list[dict] = []
    while time.time() < deadline:
        rows = job_table(run_dir, slurm_scheduler)
        if rows and all(r["state"] in ENDED for r in rows):
            break
        time.sleep(1.0)
    log = run_dir / "jobs" / f"slurm-{job}.out"
    text = log.read_text(errors="replace") if log.exists() else "(no job output)"
    assert rows and (rows[0]["state"], rows[0]["exit_code"]) == ("completed", 0), text[-4000:]
    assert rows[0]["nodes"] and len(rows[0]["nodes"]) == 4, rows
    slurm_run = json.loads(out.read_text())
    assert slurm_run["layout"] == [1, 2, 2]
    reference = single_process("fp32")
    compare(slurm_run, reference, "fp32", f"SLURM job {job} on {rows[0]['nodes']} (tp=2, pp=2) vs single process")
