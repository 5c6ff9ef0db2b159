"""The controller never ends while the run needs it: a pass that raises is recorded and retried
with backoff, slurmctld timing out is not a failure of the run, a full disk (a real, full tmpfs)
is notified instead of a traceback, the status moves only along its table, and an interrupted
submission adopts only the owner's own unfinished jobs submitted after the intent."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from fakes import WebhookServer, make_config

from orchestrator.contract import Heartbeat, JobState, RunPaths, atomic_write_text
from orchestrator.contract.exclude import excluded_nodes
from orchestrator.contract.state import ControllerState, IllegalTransition, JobRecord, RunStatus, SubmitIntent
from orchestrator.controller import Controller
from orchestrator.controller.submission import current_user, reconcile_intent
from orchestrator.errors import SchedulerError
from orchestrator.plan.config import dump_config
from orchestrator.slurm.base import JobInfo
from tests.run_records import event_dicts


class ScriptedScheduler:
    """One job that runs forever; `failures` makes the next calls of jobs() raise."""

    name = "scripted"

    def __init__(self):
        self.failures: list[Exception] = []
        self.calls: list[str] = []
        self.submitted: list[str] = []

    def submit(self, request) -> str:
        self.submitted.append(str(100 + len(self.submitted)))
        return self.submitted[-1]

    def jobs(self, job_ids):
        self.calls.append("jobs")
        if self.failures:
            raise self.failures.pop(0)
        return {j: JobInfo(j, "demo", JobState.RUNNING, ["node01"], start_time=1.0) for j in job_ids}

    def cancel(self, job_ids, signal=None):
        self.calls.append(f"cancel {job_ids}")

    def update_exclude(self, job_ids, exclude):
        self.calls.append("update_exclude")

    def release(self, job_ids):
        self.calls.append("release")


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def controller_in(run_dir: Path, scheduler, clock: Clock, **overrides) -> Controller:
    cfg = make_config(**overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.yaml").write_text(dump_config(cfg))
    submit = lambda exclude, reason: scheduler.submit(None)  # noqa: E731
    return Controller(run_dir, cfg, scheduler, submitter=submit, clock=clock, monotonic=clock, sleep=clock.sleep,
                      stack_wait_seconds=0.0)


def beats(paths: RunPaths, job_id: str, seq: int, world: int = 4) -> None:
    for rank in range(world):
        hb = Heartbeat(rank, world, f"node{rank + 1:02d}", job_id, 10 + rank, seq, "step", float(seq), float(seq),
                       0.0, {}, seq=seq)
        atomic_write_text(paths.heartbeat(rank), hb.to_json())


def names(paths: RunPaths) -> list[str]:
    return [e["event"] for e in event_dicts(paths)]


def test_a_pass_that_raises_is_recorded_retried_with_backoff_and_supervision_goes_on(tmp_path):
    scheduler, clock = ScriptedScheduler(), Clock()
    ctl = controller_in(tmp_path / "run", scheduler, clock)
    ctl.start()
    ctl.tick()  # submits job 100
    scheduler.failures = [RuntimeError("squeue exploded"), RuntimeError("squeue exploded"), ValueError("bad JSON")]
    slept = []
    ctl.sleep = lambda s: (slept.append(s), clock.sleep(s))
    seq = iter(range(1000))
    beats(ctl.paths, "100", next(seq))
    ctl.run(on_pass=lambda result: beats(ctl.paths, "100", next(seq)), max_seconds=1.0)
    events = event_dicts(ctl.paths)
    failed = [e for e in events if e["event"] == "pass_failed"]
    assert [e["passes_failed_in_a_row"] for e in failed] == [1, 2, 3]
    assert "squeue exploded" in failed[0]["error"]
    assert "pass_recovered" in names(ctl.paths)
    assert ctl.state.status == RunStatus.RUNNING
    poll = ctl.cfg.watchdog.poll_seconds
    assert slept[:4] == [poll, poll * 2, poll * 4, poll], "backoff doubles while passes fail, resets after"
    ctl.stop()


def test_slurmctld_unreachable_is_not_a_failure_of_the_run(tmp_path):
    scheduler, clock = ScriptedScheduler(), Clock()
    ctl = controller_in(tmp_path / "run", scheduler, clock)
    ctl.start()
    beats(ctl.paths, "100", 0)
    ctl.tick()  # submits job 100
    assert ctl.tick().status == RunStatus.RUNNING
    scheduler.failures = [SchedulerError("squeue: error: slurm_load_jobs: Socket timed out")] * 8
    for seq in range(1, 9):  # 8 passes x 0.1 s of slurmctld silence while the ranks train on
        clock.sleep(0.1)
        beats(ctl.paths, "100", seq)
        result = ctl.tick()
        assert result.status == RunStatus.RUNNING
    clock.sleep(0.1)
    ctl.tick()
    assert names(ctl.paths).count("scheduler_unreachable") == 1
    assert "scheduler_reachable" in names(ctl.paths)
    assert not [c for c in scheduler.calls if c.startswith("cancel")] and scheduler.submitted == ["100"]
    ctl.stop()


@pytest.fixture
def small_filesystem():
    """A real 2 MiB filesystem (tmpfs, needs root): what a run directory on a full disk sees."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="rc-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)
    shutil.rmtree(where, ignore_errors=True)


