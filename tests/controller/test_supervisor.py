"""The controller against a fake scheduler that runs fake trainer ranks (real processes, real
files): failure detection, restart, crash loop, kill switch, duplicates after a controller crash."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from fake_trainer import loss_at
from fakes import WebhookServer, supervise

from orchestrator.contract import RunPaths, atomic_write_json, read_jsonl
from orchestrator.contract.exclude import excluded_nodes
from orchestrator.contract.state import RunStatus
from tests.run_records import event_dicts


def final_losses(paths: RunPaths) -> dict[int, float]:
    """Loss per step, the last write of each step winning (a restart repeats steps)."""
    return {m["step"]: m["loss"] for m in read_jsonl(paths.metrics)}


def events_named(paths: RunPaths, name: str) -> list[dict]:
    return [e for e in event_dicts(paths) if e["event"] == name]


def test_uninterrupted_run_finishes(run_env):
    cfg, scheduler, ctl = run_env()
    ctl.start()
    assert supervise(ctl) == RunStatus.FINISHED
    paths = ctl.paths
    assert scheduler.submissions() == 1
    assert final_losses(paths) == {s: loss_at(s) for s in range(1, 21)}
    assert [e["outcome"] for e in events_named(paths, "job_ended")] == ["finished"]


def test_crashed_rank_is_restarted_and_losses_match(run_env):
    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_CRASH_AT": "14:2"}, {"FAKE_CRASH_AT": ""}]
    ctl.start()
    assert supervise(ctl) == RunStatus.FINISHED
    paths = ctl.paths
    restart = events_named(paths, "restart")
    assert len(restart) == 1 and restart[0]["resume_step"] == 10
    assert restart[0]["work_lost_steps"] >= 2
    first = events_named(paths, "first_step_after_restart")
    assert first and first[0]["step"] > 10
    print("failure -> first step after restart:", round(first[0]["seconds_since_failure"], 3), "s")
    assert final_losses(paths) == {s: loss_at(s) for s in range(1, 21)}
    assert scheduler.submissions() == 2


def test_stopped_rank_is_dead_stacks_dumped_node_excluded(run_env):
    """SIGSTOP: the rank stops beating; the others beat but wait (hang). The stopped rank's node
    is the culprit: stacks are asked for, the job is cancelled and restarted without that node."""
    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_STOP_AT": "7:1"}]
    ctl.start()
    t0 = time.monotonic()
    assert supervise(ctl) == RunStatus.FINISHED
    paths = ctl.paths
    failure = events_named(paths, "failure")[0]
    assert failure["cause"] == "dead_rank" and failure["ranks"][0]["rank"] == 1
    latency = failure["detection_time"] - failure["failure_time"]
    print(f"dead-rank detection latency {latency:.2f} s (dead_after {cfg.watchdog.dead_after_seconds} s)")
    assert latency < cfg.watchdog.dead_after_seconds + 1.0
    stacks = events_named(paths, "stacks_dumped")[0]
    assert stacks["ranks_answered"] >= 3  # every rank but the stopped one
    assert (paths.stacks / "rank-00000.txt").read_text().count("thread") >= 2
    assert excluded_nodes(paths) == ["node02"]
    second = scheduler.jobs_by_id[events_named(paths, "restart")[0]["job_id"]]
    assert "node02" not in second.nodes and second.exclude == ["node02"]
    assert final_losses(paths) == {s: loss_at(s) for s in range(1, 21)}
    print(f"stopped-rank scenario done in {time.monotonic() - t0:.1f} s")


def test_hang_detected_after_step_timeout(run_env):
    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_HANG_AT": "8:0"}]
    ctl.start()
    assert supervise(ctl) == RunStatus.FINISHED
    paths = ctl.paths
    failure = events_named(paths, "failure")[0]
    assert failure["cause"] == "hang"
    latency = failure["detection_time"] - failure["failure_time"]
    limit = failure["ranks"][0]["limit_seconds"]
    print(f"hang detection: stalled {latency:.2f} s, timeout {limit:.2f} s", failure)
    assert limit <= latency < limit + 1.0
    # rank 0 is one step behind the others, who wait for it: its node is the suspect.
    assert excluded_nodes(paths) == ["node01"]
    assert final_losses(paths) == {s: loss_at(s) for s in range(1, 21)}


def test_long_checkpoint_is_not_a_hang(run_env):
    """Checkpoint saves take 3.5 s, longer than the 3 s step limit but within the checkpoint
    limit (6 s): no failure. The fake trainer marks no progress below the step, so the limits stay
    the configured phase timeouts (nothing is learned)."""
    cfg, scheduler, ctl = run_env(trainer_env={"FAKE_CKPT_SECONDS": "3.5", "FAKE_STEPS": "6"})
    ctl.start()
    assert supervise(ctl, seconds=60) == RunStatus.FINISHED
    assert events_named(ctl.paths, "failure") == []
    learned = ctl.timeouts.as_dict()
    print("learned timeouts:", learned)
    assert learned["longest_gap"] == {}
    assert learned["timeouts"]["checkpoint"] == 6.0 and learned["timeouts"]["step"] == 3.0


def test_crash_loop_stops_and_notifies(run_env):
    hook = WebhookServer()
    try:
        cfg, scheduler, ctl = run_env(trainer_env={"FAKE_CRASH_AT": "3:1"},
                                      notifications={"urls": [hook.url]})
        ctl.start()
        assert supervise(ctl, seconds=60) == RunStatus.CRASH_LOOP
        paths = ctl.paths
        assert len(events_named(paths, "restart")) == cfg.watchdog.max_restarts_without_progress
        assert scheduler.submissions() == 1 + cfg.watchdog.max_restarts_without_progress
        assert "crash_loop" in hook.kinds() and hook.kinds().count("restart") == 3
        assert ctl.state.status == RunStatus.CRASH_LOOP
    finally:
        hook.close()


def test_kill_switch_saves_stops_and_cancels_successors(run_env):
    cfg, scheduler, ctl = run_env(trainer_env={"FAKE_STEPS": "400"})
    ctl.start()
    supervise(ctl, until=lambda c: c.state.status == RunStatus.RUNNING)
    successor = ctl.submitter([], "chain")  # a queued singleton successor
    from orchestrator.contract.state import JobRecord

    ctl.state.jobs.append(JobRecord(job_id=successor, submitted_at=time.time(), reason="chain"))
    time.sleep(0.5)
    atomic_write_json(ctl.paths.control_request("kill"), {"user": "oncall", "reason": "loss spike", "now": False})
    assert supervise(ctl) == RunStatus.KILLED
    paths = ctl.paths
    assert scheduler.jobs_by_id[successor].state.value == "cancelled"
    ended = events_named(paths, "job_ended")
    assert ended[0]["exit_code"] == 17 and ended[0]["outcome"] == "killed"
    assert events_named(paths, "restart") == []
    saved = sorted(p.name for p in paths.checkpoints.glob("step_*"))
    assert saved, "the trainer saves before stopping"
    # resume: a new job continues from the kill checkpoint
    os.unlink(paths.control_request("kill"))
    atomic_write_json(paths.control_request("resume"), {"user": "oncall", "reason": "spike understood"})
    supervise(ctl, until=lambda c: c.state.status == RunStatus.RUNNING)
    assert events_named(paths, "resumed")
    assert scheduler.submissions() == 3


def test_kill_now_cancels_at_once(run_env):
    cfg, scheduler, ctl = run_env(trainer_env={"FAKE_STEPS": "400"})
    ctl.start()
    supervise(ctl, until=lambda c: c.state.status == RunStatus.RUNNING)
    atomic_write_json(ctl.paths.control_request("kill"), {"user": "oncall", "reason": "bad node", "now": True})
    assert supervise(ctl, seconds=5) == RunStatus.KILLED
    assert scheduler.jobs_by_id["1001"].state.value == "cancelled"


def test_controller_crash_between_sbatch_and_record_submits_nothing_twice(run_env):
    """The controller dies right after sbatch (before recording the id). A new controller finds the
    intent in state.json, adopts the job from the scheduler by name, and does not submit again."""
    cfg, scheduler, ctl = run_env()
    real_submit = ctl.submitter

    def submit_then_die(exclude, reason):
        real_submit(exclude, reason)
        raise SystemExit("controller killed after sbatch")

    ctl.submitter = submit_then_die
    ctl.start()
    with pytest.raises(SystemExit):
        ctl.tick()
    ctl.stop()
    state = json.loads(ctl.paths.state.read_text())
    assert state["pending_submit"] and state["jobs"] == []
    _, _, ctl2 = run_env()
    ctl2.scheduler = scheduler
    ctl2.submitter = real_submit
    ctl2.start()
    assert supervise(ctl2) == RunStatus.FINISHED
    assert scheduler.submissions() == 1
    assert events_named(ctl2.paths, "job_adopted")


def test_corrupt_newest_checkpoint_previous_used_and_reported(run_env):
    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_CRASH_AT": "14:3"}]
    ctl.start()
    paths = ctl.paths

    def corrupt_when_two_checkpoints(c):
        steps = sorted(paths.checkpoints.glob("step_*/MANIFEST.json"))
        return len(steps) >= 2

    supervise(ctl, until=corrupt_when_two_checkpoints)
    (paths.checkpoint(10) / "state.json").write_bytes(b'{"step": 99}')  # same size, other bytes
    assert supervise(ctl) == RunStatus.FINISHED
    # The login node never hashes: it predicts step 10 (sizes match); the ranks find the damage
    # by hash, resume from 5 and report it, and the controller relays their report.
    assert events_named(paths, "restart")[0]["resume_step"] == 10
    corrupt = events_named(paths, "checkpoint_corrupt")
    assert corrupt and corrupt[0]["step"] == 10 and "sha256" in corrupt[0]["problem"]
    assert events_named(paths, "first_step_after_restart")[0]["resumed_from"] == 5
    assert paths.checkpoint(10).exists(), "a damaged checkpoint is never deleted"
    assert final_losses(paths) == {s: loss_at(s) for s in range(1, 21)}


def test_disk_warning_from_planned_checkpoint_size(run_env):
    hook = WebhookServer()
    try:
        cfg, scheduler, ctl = run_env(notifications={"urls": [hook.url]})
        ctl.start()
        ctl.memory.planned_bytes = 10**18  # an exabyte checkpoint: no disk has room
        ctl.tick()
        disk = events_named(ctl.paths, "disk")
        assert disk and disk[0]["level"] == "critical" and "planner" in disk[0]["message"]
        assert "disk" in hook.kinds()
        ctl.tick()
        assert len(events_named(ctl.paths, "disk")) == 1, "reported once per change, not every pass"
    finally:
        hook.close()


def test_one_controller_per_run(run_env):
    from orchestrator.errors import RunBusyError

    cfg, scheduler, ctl = run_env()
    ctl.start()
    _, _, other = run_env()
    with pytest.raises(RunBusyError, match="another controller"):
        other.start()


def test_sigkilled_controller_process_leaves_no_stale_lock(tmp_path):
    import subprocess
    import sys

    from orchestrator.contract.controller_lock import ControllerLock, lock_holder

    code = f"from orchestrator.contract.controller_lock import ControllerLock; ControllerLock({str(tmp_path)!r}).acquire(); import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=str(RunPaths.of('.').root))
    for _ in range(100):
        if lock_holder(tmp_path):
            break
        time.sleep(0.05)
    assert lock_holder(tmp_path)["pid"] == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ControllerLock(tmp_path).acquire().release()


def test_failed_notification_is_logged_not_fatal(run_env):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg, scheduler, ctl = run_env(notifications={"urls": [f"json://127.0.0.1:{port}/hook"], "timeout_seconds": 1})
    ctl.start()
    assert supervise(ctl) == RunStatus.FINISHED
    failed = events_named(ctl.paths, "notification_failed")
    assert failed and failed[-1]["kind"] == "finish" and "Connection error" in failed[-1]["problem"]


def test_restart_releases_the_queued_successor_with_the_new_exclude_list(run_env):
    """A chain's held successor is reused for the restart: exclude list updated, released; no
    extra submission."""
    from orchestrator.contract.state import JobRecord
    from orchestrator.slurm.base import SubmitRequest

    cfg, scheduler, ctl = run_env()
    scheduler.env_for_job = [{"FAKE_STOP_AT": "7:3"}]
    ctl.start()
    supervise(ctl, until=lambda c: c.state.status == RunStatus.RUNNING)
    successor = scheduler.submit(SubmitRequest(script=ctl.paths.root, job_name=cfg.name, dependency="singleton", hold=True))
    ctl.state.jobs.append(JobRecord(job_id=successor, submitted_at=time.time(), reason="chain"))
    assert supervise(ctl) == RunStatus.FINISHED
    assert scheduler.submissions() == 2
    assert ("update_exclude", [successor], ["node04"]) in scheduler.calls
    assert ("release", [successor]) in scheduler.calls
    restart = events_named(ctl.paths, "restart")[0]
    assert restart["job_id"] == successor and "queued successor" in restart["how"]
    assert "node04" not in scheduler.jobs_by_id[successor].nodes
