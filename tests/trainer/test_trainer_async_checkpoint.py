"""Asynchronous checkpoints (`checkpoint.async_save`), end to end as real ranks (gloo on CPU).

- SIGKILL of a rank while its background writer is half way leaves `latest` on the previous
  checkpoint and no MANIFEST in the partial one;
- the files an async save writes are the files a sync save writes (every tensor and value equal),
  and a new job resumes from the async checkpoint and continues exactly like the sync run;
- a kill switch while a write is in flight: the trainer waits for it, then exits 17.
Independent runs are started together (each process pays ~8 s of imports).
"""

from __future__ import annotations

import time

from orchestrator.contract import (
    KILL_REQUEST,
    MANIFEST_NAME,
    ExitCode,
    RunPaths,
    atomic_write_json,
    read_jsonl,
    read_latest,
)
from tests.trainer import launch_local
from tests.trainer.checkpoint_compare import compare_checkpoints
from tests.trainer.runs import make_run_dir
from trainer import checkpoint as ckpt

TWO_RANKS = {"cluster": {"gpus_per_node": 2}}  # dp=2: each rank writes its own ZeRO partition
EVERY_2 = {"interval_steps": 2, "keep_last": 3}


def test_kill_during_async_write_loses_nothing_and_async_equals_sync(tmp_path):
    sync = make_run_dir(tmp_path / "sync", **TWO_RANKS, checkpoint=EVERY_2)
    asyn = make_run_dir(tmp_path / "async", **TWO_RANKS, checkpoint={**EVERY_2, "async_save": True})
    s = launch_local.start(sync, 2, {"TRAINER_MAX_STEPS": "6"})
    # rank 1 is SIGKILLed once its writer put the first file of step 4's save on disk
    a = launch_local.start(asyn, 2, {"TRAINER_MAX_STEPS": "6", "TRAINER_FAULT": "killwrite@step4:rank1"})
    codes = launch_local.wait(s + a, 240)
    assert codes[:2] == [ExitCode.FINISHED] * 2, launch_local.read_log(sync)
    assert codes[3] == -9 and codes[2] != ExitCode.FINISHED, (codes, launch_local.read_log(asyn))
    assert "TEST FAULT killwrite" in launch_local.read_log(asyn, 1)

    sync_paths, async_paths = RunPaths.of(sync), RunPaths.of(asyn)
    assert read_latest(async_paths.checkpoints) == "step_0000002"
    partial = async_paths.checkpoint(4)
    assert partial.is_dir() and not (partial / MANIFEST_NAME).exists()
    assert ckpt.verify_manifest(async_paths.checkpoint(2)) == []
    # what the background writers wrote is what a sync save writes: every tensor and value
    counts = compare_checkpoints(sync_paths.checkpoint(2), async_paths.checkpoint(2))
    assert counts["tensors"] > 10 and counts["rng_files"] == 2, counts

    # a NEW job resumes from `latest` (the async step 2) and ends exactly where the sync run did
    assert launch_local.run(asyn, 2, {"TRAINER_MAX_STEPS": "6"}, timeout=240) == [ExitCode.FINISHED] * 2
    assert "resumed from step_0000002" in launch_local.read_log(asyn)
    assert read_latest(async_paths.checkpoints) == "step_0000006"
    for step in (4, 6):
        compare_checkpoints(sync_paths.checkpoint(step), async_paths.checkpoint(step))


def test_kill_switch_waits_for_the_write_in_flight(tmp_path):
    run = make_run_dir(tmp_path / "run", checkpoint={"async_save": True})
    # every write sleeps before its first file: exiting without waiting would leave no MANIFEST
    procs = launch_local.start(run, 1, {"TRAINER_STEP_DELAY_SECONDS": "0.2", "TRAINER_FAULT": "slowwrite@step1"})
    paths = RunPaths.of(run)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_jsonl(paths.metrics)) < 2:
        time.sleep(0.1)
    atomic_write_json(paths.accepted_request(KILL_REQUEST), {"user": "alice", "reason": "test"})
    assert launch_local.wait(procs, 120) == [ExitCode.KILLED], launch_local.read_log(run)
    last_step = read_jsonl(paths.metrics)[-1]["step"]
    assert read_latest(paths.checkpoints) == f"step_{last_step:07d}"
    assert ckpt.verify_manifest(paths.checkpoint(last_step)) == []
    assert "waiting for the background write" in launch_local.read_log(run)
