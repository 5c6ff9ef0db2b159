"""Exact resume with random state in play: dropout 0.1 (hidden and attention), dp = 2, bf16 with
ZeRO-1 (BF16_Optimizer: each DP rank holds half the fp32 master and Adam moments), at
(tp, pp, dp) = (2, 2, 2) (TP slices, two pipeline stages, 8 ranks).

One go: `python -m trainer` for 2N steps. Split: N steps, checkpoint, exit (time budget), a NEW pair
of processes, N more steps. Every step's loss, LR and gradient norm must be identical, and the two
step-2N checkpoints identical in every value of every file: both ranks' ZeRO partitions, the model
and engine state, the client state, and each rank's RNG state file (tests/trainer/checkpoint_compare).
With dropout on, a resume that did not restore each rank's RNG state draws other masks from step
N + 1 on, and the losses part.
"""

from __future__ import annotations

import pytest

from orchestrator.contract import ExitCode, RunPaths, read_jsonl, read_latest
from tests.trainer import launch_local
from tests.trainer.checkpoint_compare import compare_checkpoints
from tests.trainer.runs import make_run_dir

pytest.importorskip("deepspeed")

N = 3


def _config(tp: int, pp: int, dp: int) -> dict:
    return {
        "cluster": {"gpus_per_node": tp * pp * dp},
        "model": {"dtype": "bf16", "hidden_dropout": 0.1, "attention_dropout": 0.1},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": 2, "global_batch_size": 8, "zero_stage": 1},
        "optimizer": {"lr": 3e-2, "min_lr": 3e-3, "warmup_samples": 8},
        "checkpoint": {"interval_steps": N, "keep_last": 5},
    }


# (2,2,2) holds what (1,1,2) checked (dp=2, ZeRO-1 partitions, per-rank RNG files) plus TP slices
# and two pipeline stages: (1,1,2) alone was dropped to keep `make test` under 25 min (~2 min here).
@pytest.mark.slow
@pytest.mark.parametrize("layout", [(2, 2, 2)], ids=lambda t: "tp{}-pp{}-dp{}".format(*t))
def test_split_run_with_dropout_dp2_zero1_equals_one_go(tmp_path, layout):
    ranks = layout[0] * layout[1] * layout[2]
    one_go = make_run_dir(tmp_path / "one_go", **_config(*layout))
    split = make_run_dir(tmp_path / "split", **_config(*layout))
    a = launch_local.start(one_go, ranks, {"TRAINER_MAX_STEPS": str(2 * N)})
    b = launch_local.start(split, ranks, {"TRAINER_STOP_AFTER_STEPS": str(N)})
    codes = launch_local.wait(a + b, 400)
    assert codes == [ExitCode.FINISHED] * ranks + [ExitCode.TIME_BUDGET] * ranks, launch_local.read_log(split)
    assert launch_local.run(split, ranks, {"TRAINER_MAX_STEPS": str(2 * N)}, timeout=400) == \
        [ExitCode.FINISHED] * ranks, launch_local.read_log(split)
    log = launch_local.read_log(split)
    assert f"resumed from step_{N:07d}" in log and "optimizer BF16_Optimizer" in log
    assert "tp={} pp={} dp={}".format(*layout) in log

    full = {r["step"]: r for r in read_jsonl(RunPaths.of(one_go).metrics)}
    resumed = {r["step"]: r for r in read_jsonl(RunPaths.of(split).metrics)}  # the last record of each step
    assert sorted(full) == sorted(resumed) == list(range(1, 2 * N + 1))
    for step in full:
        for key in ("loss", "lr", "grad_norm", "consumed_samples"):
            assert full[step][key] == resumed[step][key], (step, key, full[step][key], resumed[step][key])
    print("losses:", [full[s]["loss"] for s in sorted(full)])

    paths_a, paths_b = RunPaths.of(one_go), RunPaths.of(split)
    assert read_latest(paths_a.checkpoints) == read_latest(paths_b.checkpoints) == f"step_{2 * N:07d}"
    counts = compare_checkpoints(paths_a.checkpoint(2 * N), paths_b.checkpoint(2 * N))
    assert counts["rng_files"] == ranks, counts  # one per rank
    zero_files = sorted(p.name for p in paths_b.checkpoint(2 * N).glob("*optim_states.pt"))
    assert len(zero_files) == ranks, zero_files  # ZeRO-1: one fp32 partition (+ moments) per rank
