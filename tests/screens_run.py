"""A fixed run directory for the screens' tests (tests/unit/test_screens_golden.py): BLOOM's config,
a chain of three jobs, a restart inside the second, a node gone silent, a late one, a straggler, a
disk warning. Every record is written through the contract's own writers, at fixed times (UTC).

The story, on 2026-11-30 unless said (NOW = 14:05:00; a step takes 105 s):
    11-26 08:00  jobs 1000, 1001, 1002 submitted as a chain; the controller starts
    11-26 08:06  job 1000 trains from step 0
         09:00   checkpoint at step 3322; 11:51 job 1000 saves step 3419 and ends at its time
                 budget (exit 18); the chain goes on
         12:02   job 1001 trains from step 3419
         12:26   node23 dies at step 3432 (noticed 12:30): stacks dumped, restart inside the job on
                 a spare, node23 excluded; 12:41 training again
         13:10   node05 becomes a straggler
         13:40   the checkpoint disk is short of room for the next checkpoint
         13:52   an operator's `runctl nodes --clear` request accepted
         14:05   now: step 3466; node17 silent for 212 s (dead after 120 s), node31 late (95 s)

Beside it, copies told differently (build_variants), for the words the main story cannot show:
    killed/   the same run stopped by the kill switch at 13:58 (job 1001 saved and exited 17),
              read while squeue fails (its stdout and stderr in the warning);
    queued/   job 1001 submitted by `runctl submit` and training, no controller ever ran (no
              state.json, no events): what `ls` counts and whose heartbeats `status` shows;
    tp3.yaml  BLOOM's config with tp: 3, which `plan` refuses.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
from pathlib import Path

from orchestrator.contract import Heartbeat, RunPaths, StepMetrics, atomic_write_json, atomic_write_text
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.controller_beat import write_beat
from orchestrator.contract.ledger import LastSeen, Submission, append_submission, write_last_seen
from orchestrator.contract.manifest import FileEntry, Manifest, write_manifest
from orchestrator.contract.paths import LATEST_NAME
from orchestrator.contract.state import ControllerState, JobRecord, RunStatus, load_state, save_state
from orchestrator.plan.config import dump_config, load_config
from orchestrator.slurm.mock import MockSlurm

REPO = Path(__file__).resolve().parents[1]
UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 11, 30, 14, 5, tzinfo=UTC).timestamp()
TIB = 1 << 40


def at(day: int, hour: int, minute: int, second: int = 0) -> float:
    return datetime.datetime(2026, 11, day, hour, minute, second, tzinfo=UTC).timestamp()


def training_nodes() -> list[str]:
    """The 48 nodes of job 1001's second launch: node23 left out, the spare node49 in its place."""
    return [f"node{k:02d}" for k in range(1, 50) if k != 23]


STEP_SECONDS = 105.0
JOB1_TRAINS = at(26, 8, 6, 12)  # after 312 s of init
JOB2_TRAINS = at(30, 12, 2, 20)  # after 280 s of init and a 340 s checkpoint load
AGAIN = at(30, 12, 41)  # the relaunch's first step
SAVED, LAST_SAVE, FAILED_AT, LAST_STEP = 3322, 3419, 3432, 3466
LAST_STEP_AT = AGAIN + (LAST_STEP - LAST_SAVE) * STEP_SECONDS  # 14:03:15