def test_a_full_disk_is_notified_and_the_controller_keeps_supervising(small_filesystem):
    hook = WebhookServer()
    try:
        scheduler, clock = ScriptedScheduler(), Clock()
        ctl = controller_in(small_filesystem / "run", scheduler, clock, notifications={"urls": [hook.url]})
        ctl.start()
        beats(ctl.paths, "100", 0)
        ctl.tick()
        filler = small_filesystem / "filler"
        with open(filler, "wb") as handle:  # a save fills the disk
            try:
                while True:
                    handle.write(b"\0" * 65536)
            except OSError:
                pass
        for seq in range(1, 5):
            clock.sleep(40)  # past the 30 s state.json refresh; the ranks' beats cannot be written
            try:
                beats(ctl.paths, "100", seq)
            except OSError:
                pass
            ctl.safe_tick()  # never raises: whatever failed is notified and retried next pass
        said = " | ".join(r.get("message", "") for r in hook.received)  # apprise's JSON POST
        assert "No space left on device" in said, said
        filler.unlink()
        for seq in range(10, 13):
            clock.sleep(40)
            beats(ctl.paths, "100", seq)
            assert ctl.safe_tick().error is None
        assert ctl.paths.state.stat().st_size > 0 and not ctl.state.status.stopped
        ctl.stop()
    finally:
        hook.close()


def test_status_moves_only_along_the_transition_table():
    state = ControllerState()
    assert state.move_to(RunStatus.RUNNING) and state.move_to(RunStatus.KILLING)
    with pytest.raises(IllegalTransition, match="killing -> restarting"):
        state.move_to(RunStatus.RESTARTING)
    state.move_to(RunStatus.KILLED)
    assert state.status.stopped and state.move_to(RunStatus.WAITING)
    state.move_to(RunStatus.FINISHED)
    with pytest.raises(IllegalTransition):
        state.move_to(RunStatus.WAITING)
    assert ControllerState.from_dict(state.to_dict()).status is RunStatus.FINISHED


def test_interrupted_submission_adopts_only_our_own_unfinished_jobs_after_the_intent():
    me = current_user()
    state = ControllerState(jobs=[JobRecord("5", 1.0)])
    state.pending_submit = SubmitIntent(token="t", time=500.0, reason="restart", job_name="demo", exclude=[])

    class Queue:
        def jobs_by_name(self, name):
            return [
                JobInfo("5", name, JobState.RUNNING, user=me, submit_time=1.0),  # already ours
                JobInfo("6", name, JobState.PENDING, user="mallory", submit_time=510.0),  # someone else's
                JobInfo("7", name, JobState.COMPLETED, user=me, submit_time=510.0),  # finished
                JobInfo("8", name, JobState.PENDING, user=me, submit_time=100.0),  # before the intent
                JobInfo("9", name, JobState.PENDING, user=me, submit_time=501.0),  # the one
            ]

    adopted = reconcile_intent(state, Queue())
    assert [r.job_id for r in adopted] == ["9"] and state.pending_submit is None


def test_a_malformed_name_in_the_exclude_list_never_reaches_sbatch(tmp_path):
    paths = RunPaths.of(tmp_path)
    paths.exclude_list.write_text(
        '{"nodes": {"node07": {}, "node02;touch /tmp/x": {}, "node\\n03": {}, "-rf": {}}}')
    assert excluded_nodes(paths) == ["node07"]


def test_dashboard_shows_the_controllers_beat_ages_not_node_clocks(tmp_path):
    """A node whose clock is an hour behind is not shown as an hour late while a controller that
    saw its beats change runs; without a controller the dashboard can only use node clocks."""
    from orchestrator.contract.controller_beat import read_beat, write_beat
    from orchestrator.contract.controller_lock import ControllerLock
    from orchestrator.views.dashboard import dashboard_data

    scheduler, clock = ScriptedScheduler(), Clock()
    ctl = controller_in(tmp_path / "run", scheduler, clock)
    ctl.start()
    ctl.tick()  # submits job 100
    for seq in range(3):
        clock.sleep(0.1)
        beats(ctl.paths, "100", seq)  # beat_time = seq: on the node's clock, ~30 years ago
        ctl.tick()
    ctl.stop()
    paths = ctl.paths
    seen = read_beat(paths).node_beat_age  # what the controller itself wrote after its passes
    assert sorted(seen) == ["node01", "node02", "node03", "node04"] and max(seen.values()) < 1.0, seen
    write_beat(paths, passes=9, failing_passes=0, status="running", poll_seconds=0.1, started_at=0.0,
               node_beat_age={f"node{r + 1:02d}": 0.1 for r in range(4)})
    with ControllerLock(paths.root):
        ages = {n: info.age for n, info in dashboard_data(paths.root).nodes.items()}
    assert ages and all(age < 60 for age in ages.values()), ages
    without = {n: info.age for n, info in dashboard_data(paths.root).nodes.items()}
    assert all(age > 10**8 for age in without.values()), without
