"""Training health in the trainer, as real processes (`python -m trainer`, `python -m trainer.replay`,
2 ranks, dp = 2, gloo, bf16 + ZeRO-1, dropout on): the rollback directive with its exact data skip
and LR cut, checkpoints verified by their probe, and the SDC replay.

One base run is shared (module fixture): 6 steps of global batch 8, checkpoints at 2, 4 and 6, the
sample log on, and the TEST-ONLY fault `corruptmaster@step6`: the fp32 master weights are altered
at the save of step 6 after its probe was computed and before its files were written and hashed,
so step_0000006's manifest verifies. Each test works on a copy of it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from orchestrator.contract import (
    MANIFEST_NAME,
    ExitCode,
    Rollback,
    RunPaths,
    read_checkpoint_state,
    read_jsonl,
    write_rollback,
)
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir

pytest.importorskip("deepspeed")

RANKS, MBS, GBS = 2, 2, 8
CONFIG = {
    "cluster": {"gpus_per_node": RANKS},
    "model": {"dtype": "bf16", "hidden_dropout": 0.1, "attention_dropout": 0.1},
    "parallel": {"dp": RANKS, "micro_batch_size": MBS, "global_batch_size": GBS},
    "optimizer": {"lr": 1e-2, "min_lr": 1e-3, "warmup_samples": 16},
    "data": {"eval_interval": 4, "eval_iters": 1},
    "checkpoint": {"interval_steps": 2, "keep_last": 10},
}


def metrics(run: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_jsonl(RunPaths.of(run).metrics)}  # the last record of each step


def run_trainer(run: Path, env: dict[str, str]) -> str:
    """Run the ranks; rank 0's output of this run only (the rank logs are appended to)."""
    offset = len(launch_local.read_log(run)) if (run / "logs" / "rank-0.log").exists() else 0
    codes = launch_local.run(run, RANKS, env, timeout=300)
    log = launch_local.read_log(run)[offset:]
    assert all(c in (ExitCode.FINISHED, ExitCode.TIME_BUDGET) for c in codes), (codes, log[-3000:])
    return log


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    run = make_run_dir(tmp_path_factory.mktemp("health") / "base", **CONFIG)
    run_trainer(run, {"TRAINER_MAX_STEPS": "6", "TRAINER_SAMPLE_LOG": "1", "TRAINER_FAULT": "corruptmaster@step6"})
    return run


def copy_of(base: Path, dest: Path) -> Path:
    shutil.copytree(base, dest)
    return dest


# -- D: the probe -------------------------------------------------------------------------------
def test_probe_finds_master_weights_altered_before_the_hashes_and_the_run_resumes_from_the_one_before(
        base, tmp_path):
    run = copy_of(base, tmp_path / "run")
    paths = RunPaths.of(run)
    corrupted = hashlib.sha256((paths.checkpoint(6) / MANIFEST_NAME).read_bytes()).hexdigest()
    log = run_trainer(run, {"TRAINER_MAX_STEPS": "6"})
    assert "resumed from step_0000004" in log and "probe of step_0000004: bitwise, match" in log
    assert "probe of step_0000006: bitwise, MISMATCH" in log and "SKIPPING damaged checkpoint step_0000006" in log
    damaged = read_jsonl(paths.damaged)[-1]
    assert damaged["checkpoint"] == "step_0000006" and damaged["manifest_sha256"] == corrupted
    assert any("probe loss" in p for p in damaged["problems"]), damaged
    # Never deleted: the re-save of step 6 moved the damaged one aside.
    kept = [d for d in paths.checkpoints.glob(".replaced-step_0000006-*")
            if hashlib.sha256((d / MANIFEST_NAME).read_bytes()).hexdigest() == corrupted]
    assert kept, "the damaged checkpoint must be kept"
    # Steps 5-6 again, from the good step 4: what the base run computed before its save of step 6.
    before, again = metrics(base), metrics(run)
    for step in (5, 6):
        for key in ("loss", "grad_norm", "dp_losses", "lr"):
            assert again[step][key] == before[step][key], (step, key, again[step][key], before[step][key])
    print(damaged["problems"])


# -- F: the SDC replay -------------------------------------------------------------------------
def replay(run: Path, step: int, steps: int) -> tuple[int, dict]:
    out = run / "replay.json"
    out.unlink(missing_ok=True)
    codes = launch_local.run(run, RANKS, {}, timeout=300, module="trainer.replay",
                             args=("--step", str(step), "--steps", str(steps), "--output", str(out)))
    assert out.exists(), launch_local.read_log(run)[-3000:]
    return codes[0], json.loads(out.read_text())


