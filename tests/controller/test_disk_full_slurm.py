"""A full disk that heals, on the real local SLURM cluster with the real trainer.

The checkpoint folder is a small tmpfs of its own. After the step-4 checkpoint, the filesystem is
sized to hold 1.3 checkpoints more, and another writer fills it to half a checkpoint: the
step-8 save hits ENOSPC half way and the job fails. The controller pauses the run with the
filesystem named, restarts nothing and blames no node. The other writer's file goes: still not
room for a checkpoint, still paused. The unfinished step-8 save is removed: the run resumes from
step 4 by itself and finishes, with no runctl command.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from fakes import REPO
from test_e2e_slurm import STEPS, drive, e2e_config, job_outputs

from orchestrator.cli.main import main as runctl
from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.exclude import excluded_nodes
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from tests.fixtures_disk import fill, resize
from tests.run_records import event_dicts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PAGE = 4096


def test_disk_that_fills_during_a_save_pauses_then_the_run_finishes_by_itself(
    local_cluster, small_filesystem, capsys
):
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    root = Path(tempfile.mkdtemp(prefix="rc-disk-", dir="/tmp"))
    os.chmod(root, 0o755)
    mount = small_filesystem(root / "ckpt", 64 << 20)
    cfg = e2e_config(checkpoint={"dir": str(mount), "keep_last": 1})
    run = root / "run"
    prepare_run_dir(cfg, run)
    os.chmod(run, 0o755)
    env = {**local_cluster.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}  # fmt: skip
    ctl = Controller(run, cfg, SlurmScheduler(env=env))
    paths = RunPaths.of(run)
    submit_job(run, cfg, ctl.scheduler, reason="initial")
    ctl.start()
    try:
        t0 = time.monotonic()
        squeezed: dict[str, object] = {}

        def squeeze_after_step_4(c: Controller) -> None:
            if squeezed or not (mount / "step_0000004" / "MANIFEST.json").exists() or not (mount / "latest").exists():
                return
            used = shutil.disk_usage(mount).used  # the step-4 checkpoint, as the filesystem counts it
            resize(mount, math.ceil(used * 2.3 / PAGE) * PAGE)  # room for 1.3 checkpoints more
            squeezed["filler"] = fill(mount, leave_bytes=used // 2)  # another writer: half a checkpoint left
            squeezed["checkpoint"] = used
            print(f"step-4 checkpoint takes {used} bytes; {shutil.disk_usage(mount).free} left for the step-8 save")

        status = drive(ctl, 200, act=squeeze_after_step_4, until=lambda c: c.state.status == RunStatus.DISK_FULL)
        paused_at = time.monotonic()
        assert status == RunStatus.DISK_FULL, job_outputs(paths)
        events = event_dicts(paths)
        (paused,) = [e for e in events if e["event"] == "disk_full_paused"]
        print(f"paused {paused_at - t0:.1f} s into the run: {paused}")
        assert paused["mount"] == str(mount) and paused["free_bytes"] < paused["needed_bytes"]
        assert any(item["path"] == str(mount / "step_0000008") for item in paused["to_delete"])
        assert not [e for e in events if e["event"] in ("restart", "nodes_excluded")], "\n".join(map(str, events))
        assert excluded_nodes(paths) == [] and ctl.state.restarts_without_progress == 0

        capsys.readouterr()
        assert runctl(["status", str(run), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        print(shown["warnings"])
        assert shown["dashboard"]["status"] == "disk_full" and str(mount) in " ".join(shown["warnings"])

        squeezed["filler"].unlink()  # the other writer's file is gone: still less than a checkpoint free
        for _ in range(4):
            ctl.tick()
            time.sleep(cfg.watchdog.poll_seconds)
        assert ctl.state.status == RunStatus.DISK_FULL, "0.8 checkpoints free is not room for one"

        shutil.rmtree(mount / "step_0000008")  # what the pause said to delete
        assert drive(ctl, 200) == RunStatus.FINISHED, job_outputs(paths)
        print(f"resumed and finished {time.monotonic() - paused_at:.1f} s after the pause")
        events = event_dicts(paths)
        (resumed,) = [e for e in events if e["event"] == "disk_full_resumed"]
        assert resumed["how"] == "submitted a job"
        trained = [m["step"] for m in read_jsonl(paths.metrics) if m.get("loss") is not None]
        assert sorted(set(trained)) == list(range(1, STEPS + 1))
        assert [trained.count(s) for s in (4, 5)] == [1, 2], f"resumed from step 4: {trained}"
        assert not [e for e in events if e["event"] == "restart"]
    finally:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
        time.sleep(1)  # the cancelled ranks let go of the filesystem before it is unmounted
        shutil.rmtree(run, ignore_errors=True)