def events() -> list[ev.Event]:
    return [
        ev.ControllerStarted(time=at(26, 8, 0), status="waiting", jobs=["1000", "1001", "1002"]),
        ev.JobTraining(time=JOB1_TRAINS, job_id="1000", step=0, init_seconds=312.0),
        ev.CheckpointComplete(time=at(30, 9, 0), step=SAVED, saved_at=at(30, 9, 0), size_bytes=int(2.3 * TIB)),
        ev.CheckpointComplete(time=at(30, 11, 51), step=LAST_SAVE, saved_at=at(30, 11, 51),
                              size_bytes=int(2.3 * TIB)),
        ev.JobEnded(time=at(30, 11, 51), job_id="1000", state="completed", exit_code=18, outcome="time_budget"),
        ev.Continue(time=at(30, 11, 51), job_id="1000", why="time budget reached with a checkpoint saved"),
        ev.JobTraining(time=JOB2_TRAINS, job_id="1001", step=LAST_SAVE + 1, resumed_from=LAST_SAVE,
                       checkpoint_load_seconds=340.0, init_seconds=280.0),
        fev.Failure(time=at(30, 12, 30), job_id="1001", cause="dead_rank", failure_time=at(30, 12, 26, 25),
                   detection_time=at(30, 12, 30), last_step=FAILED_AT, ranks_affected=8,
                   ranks=[{"kind": "dead_rank", "rank": 176, "host": "node23", "phase": "step",
                           "step": FAILED_AT, "age_seconds": 215.0, "limit_seconds": 180.0}]),
        fev.StacksDumped(time=at(30, 12, 30), job_id="1001", files=[f"rank-{r:05d}.txt" for r in range(376)],
                        ranks_answered=376, ranks_expected=384, directory="/gpfs/runs/tr11/stacks"),
        fev.Restart(time=at(30, 12, 30), job_id="1001", in_allocation=True, failed_job_id="1001",
                   cause="dead_rank", failure_time=at(30, 12, 26, 25), detection_time=at(30, 12, 30),
                   restart_time=at(30, 12, 30), resume_step=LAST_SAVE, last_step=FAILED_AT,
                   work_lost_steps=FAILED_AT - LAST_SAVE, work_lost_seconds=(FAILED_AT - LAST_SAVE) * STEP_SECONDS,
                   excluded=["node23"], how="inside job 1001: launch 1 leaving out node23 (3 spare(s) left)"),
        fev.NodesExcluded(time=at(30, 12, 30), nodes=["node23"], job_id="1001", cause="dead_rank",
                         excluded=["node23"]),
        ev.JobTraining(time=AGAIN, job_id="1001", launch=1, step=LAST_SAVE + 1, resumed_from=LAST_SAVE,
                       checkpoint_load_seconds=95.0),
        fev.FirstStepAfterRestart(time=AGAIN + STEP_SECONDS, job_id="1001", step=LAST_SAVE + 1,
                                 resume_step=LAST_SAVE, resumed_from=LAST_SAVE,
                                 seconds_since_failure=AGAIN + STEP_SECONDS - at(30, 12, 26, 25),
                                 seconds_since_restart=AGAIN + STEP_SECONDS - at(30, 12, 30)),
        fev.Straggler(time=at(30, 13, 10), node="node05", job_id="1001", score=1.42, vs_median=1.42,
                     vs_history=1.1, compute_seconds=95.2, slow_for_seconds=1260.0, step=3436, threshold=1.3),
        ev.Disk(time=at(30, 13, 40), level="warning", free_bytes=int(1.9 * TIB), expected_bytes=int(2.3 * TIB),
                message="1.9 TiB free on /gpfs/runs/tr11/checkpoints, next checkpoint needs ~2.3 TiB (the last "
                "checkpoint's size); free space or lower checkpoint.keep_last before 14:51"),
        ev.RequestAccepted(time=at(30, 13, 52), request="nodes --clear", user="oncall", uid=1002,
                           reason="node23 DIMM replaced"),
    ]  # fmt: skip


def metrics() -> list[StepMetrics]:
    """Every step's line: job 1000's steps, job 1001's up to the failure, and again after it."""
    runs = [("1000", JOB1_TRAINS, 1, LAST_SAVE), ("1001", JOB2_TRAINS, LAST_SAVE + 1, FAILED_AT),
            ("1001", AGAIN, LAST_SAVE + 1, LAST_STEP)]  # fmt: skip
    out = []
    for job, start, first, last in runs:
        for step in range(first, last + 1):
            out.append(StepMetrics(step=step, time=start + (step - first + 1) * STEP_SECONDS,
                                   loss=round(2.0 + 8.0 / step**0.5, 6), lr=5.9e-5, grad_norm=0.31,
                                   global_batch=2048, consumed_samples=step * 2048, step_seconds=STEP_SECONDS,
                                   tokens_per_s=2048 * 2048 / STEP_SECONDS, tflops_per_gpu=149.8, job_id=job))  # fmt: skip
    return out


