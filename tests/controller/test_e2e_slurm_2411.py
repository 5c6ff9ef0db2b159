"""The controller on the second real cluster, Debian 13's Slurm 24.11, with the real trainer.

One run covers what 24.11 changes for us, the demo's drill with SLURM read as a site of 2026 runs
it: 2 nodes + 1 spare, a rank SIGKILLed once the warm standby is ready; the controller must see
the job through 24.11's `squeue --json` (job_state a list, exit code and times as objects),
detect the failure from srun's report, and relaunch on the spare inside the same job, from the
warm standby, with no new submission. The saves are async with node-local copies: the surviving
node loads its own copy, the spare fetches the killed node's files from its buddy, and the
relaunch reads 0 bytes of the shared checkpoint. The losses equal the uninterrupted run's on 22.05
(`reference_losses`). After the run, the ended job is read again the way a restarted controller
reads it (`--states=all`). This replaces the same drill on 22.05.

Which tests run on which release: every other `slurm` test runs on the host's 22.05; this drill
runs on 24.11 only (the other e2e tests share its reading code and launcher; running them all twice
would cost ~6 minutes of the 25-minute budget; see docs/slurm.md). The trainer runs inside the cluster's namespaces with
the host's Python (bound in), so the pids in its heartbeats are that namespace's.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from fakes import REPO
from test_e2e_slurm import (
    STEPS,
    assert_same_losses,
    drive,
    e2e_config,
    inject_once,
    job_outputs,
    print_incident,
    standby_warm,
)  # fmt: skip

from orchestrator.contract import JobState, read_allocation, read_heartbeats
from orchestrator.contract.exclude import excluded_nodes
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from tests.run_records import event_dicts

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_24_11_killed_rank_detected_and_trained_again_on_the_spare(local_cluster_2411, reference_losses):
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.hostlist import expand_hostlist
    from orchestrator.slurm.real import SlurmScheduler

    root = Path(tempfile.mkdtemp(prefix="rc-e2e-2411-", dir="/tmp"))
    cfg = e2e_config(spare_nodes=1, checkpoint={"async_save": True, "local_dir": str(root / "node-local")})
    os.chmod(root, 0o755)
    run = root / "run"
    prepare_run_dir(cfg, run)
    env = {**local_cluster_2411.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
           "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TRAINER_STEP_DELAY_SECONDS": "3"}  # fmt: skip
    scheduler = SlurmScheduler(env=env)
    assert scheduler.slurm_release() == (24, 11), "the fixture must bring up Debian 13's 24.11"
    ctl = Controller(run, cfg, scheduler, stack_wait_seconds=4.0)
    try:
        job_id = submit_job(run, cfg, scheduler, reason="initial")
        ctl.start()
        act, done = inject_once(
            5, 2, signal.SIGKILL, when=standby_warm(job_id), kill=local_cluster_2411.signal_in_cluster
        )
        t0 = time.monotonic()
        assert drive(ctl, 240, act=act) == RunStatus.FINISHED, job_outputs(ctl.paths)
        print(f"24.11 drill: {time.monotonic() - t0:.1f} s from start to finished")
        assert done, "the fault was never injected"
        failure = print_incident(ctl.paths)
        events = event_dicts(ctl.paths)
        restart = next(e for e in events if e["event"] == "restart")
        assert failure["cause"] == "launch_failed" and "Killed" in (failure.get("srun_says") or ""), failure
        # the killed rank printed no error; its peers' (a closed connection) are not the cause
        assert failure.get("rank_error") is None, failure
        assert restart["in_allocation"] and restart["job_id"] == failure["job_id"] == str(job_id), restart
        assert restart["resume_step"] in (4, 8) and restart["resume_step"] <= failure["last_step"], restart
        assert [j.job_id for j in ctl.state.jobs] == [str(job_id)], "one SLURM job from start to finish"
        assert not [e for e in events if e["event"] == "job_submitted"], "nothing was resubmitted"
        # SLURM's own view: the job held 3 nodes; the launcher's record: launch 1 left out the
        # failed node and ran on the spare; the ranks of launch 1 beat from there.
        held = expand_hostlist(scheduler.show_job(str(job_id))["NodeList"])
        allocation = read_allocation(ctl.paths.allocation(job_id))
        print(f"SLURM: job {job_id} held {held}; launcher: {allocation}")
        assert len(held) == 3 and allocation.launch == 1 and allocation.exit_code == 0, (held, allocation)
        assert list(allocation.left_out) == [failure["host"]] and failure["host"] not in allocation.nodes
        assert set(allocation.nodes) <= set(held) and len(allocation.nodes) == 2
        launch1 = [b.to_dict() for b in read_heartbeats(ctl.paths.heartbeats) if b.launch == 1]
        assert sorted(b["rank"] for b in launch1) == [0, 1, 2, 3] and {b["host"] for b in launch1} == set(allocation.nodes)
        assert excluded_nodes(ctl.paths) == [failure["host"]]
        output = (ctl.paths.jobs / f"slurm-{job_id}.out").read_text(errors="replace")
        assert "launch 1 on " in output and "(warm standby;" in output, "launch 1 must be the warm standby"
        # The same losses as the uninterrupted run on 22.05: resume is exact on either release.
        assert_same_losses(ctl.paths, reference_losses)
        # The restore of launch 1: every file each rank read, where from; nothing from the shared copy.
        first = next(e for e in events if e["event"] == "first_step_after_restart")
        print(f"launch 1 read {first['restore_bytes']} bytes by source; its start (s): {first['start_phases']}")
        reads = [line.split(": ", 1)[1] for line in output.splitlines() if ": [restore rank" in line]  # srun --label
        print("\n".join(reads))
        assert first["restore_bytes"]["shared"] == 0 and first["restore_bytes"]["peer"] > 0, first
        assert first["restore_bytes"]["local"] > 0 and not [line for line in reads if " from shared " in line]
        assert {line.split("]")[0] for line in reads} == {f"[restore rank {r}" for r in range(4)}
        # (the emulated nodes share one disk: the killed node's copies are still there, never read)
        assert not [line for line in reads if f"/{failure['host']}/" in line]
        assert all("/fetched/" in line for line in reads if " from peer " in line)
        assert not [e for e in events if e["event"] == "checkpoint_copy_dropped"]
        # The ended job as a restarted controller reads it: 24.11's JSON, ended jobs included.
        info = SlurmScheduler(env=env).jobs([str(job_id)])[str(job_id)]
        assert (info.state, info.exit_code) == (JobState.COMPLETED, 0), info
        assert sorted(info.nodes) == sorted(held), info
    finally:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            scheduler.cancel(live)
        ctl.stop()
        shutil.rmtree(root, ignore_errors=True)
