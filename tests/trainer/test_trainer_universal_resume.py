"""`python -m trainer` moves a run to another layout through its universal checkpoint
(`python -m trainer.universal`) without losing any optimizer state, and trains on as before.

Source (tp, pp, dp) = (1, 2, 2): two pipeline stages, ZeRO-1 over 2 DP ranks. Target (2, 1, 2):
TP slices instead of stages, other ZeRO partitions. bf16 (BF16_Optimizer), the real run's dtype.
1. The source trains 14 steps in one go, saving step 4 (after the 2 warmup steps) on the way.
   A copy of its run directory as the job that saved step 4 left it ("moved") gets the target layout:
   the trainer refuses it (CONFIG_ERROR, with the command to run) until it is converted.
2. State: a probe (tests/trainer/optimizer_state_probe.py) builds and resumes the trainer as
   `python -m trainer` does, at the source layout from step 4 and at the target layout from
   step_4_universal, and gathers the fp32 master weights and both Adam moments by parameter name.
   They must be bit-identical, the Adam step count and the trainer's counters equal.
   Negative control: the same with both moments zeroed in the converted files (manifest rewritten,
   so it still loads) must fail that comparison.
3. The moved run trains steps 5-14 (10 steps after warmup) at the target layout; every loss and
   gradient norm must match the uninterrupted source run within the bf16 layout tolerance
   (tests/parallel/trainer_layouts.py: another layout rounds some bf16 values differently).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from orchestrator.contract import ExitCode, RunPaths, read_jsonl
from tests.parallel.trainer_layouts import compare_records, series
from tests.trainer import launch_local
from tests.trainer.runs import REPO_ROOT, make_run_dir

pytest.importorskip("deepspeed")

SAVE_AT, STEPS = 4, 14
COMMON = {"model": {"dtype": "bf16"}, "cluster": {"gpus_per_node": 4},
          "optimizer": {"lr": 1e-2, "min_lr": 1e-3, "warmup_samples": 16},
          "parallel": {"micro_batch_size": 2, "global_batch_size": 8},
          "checkpoint": {"interval_steps": SAVE_AT, "keep_last": 10}}
SOURCE = {"parallel": {"tp": 1, "pp": 2, "dp": 2}}
TARGET = {"parallel": {"tp": 2, "pp": 1, "dp": 2}}


def _config(layout: dict) -> dict:
    return {**COMMON, "parallel": {**COMMON["parallel"], **layout["parallel"]}}


def _as_left_at_save(original, dest):
    """A copy of `original` as the job that saved step SAVE_AT and then died left it."""
    shutil.copytree(original, dest)
    paths = RunPaths.of(dest)
    for later in paths.checkpoints.glob("step_*"):
        if later.name != f"step_{SAVE_AT:07d}":
            shutil.rmtree(later)
    paths.latest.write_text(f"step_{SAVE_AT:07d}\n")
    paths.metrics.unlink()
    shutil.rmtree(dest / "logs")
    return dest


def _start_probe(run_dir, nranks: int, out):
    port = launch_local.free_port()
    procs = []
    for rank in range(nranks):
        log = open(run_dir / f"probe-rank-{rank}.log", "wb")  # noqa: SIM115 (closed by launch_local.wait)
        proc = subprocess.Popen([sys.executable, "-m", "tests.trainer.optimizer_state_probe", str(run_dir), str(out)],
                                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=launch_local.rank_env(rank, nranks, port, "probe"))
        proc.log_file = log
        procs.append(proc)
    return procs


def _probe_log(run_dir) -> str:
    return (run_dir / "probe-rank-0.log").read_text(errors="replace")[-3000:]


def _zero_moments(universal_dir) -> int:
    import torch

    from trainer.checkpoint import hash_files_shared, list_files, write_manifest

    files = sorted(universal_dir.glob("zero/*/exp_avg*.pt"))
    for path in files:
        state = torch.load(path, weights_only=False)
        state["param"] = torch.zeros_like(state["param"])
        torch.save(state, path)
    write_manifest(universal_dir, hash_files_shared(universal_dir, list_files(universal_dir)), {"universal_from": "zeroed"})
    return len(files)


def compare_states(source: dict, moved: dict) -> None:
    """Bit-exact, by parameter name: fp32 master, exp_avg, exp_avg_sq; Adam step; trainer counters."""
    import torch

    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        assert source[key].keys() == moved[key].keys(), f"{key}: names differ {set(source[key]) ^ set(moved[key])}"
        differ = [n for n in source[key] if not torch.equal(source[key][n], moved[key][n])]
        worst = max((source[key][n] - moved[key][n]).abs().max().item() for n in source[key])
        print(f"{key}: {len(source[key])} parameters, {sum(t.numel() for t in source[key].values())} values, "
              f"max abs difference {worst:.3e}")
        assert not differ, f"{key} differs after the layout change for {differ[:5]} (max abs {worst:.3e})"
    assert source["adam_step"] == moved["adam_step"] == [float(SAVE_AT)], (source["adam_step"], moved["adam_step"])
    assert source["train_state"] == moved["train_state"] and source["train_state"]["step"] == SAVE_AT
    assert source["global_steps"] == moved["global_steps"] == SAVE_AT


@pytest.mark.slow  # ~2.5 min on 2 cores
def test_universal_checkpoint_keeps_optimizer_state_and_training(tmp_path):
    import torch

    original = make_run_dir(tmp_path / "original", **_config(SOURCE))
    assert launch_local.run(original, 4, {"TRAINER_MAX_STEPS": str(STEPS)}, timeout=400) == [ExitCode.FINISHED] * 4, \
        launch_local.read_log(original)
    source = _as_left_at_save(original, tmp_path / "source")
    refused = make_run_dir(_as_left_at_save(original, tmp_path / "refused"), **_config(TARGET))
    moved = make_run_dir(_as_left_at_save(original, tmp_path / "moved"), **_config(TARGET))

    # The refusal, the conversion and the source-layout probe, side by side.
    probe_source = _start_probe(source, 4, tmp_path / "source.pt")
    refusal = launch_local.start(refused, 4, {"TRAINER_MAX_STEPS": str(STEPS)})
    convert = subprocess.run([sys.executable, "-m", "trainer.universal", str(moved), "--step", str(SAVE_AT)],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert convert.returncode == 0, convert.stdout + convert.stderr
    assert launch_local.wait(probe_source, 300) == [0] * 4, _probe_log(source)
    assert launch_local.wait(refusal, 300) == [ExitCode.CONFIG_ERROR] * 4, launch_local.read_log(refused)
    log = launch_local.read_log(refused)
    assert "was saved at dp=2 pp=2 tp=1 but this job runs dp=2 pp=1 tp=2" in log, log[-2000:]
    assert f"python -m trainer.universal {refused} --step {SAVE_AT}" in log

    universal = RunPaths.of(moved).checkpoints / f"step_{SAVE_AT:07d}_universal"
    zeroed = tmp_path / "zeroed"
    shutil.copytree(moved, zeroed)
    assert _zero_moments(RunPaths.of(zeroed).checkpoints / universal.name) > 0
    probe_moved = _start_probe(shutil.copytree(moved, tmp_path / "moved-probe"), 4, tmp_path / "moved.pt")
    probe_zeroed = _start_probe(zeroed, 4, tmp_path / "zeroed.pt")
    train_on = launch_local.start(moved, 4, {"TRAINER_MAX_STEPS": str(STEPS)})
    assert launch_local.wait(probe_moved, 300) == [0] * 4, _probe_log(tmp_path / "moved-probe")
    assert launch_local.wait(probe_zeroed, 300) == [0] * 4, _probe_log(zeroed)
    assert launch_local.wait(train_on, 400) == [ExitCode.FINISHED] * 4, launch_local.read_log(moved)
    assert f"resumed from {universal.name}: step {SAVE_AT}" in launch_local.read_log(moved)
    assert f"resumed from {universal.name}: step {SAVE_AT}" in _probe_log(tmp_path / "moved-probe")

    states = {name: torch.load(tmp_path / f"{name}.pt", weights_only=False) for name in ("source", "moved", "zeroed")}
    compare_states(states["source"], states["moved"])
    with pytest.raises(AssertionError, match="exp_avg differs after the layout change") as control:
        compare_states(states["source"], states["zeroed"])
    print(f"negative control (moments zeroed in the converted checkpoint): {str(control.value).splitlines()[0]}")

    want = [r for r in read_jsonl(RunPaths.of(original).metrics) if r["step"] > SAVE_AT]
    got = read_jsonl(RunPaths.of(moved).metrics)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(SAVE_AT + 1, STEPS + 1))
    assert want[0]["lr"] == got[0]["lr"] and want[0]["lr"] > 0.9 * COMMON["optimizer"]["lr"]  # past warmup
    compare_records(got, series(want), "bf16", f"steps {SAVE_AT + 1}-{STEPS} at (tp,pp,dp)=(2,1,2) after the "
                                               "universal resume vs the uninterrupted (1,2,2) run")


def test_convert_refuses_what_it_cannot_convert(tmp_path, capsys):
    from trainer.universal import main

    assert main([str(tmp_path), "--step", "7"]) == 2
    assert "no checkpoint directory" in capsys.readouterr().err
    fp32_like = tmp_path / "checkpoints" / "step_0000003"
    fp32_like.mkdir(parents=True)
    (fp32_like / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert main([str(tmp_path), "--step", "3"]) == 2
    err = capsys.readouterr().err
    print(err)
    assert "no ZeRO optimizer files" in err and "bf16 + ZeRO-1" in err