def build_run(root: Path) -> RunPaths:
    """The run directory under `root`/run, complete. Call with time.time fixed to NOW."""
    cfg = load_config(REPO / "configs" / "bloom-176b.yaml")
    paths = RunPaths.for_config(root / "run", cfg)
    for folder in (paths.jobs, paths.heartbeats, paths.checkpoints, paths.control, paths.private):
        folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.config, dump_config(cfg))
    for index, job in enumerate(("1000", "1001", "1002")):
        append_submission(
            paths.submissions,
            Submission(job_id=job, time=at(26, 8, 0), reason="chain" if index else "submit", chain_index=index,
                       user="stas", scheduler="mock"),
        )  # fmt: skip
    # SLURM forgot the ended job; the pending one waits for the running one (singleton).
    write_last_seen(paths.last_seen, {"1002": LastSeen(state="pending", reason="Dependency", seen_at=NOW - 15)})
    allocation = [f"node{k:02d}" for k in range(1, 53)]
    state = ControllerState(
        status=RunStatus.RUNNING,
        jobs=[
            JobRecord("1000", at(26, 8, 0), state="completed", reason="submit", nodes=allocation,
                      started_at=at(26, 8, 1), ended_at=at(30, 11, 51), exit_code=18, outcome="time_budget"),
            JobRecord("1001", at(26, 8, 0), state="running", reason="chain", nodes=allocation,
                      started_at=at(30, 11, 52)),
            JobRecord("1002", at(26, 8, 0), state="pending", reason="chain"),
        ],
        restarts=1,
        disk_level="warning",
        last_pass=NOW - 12,
        stragglers={"job_id": "1001", "step": 3460, "threshold": 1.3, "nodes": {
            "node05": {"score": 1.42, "vs_median": 1.42, "vs_history": 1.1, "compute_seconds": 95.2,
                       "slow_for_seconds": 1260.0, "straggler": True},
            "node40": {"score": 1.04, "vs_median": 1.04, "vs_history": 1.0, "compute_seconds": 69.8,
                       "slow_for_seconds": None, "straggler": False},
        }},
    )  # fmt: skip
    save_state(paths, state)
    for event in events():
        ev.write_event(paths.events, event)
    # One write: append_metrics fsyncs each line (13 s for these 3,500 here); the lines are its own.
    atomic_write_text(paths.metrics, "".join(json.dumps(m.to_dict(), sort_keys=True) + "\n" for m in metrics()))
    for step, saved in ((SAVED, at(30, 9, 0)), (LAST_SAVE, at(30, 11, 51))):
        checkpoint = paths.checkpoint(step)
        checkpoint.mkdir()
        write_manifest(checkpoint, Manifest(files={"model_states.pt": FileEntry(int(2.3 * TIB), "0" * 64)},
                                            step=step, created=saved, world_size=384, job_id="1000"))  # fmt: skip
        os.utime(checkpoint / "MANIFEST.json", (saved, saved))
    atomic_write_text(paths.checkpoints / LATEST_NAME, paths.checkpoint(LAST_SAVE).name)
    atomic_write_json(  # what the controller's exclude list holds (controller/exclude.py)
        paths.exclude_list, {"nodes": {"node23": {"since": at(30, 12, 30), "reason": "dead_rank in job 1001",
                                                  "by": "controller"}}},
    )  # fmt: skip
    _heartbeats(paths)
    return paths


def beat_ages() -> dict[str, float]:
    """Seconds since the controller saw each node's beat change: node17 dead, node31 late."""
    ages = {node: 2.0 + (int(node[4:]) % 7) for node in training_nodes()}
    ages.update(node17=212.0, node31=95.0)
    return ages


