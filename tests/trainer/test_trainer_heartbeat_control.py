"""Heartbeat file (beat vs progress), stacks on request, and the control flags (in-process)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from orchestrator.contract import (
    DUMP_STACKS_REQUEST,
    KILL_REQUEST,
    Heartbeat,
    OperatorRequest,
    Phase,
    RunPaths,
    atomic_write_json,
)
from orchestrator.contract.client import stop as control
from orchestrator.contract.client.beat import HeartbeatWriter
from orchestrator.contract.client.stop import Controls
from orchestrator.contract.requests import publish_request


def read_beat(paths: RunPaths, rank: int = 0) -> Heartbeat:
    return Heartbeat.from_dict(json.loads(paths.heartbeat(rank).read_text()))


def test_heartbeat_fields_and_beat_moves_while_progress_stands(tmp_path):
    paths = RunPaths.of(tmp_path)
    hb = HeartbeatWriter(paths, rank=3, world_size=8, job_id="77", interval_seconds=0.05).start()
    try:
        hb.set_phase(Phase.STEP, step=10)
        hb.progress(11, loss=2.5)
        first = read_beat(paths, 3)
        assert (first.rank, first.world_size, first.job_id, first.pid, first.step, first.phase) == (
            3, 8, "77", os.getpid(), 11, "step")
        assert first.loss == 2.5 and first.host
        time.sleep(0.4)  # the loop is "blocked": nobody calls progress()
        later = read_beat(paths, 3)
        print(f"beat moved {later.beat_time - first.beat_time:.3f}s, progress moved "
              f"{later.progress_time - first.progress_time:.3f}s")
        assert later.beat_time - first.beat_time >= 0.2
        assert later.progress_time == first.progress_time
        assert later.step == 11
        hb.progress(12)
        assert read_beat(paths, 3).progress_time > first.progress_time
    finally:
        hb.stop(Phase.EXITING)
    assert read_beat(paths, 3).phase == "exiting"


def test_dump_stacks_request_is_served_by_the_heartbeat_thread(tmp_path):
    paths = RunPaths.of(tmp_path)
    hb = HeartbeatWriter(paths, rank=0, world_size=1, job_id="1", interval_seconds=0.05).start()
    blocker = threading.Event()

    def stuck_in_collective():  # stands for a rank blocked in a gloo/NCCL wait
        blocker.wait(5)

    worker = threading.Thread(target=stuck_in_collective, name="stuck-worker")
    worker.start()
    try:
        atomic_write_json(paths.accepted_request(DUMP_STACKS_REQUEST), {"by": "controller", "reason": "hang"})
        deadline = time.time() + 5
        while not hb.stacks_path().exists() and time.time() < deadline:
            time.sleep(0.05)
        text = hb.stacks_path().read_text()
        assert "stuck_in_collective" in text and "stuck-worker" in text
        # SIGUSR2 -> faulthandler dump (C level) to the .sigusr2 file
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
        sig_text = (paths.stacks / "rank-00000.sigusr2.txt").read_text()
        assert "stuck_in_collective" in sig_text
    finally:
        blocker.set()
        worker.join()
        hb.stop(None)
        import faulthandler

        faulthandler.unregister(signal.SIGUSR2)


def test_control_flags(tmp_path):
    paths = RunPaths.of(tmp_path)
    old = signal.getsignal(signal.SIGUSR1)
    try:
        c = Controls(paths, rank=0, job_start_time=time.time() - 120, exit_duration_minutes=3,
                     checkpoint_interval_hours=1 / 3600, pre_timeout_signal="USR1")
        c.last_checkpoint_time = time.time()
        assert c.local_flags() == [0, 0, 0]
        assert not c.agree().stop  # without torch.distributed: the local flags
        time.sleep(1.05)
        assert c.checkpoint_due()
        assert not Controls(paths, 1, time.time(), None, 1 / 3600, None).checkpoint_due()  # only rank 0's clock
        assert c.time_budget_reached(now=c.job_start_time + 180)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert c.signal_received == "SIGUSR1" and c.time_budget_reached()
        publish_request(paths, OperatorRequest(KILL_REQUEST, "alice", 1001, "bad loss", False, time.time()))
        decision = c.agree()
        assert decision.kill and decision.time_budget and decision.checkpoint_due
        assert "alice" in c.describe_stop(decision)
    finally:
        signal.signal(signal.SIGUSR1, old)
        control._signal_received.clear()


def test_heartbeat_reports_the_longest_checkpoint_and_eval(tmp_path):
    """The controller learns per-phase timeouts from a beat's durations, even when a whole save falls
    between two of its passes."""
    import time as _time

    from orchestrator.contract import Phase, RunPaths
    from orchestrator.contract.client.beat import HeartbeatWriter

    hb = HeartbeatWriter(RunPaths.of(tmp_path), rank=0, world_size=1, job_id="t", interval_seconds=60)
    for pause in (0.05, 0.15, 0.02):
        hb.set_phase(Phase.CHECKPOINT, 1)
        _time.sleep(pause)
        hb.set_phase(Phase.STEP, 1)
    durations = hb.snapshot().durations
    print("reported durations:", durations)
    assert 0.15 <= durations["checkpoint"] < 1.0
    assert "step" not in durations and durations["init"] >= 0.0