def test_replay_matches_bitwise_and_names_an_altered_step_and_replica(base, tmp_path):
    run = copy_of(base, tmp_path / "run")
    # Steps 3-5 from step 2: dropout masks from the restored RNG states, an evaluation at step 4.
    code, result = replay(run, 2, 3)
    assert code == 0 and result["match"] and result["comparison"] == "bitwise", result
    assert result["steps_replayed"] == [3, 4, 5] and result["per_step"][1]["recorded_eval_loss"] is not None
    assert all(row["replayed_loss"] == row["recorded_loss"] for row in result["per_step"])

    # Replica 1's recorded loss of step 4 altered (and the mean with it), as SDC on its node would.
    lines = RunPaths.of(run).metrics.read_text().splitlines()
    index = max(i for i, line in enumerate(lines) if json.loads(line)["step"] == 4)
    record = json.loads(lines[index])
    record["dp_losses"][1] += 0.5
    record["loss"] += 0.25
    lines[index] = json.dumps(record)
    RunPaths.of(run).metrics.write_text("\n".join(lines) + "\n")
    code, result = replay(run, 2, 3)
    first = result["first_mismatch"]
    assert code == 3 and not result["match"] and first["step"] == 4 and first["differ"] == ["loss"], result
    assert [(r["dp_replica"], r["ranks"]) for r in first["dp_replicas"]] == [(1, [1])]
    assert [row["match"] for row in result["per_step"]] == [True, False, True]


# -- B + C: the rollback -----------------------------------------------------------------------
SKIPS = [[16, 24], [76, 90]]  # batch 3 of the old order; and a range spanning the old batch boundaries 80, 88


def final_history(run: Path) -> list[int]:
    """The positions the kept history read, in the global order: per step the last line of each DP
    replica's log, micro-step by micro-step (rank 0's MBS samples, then rank 1's)."""
    per_replica = []
    for d in range(RANKS):
        per_replica.append({r["step"]: r["positions"] for r in read_jsonl(run / "logs" / f"samples-dp{d}.jsonl")})
    order = []
    for step in sorted(per_replica[0]):
        parts = [per_replica[d][step] for d in range(RANKS)]
        for start in range(0, len(parts[0]), MBS):
            for part in parts:
                order.extend(part[start:start + MBS])
    return order


def test_rollback_skips_exactly_cuts_the_lr_and_is_applied_once(base, tmp_path):
    run = copy_of(base, tmp_path / "run")
    paths = RunPaths.of(run)
    directive = Rollback(id="rb-test-1", to_step=3, skip_samples=SKIPS, lr_scale=0.5, lr_scale_steps=3,
                         reason="test", requested_by="tests", requested_at=1.0)
    write_rollback(paths, directive)
    # A: back to step 2 (the newest <= 3, not `latest` = 6), 2 steps, save step 4, stop.
    log_a = run_trainer(run, {"TRAINER_STOP_AFTER_STEPS": "2", "TRAINER_SAMPLE_LOG": "1"})
    assert "rollback rb-test-1 applied: resumed from step 2" in log_a and "resumed from step_0000002" in log_a
    # B: the directive still in place: resume from the new step 4, no second rollback.
    log_b = run_trainer(run, {"TRAINER_STOP_AFTER_STEPS": "2", "TRAINER_SAMPLE_LOG": "1"})
    assert "resumed from step_0000004" in log_b and "rb-test-1" not in log_b
    # C: the directive withdrawn: the skip list comes from the checkpoint (range 2 is still ahead).
    paths.accepted_request("rollback").unlink()
    log_c = run_trainer(run, {"TRAINER_MAX_STEPS": "10", "TRAINER_SAMPLE_LOG": "1"})
    assert "resumed from step_0000006" in log_c

    # The oracle: the index order (positions 0, 1, 2, ...) minus the ranges, in order.
    skipped = {p for start, end in SKIPS for p in range(start, end)}
    kept = [p for p in range(200) if p not in skipped]
    history = final_history(run)
    assert history == kept[:10 * GBS], history
    assert not skipped & set(history)
    after = metrics(run)
    assert [after[s]["consumed_samples"] for s in range(1, 11)] == [kept[n * GBS - 1] + 1 for n in range(1, 11)]
    # LR: x0.5 for steps 3-5 (after checkpoint 2), then the schedule, which skipped data never advances:
    # the base run's LR at the same applied samples.
    before = metrics(base)
    assert [after[s]["lr"] for s in (3, 4, 5, 6)] == [0.5 * before[s]["lr"] for s in (3, 4, 5)] + [before[6]["lr"]]
    state = read_checkpoint_state(paths.checkpoint(10))
    assert state.applied_directives == ("rb-test-1",) and [list(r) for r in state.skip_samples] == SKIPS
    assert (state.lr_scale, state.lr_scale_last_step, state.consumed_samples) == (0.5, 5, 102)