def _heartbeats(paths: RunPaths) -> None:
    nodes = training_nodes()
    ages = beat_ages()
    for rank in range(384):
        host = nodes[rank // 8]
        beat = Heartbeat(rank=rank, world_size=384, host=host, job_id="1001", pid=40000 + rank, step=LAST_STEP,
                         phase="step", beat_time=NOW - ages[host], progress_time=LAST_STEP_AT,
                         phase_started=AGAIN, launch=1, seq=900)  # fmt: skip
        atomic_write_text(paths.heartbeat(rank), beat.to_json())


def hold_controller_lock(paths: RunPaths) -> int:
    """Be the run's controller, as far as a reader can tell: hold controller.lock (flock, as
    controller/lock.py does) with a fixed holder, and write its beat (ages as seen 2 s ago)."""
    fd = os.open(paths.controller_lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": 4242, "host": "login1", "since": at(26, 8, 0)}).encode())
    ages = {node: age - 2.0 for node, age in beat_ages().items()}
    write_beat(paths, passes=1500, failing_passes=0, status="running", poll_seconds=15.0,
               started_at=at(26, 8, 0), now=NOW - 2, node_beat_age=ages)  # fmt: skip
    os.utime(paths.controller_heartbeat, (NOW - 2, NOW - 2))
    return fd


KILLED_AT = at(30, 13, 58)
SQUEUE_FAILS = """#!/bin/sh
# squeue as a busy slurmctld answers it: a line on stdout, the error on stderr, exit 1.
echo "squeue: warning: retrying"
echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2
exit 1
"""


def build_variants(paths: RunPaths) -> None:
    """killed/, queued/, tp3.yaml and bin/squeue beside the run (see the module's docstring)."""
    root = paths.root.parent
    killed = RunPaths.of(shutil.copytree(paths.root, root / "killed", symlinks=True))
    state = load_state(killed)
    state.status = RunStatus.KILLED
    for job in state.jobs[1:]:
        job.ended_at, job.state = KILLED_AT, "failed" if job.job_id == "1001" else "cancelled"
        job.exit_code, job.outcome = (17, "killed") if job.job_id == "1001" else (None, "cancelled")
    save_state(killed, state)
    write_last_seen(killed.last_seen, {})
    stop = "run stopped by the kill switch: maintenance window (by oncall)"
    for event in (ev.KillRequested(time=at(30, 13, 55), by="oncall", reason="maintenance window"),
                  ev.JobEnded(time=KILLED_AT, job_id="1001", state="failed", exit_code=17, outcome="killed"),
                  fev.RunStopped(time=KILLED_AT, status="killed", message=stop, by="oncall")):  # fmt: skip
        ev.write_event(killed.events, event)
    queued = RunPaths.of(shutil.copytree(paths.root, root / "queued", symlinks=True))
    for name in (queued.state, queued.events, queued.submissions, queued.last_seen, queued.exclude_list):
        name.unlink()
    append_submission(queued.submissions, Submission(job_id="1001", time=at(30, 11, 50), reason="submit",
                                                     chain_index=0, user="stas", scheduler="mock"))  # fmt: skip
    # The scheduler's word for it (its own mock): job 1001 runs since 11:52.
    mock = MockSlurm(root / "mock-queued")
    with mock.locked() as slurm:
        slurm["next_id"] = 1001
    mock.push_scenario([{"state": "RUNNING", "polls": 10**9}])
    assert mock.submit({"job-name": "tr11-176B-ml", "nodes": "52"}, str(queued.config)) == "1001"
    with mock.locked() as slurm:
        slurm["jobs"]["1001"].update(state="RUNNING", submit_time=at(30, 11, 50), start_time=at(30, 11, 52))
    text = (REPO / "configs" / "bloom-176b.yaml").read_text()
    assert "\n  tp: 4\n" in text
    atomic_write_text(root / "tp3.yaml", text.replace("\n  tp: 4\n", "\n  tp: 3\n"))
    (root / "bin").mkdir()
    atomic_write_text(root / "bin" / "squeue", SQUEUE_FAILS)
    os.chmod(root / "bin" / "squeue", 0o755)
