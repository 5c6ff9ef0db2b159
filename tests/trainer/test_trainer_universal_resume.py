"""`python -m trainer` resumes a checkpoint saved at another layout through its universal
conversion, and refuses (exit CONFIG_ERROR, with the command to run) until it is converted.

(dp,tp,pp) = (1,1,2) saves step 2; the same run continued at (2,1,1) from `step_2_universal` gives
steps 3-4 losses equal to the uninterrupted (1,1,2) run within the bf16 tolerance of the 3D tests
(tests/parallel/three_d_runs.py: one bf16 rounding, 2^-9 of the value, bounds a mean loss)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from orchestrator.protocol import ExitCode, RunPaths, read_jsonl
from tests.trainer import launch_local
from tests.trainer.runs import REPO_ROOT, make_run_dir

BF16_LOSS_RTOL = 2e-3
PP2 = {"cluster": {"gpus_per_node": 2}, "parallel": {"pp": 2, "tp": 1}}
DP2 = {"cluster": {"gpus_per_node": 2}, "parallel": {"pp": 1, "tp": 1}}


def losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_jsonl(RunPaths.of(run_dir).metrics) if not r.get("skipped")}


@pytest.mark.slow
def test_resume_at_another_layout_through_the_universal_checkpoint(tmp_path):
    original = make_run_dir(tmp_path / "original", **PP2, checkpoint={"interval_steps": 2, "keep_last": 5})
    assert launch_local.run(original, 2, {"TRAINER_STOP_AFTER_STEPS": "2"}, timeout=300) == [
        ExitCode.TIME_BUDGET, ExitCode.TIME_BUDGET], launch_local.read_log(original)
    moved = tmp_path / "moved"
    shutil.copytree(original, moved)
    assert launch_local.run(original, 2, {"TRAINER_MAX_STEPS": "4"}, timeout=300) == [ExitCode.FINISHED] * 2

    make_run_dir(moved, **DP2, checkpoint={"interval_steps": 2, "keep_last": 5})  # same run, new layout
    refused = launch_local.run(moved, 2, {"TRAINER_MAX_STEPS": "4"}, timeout=300)
    log = launch_local.read_log(moved)
    assert refused == [ExitCode.CONFIG_ERROR] * 2, log
    assert "was saved at dp=1 pp=2 tp=1 but this job runs dp=2 pp=1 tp=1" in log
    assert "python -m trainer.universal" in log

    subprocess.run([sys.executable, "-m", "trainer.universal", str(moved), "--step", "2"], check=True,
                   cwd=REPO_ROOT, capture_output=True, timeout=300)
    assert (RunPaths.of(moved).checkpoints / "step_0000002_universal" / "MANIFEST.json").is_file()
    assert launch_local.run(moved, 2, {"TRAINER_MAX_STEPS": "4"}, timeout=300) == [ExitCode.FINISHED] * 2, \
        launch_local.read_log(moved)
    assert "resumed from step_0000002_universal: step 2" in launch_local.read_log(moved)

    want, got = losses(original), losses(moved)
    errors = {s: abs(got[s] - want[s]) / abs(want[s]) for s in (3, 4)}
    print(f"losses after the universal resume vs the uninterrupted run: {got} vs {want}; rel err {errors}")
    assert max(errors.values()) <= BF16_LOSS_RTOL
