"""`python -m trainer RUN_DIR` end to end, as real subprocesses with SLURM-like variables.

Each test starts a handful of tiny runs (2 layers, h=32, seq 32) on the shipped corpus; every
process pays ~8 s of imports and DeepSpeed setup, so independent runs are started together.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from orchestrator.contract import (
    KILL_REQUEST,
    ExitCode,
    Heartbeat,
    OperatorRequest,
    RunPaths,
    atomic_write_json,
    complete_checkpoints,
    read_heartbeats,
    read_jsonl,
    read_latest,
)
from orchestrator.contract.manifest import read_damage_reports
from orchestrator.contract.requests import publish_request
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir
from trainer import checkpoint as ckpt

RAMPUP = {"parallel": {"micro_batch_size": 2, "global_batch_size": 6,
                       "rampup": {"start": 2, "increment": 2, "samples": 24}},
          "data": {"eval_interval": 4, "eval_iters": 1}}


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """The LAST record of each step (a resumed run may redo steps)."""
    return {r["step"]: r for r in read_jsonl(RunPaths.of(run_dir).metrics)}


def all_tensors(obj, prefix=""):
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from all_tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from all_tensors(v, f"{prefix}[{i}]")


def checkpoint_tensors(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    """Model weights (bf16) and optimizer state (fp32 master + Adam moments) of a checkpoint."""
    out = {}
    for f in sorted(ckpt_dir.glob("*.pt")):
        if f.name.startswith("mp_rank"):
            continue  # engine bookkeeping (paths, timers); the weights are in the layer files
        for name, t in all_tensors(torch.load(f, map_location="cpu", weights_only=False)):
            out[f.name + name] = t
    return out


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel())
    print(f"{len(a)} tensors compared, max abs difference {worst}")
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:5]


def test_exact_resume_latest_keep_last_and_damaged_newest(tmp_path):
    one_go = make_run_dir(tmp_path / "one_go", **RAMPUP)
    split = make_run_dir(tmp_path / "split", **RAMPUP, checkpoint={"interval_steps": 2, "keep_last": 2})
    a = launch_local.start(one_go, 1, {"TRAINER_MAX_STEPS": "12"})
    b1 = launch_local.start(split, 1, {"TRAINER_STOP_AFTER_STEPS": "6"})
    assert launch_local.wait(a + b1, 240) == [ExitCode.FINISHED, ExitCode.TIME_BUDGET], launch_local.read_log(split)
    paths = RunPaths.of(split)
    assert read_latest(paths.checkpoints) == "step_0000006"
    assert [d.name for _, d in complete_checkpoints(paths.checkpoints)] == ["step_0000004", "step_0000006"]

    # N/2 + checkpoint + a NEW process + N/2
    assert launch_local.run(split, 1, {"TRAINER_MAX_STEPS": "12"}, timeout=240) == [ExitCode.FINISHED]
    full, resumed = metrics_by_step(one_go), metrics_by_step(split)
    assert sorted(full) == sorted(resumed) == list(range(1, 13))
    assert [full[s]["global_batch"] for s in range(1, 13)][:4] == [2, 2, 2, 2]  # the rampup crosses the restart
    assert full[12]["global_batch"] == 6 and full[12]["consumed_samples"] == resumed[12]["consumed_samples"]
    for s in range(1, 13):
        assert full[s]["loss"] == resumed[s]["loss"], (s, full[s]["loss"], resumed[s]["loss"])
        assert full[s]["lr"] == resumed[s]["lr"] and full[s]["grad_norm"] == resumed[s]["grad_norm"]
        assert full[s].get("eval_loss") == resumed[s].get("eval_loss")  # evaluation at steps 4, 8, 12
    print("losses:", [round(full[s]["loss"], 4) for s in range(1, 13)], "eval:", [full[s]["eval_loss"] for s in (4, 8, 12)])
    assert_bit_identical(checkpoint_tensors(RunPaths.of(one_go).checkpoint(12)), checkpoint_tensors(paths.checkpoint(12)))
    assert "resumed from step_0000006" in launch_local.read_log(split)

    # The newest checkpoint damaged: resume from the previous one, report it, never delete it.
    newest = paths.checkpoint(12)
    blob = sorted(newest.glob("layer_01-*.pt"))[0]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    assert launch_local.run(split, 1, {"TRAINER_MAX_STEPS": "12"}, timeout=240) == [ExitCode.FINISHED]
    log = launch_local.read_log(split)
    assert "SKIPPING damaged checkpoint step_0000012" in log and "resumed from step_0000010" in log
    damaged = read_damage_reports(paths.checkpoints)
    assert damaged[-1].checkpoint == "step_0000012" and "sha256" in damaged[-1].problems[0]
    assert list(paths.checkpoints.glob(".replaced-step_0000012-*")), "the damaged checkpoint must be kept"
    again = metrics_by_step(split)
    assert again[11]["loss"] == full[11]["loss"] and again[12]["loss"] == full[12]["loss"]
    assert_bit_identical(checkpoint_tensors(RunPaths.of(one_go).checkpoint(12)), checkpoint_tensors(paths.checkpoint(12)))


def test_loss_falls_and_nan_step_is_skipped_and_logged(tmp_path):
    run = make_run_dir(tmp_path / "run", optimizer={"lr": 5e-3, "min_lr": 5e-4, "warmup_samples": 16},
                       parallel={"micro_batch_size": 4, "global_batch_size": 8},
                       data={"train_samples": 480, "eval_interval": 20, "eval_iters": 2})
    codes = launch_local.run(run, 1, {"TRAINER_FAULT": "nan@step5", "TRAINER_TENSORBOARD": "1"}, timeout=300)
    log = launch_local.read_log(run)
    assert codes == [ExitCode.FINISHED], log
    assert "optimizer BF16_Optimizer" in log
    m = metrics_by_step(run)
    assert len(m) == 60
    assert m[5]["skipped"] and m[5]["grad_norm"] is None and m[5]["skipped_total"] == 1
    assert not any(m[s]["skipped"] for s in m if s != 5)
    assert m[6]["lr"] == m[5]["lr"], "a skipped step must not advance the LR"
    assert "step 5: non-finite gradient norm, step SKIPPED" in log
    first = sum(m[s]["loss"] for s in range(1, 5)) / 4
    last = sum(m[s]["loss"] for s in range(51, 61)) / 10
    print(f"loss: first steps {first:.3f} -> last steps {last:.3f}; tokens/s {m[60]['tokens_per_s']:.0f}")
    assert last < first - 0.5
    assert all(m[s]["tflops_per_gpu"] > 0 and m[s]["tokens_per_s"] > 0 for s in m)
    assert list((Path(run) / "tensorboard").glob("events.out.tfevents.*"))
    evals = [m[s]["eval_loss"] for s in (20, 40, 60)]
    print("eval losses at steps 20, 40, 60:", evals)
    assert all("eval_loss" not in m[s] for s in m if s % 20)
    assert evals[2] < evals[0]


def test_kill_switch_and_time_budget_save_and_exit(tmp_path):
    # interval_hours = 0.0003 (~1.1 s): time-based checkpoints (rank 0's clock) happen before the kill.
    killed = make_run_dir(tmp_path / "killed", checkpoint={"interval_hours": 0.0003})
    # The budget run is also the fp32 path (no BF16_Optimizer: our own non-finite guard skips step 1).
    budget = make_run_dir(tmp_path / "budget", checkpoint={"exit_duration_minutes": 30}, model={"dtype": "fp32"})
    k = launch_local.start(killed, 1, {"TRAINER_STEP_DELAY_SECONDS": "0.3"})
    b = launch_local.start(budget, 1, {"TRAINER_JOB_START_TIME": str(time.time() - 3600), "TRAINER_FAULT": "nan@step1"})
    deadline = time.time() + 180
    while time.time() < deadline and len(read_jsonl(RunPaths.of(killed).metrics)) < 6:
        time.sleep(0.2)
    publish_request(RunPaths.of(killed), OperatorRequest(KILL_REQUEST, "alice", 1001, "test", False, time.time()))
    assert launch_local.wait(k + b, 240) == [ExitCode.KILLED, ExitCode.TIME_BUDGET]
    for run, reason in ((killed, "kill switch (by alice: test)"), (budget, "exit_duration_minutes=30.0")):
        paths = RunPaths.of(run)
        last_step = read_jsonl(paths.metrics)[-1]["step"]
        assert read_latest(paths.checkpoints) == f"step_{last_step:07d}"
        assert ckpt.verify_manifest(paths.checkpoint(last_step)) == []
        assert reason in launch_local.read_log(run)
    budget_metrics = read_jsonl(RunPaths.of(budget).metrics)
    assert [(r["step"], r["skipped"]) for r in budget_metrics] == [(1, True)]
    assert "optimizer AdamW" in launch_local.read_log(budget)  # fp32: no BF16_Optimizer
    assert "(time interval)" in launch_local.read_log(killed)
    beat = Heartbeat.from_dict(json.loads(RunPaths.of(killed).heartbeat(0).read_text()))
    assert beat.phase == "exiting" and beat.job_id == "local-test"
    assert beat.exit_code == ExitCode.KILLED and beat.exit_reason == "killed"


def test_two_ranks_agree_when_only_rank1_gets_sigusr1(tmp_path):
    run = make_run_dir(tmp_path / "run", cluster={"gpus_per_node": 2})
    codes = launch_local.run(run, 2, {"TRAINER_FAULT": "sigusr1@step3:rank1"}, timeout=240)
    assert codes == [ExitCode.TIME_BUDGET, ExitCode.TIME_BUDGET], launch_local.read_log(run, 1)
    paths = RunPaths.of(run)
    assert read_latest(paths.checkpoints) == "step_0000003"
    assert ckpt.verify_manifest(paths.checkpoint(3)) == []
    assert {p.name for p in (paths.checkpoint(3) / "rng").iterdir()} == {"rank-00000.pt", "rank-00001.pt"}
    assert "pre-timeout signal SIGUSR1" in launch_local.read_log(run, 1)
    assert "stopping at step 3" in launch_local.read_log(run, 0)
    assert "dp=2" in launch_local.read_log(run, 0)


def test_hung_loop_beats_without_progress_and_dumps_stacks(tmp_path):
    run = make_run_dir(tmp_path / "run", watchdog={"heartbeat_seconds": 0.2})
    paths = RunPaths.of(run)
    procs = launch_local.start(run, 1, {"TRAINER_FAULT": "hang@step3"})
    try:
        deadline = time.time() + 180
        beat = None
        while time.time() < deadline:
            beat = next(iter(read_heartbeats(paths.heartbeats)), None)
            if beat is not None and beat.step == 2:
                break
            time.sleep(0.1)
        assert beat is not None and beat.step == 2 and beat.phase == "step", beat
        time.sleep(0.5)  # the marks right after a step's progress (the agreement's wait) are done
        beat = read_heartbeats(paths.heartbeats)[0]
        time.sleep(1.5)
        later = read_heartbeats(paths.heartbeats)[0]
        print(f"beat +{later.beat_time - beat.beat_time:.2f}s, progress +"
              f"{later.progress_time - beat.progress_time:.2f}s")
        assert later.beat_time - beat.beat_time > 1.0
        assert later.progress_time == beat.progress_time and later.step == 2
        assert later.progress_count == beat.progress_count > 0
        atomic_write_json(paths.accepted_request("dump-stacks"), {"user": "controller"})
        stacks = paths.stacks / "rank-00000.txt"
        while time.time() < deadline and not stacks.exists():
            time.sleep(0.1)
        assert "before_step" in stacks.read_text()  # trainer.faults: the hang fault
    finally:
        for proc in procs:
            proc.kill()
        try:
            launch_local.wait(procs, 10)
        except TimeoutError:
            pass
