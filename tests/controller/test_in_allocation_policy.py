"""Where a failure is recovered (recovery.plan_restart with the job's launcher record) and how the
in-allocation contract's files are read (orchestrator/allocation.py), as plain data."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from orchestrator.contract import Allocation, ContractError, Decision, read_allocation, write_allocation
from orchestrator.contract.state import ControllerState
from orchestrator.controller.actions import Cancel, Exclude, Record, Relaunch, RestartRun, Stop
from orchestrator.controller.recovery import Incident, plan_restart

WATCHDOG = SimpleNamespace(max_restarts_without_progress=3, max_excluded_per_incident=2, crash_loop_training_minutes=30)


def waiting(spares: list[str], state: str = "waiting_decision") -> Allocation:
    return Allocation("77", state, 0, ["node01", "node02"], spares, waits_for_decisions=True)


def failure(culprits=("node02",), running=True) -> Incident:
    return Incident("77", "launch_failed", 1000.0, 9, tuple(culprits), job_running=running)


def kinds(actions) -> list[str]:
    return [type(a).__name__ for a in actions]


def test_a_spare_left_means_relaunch_inside_the_job_without_cancelling_it():
    actions = plan_restart(ControllerState(), WATCHDOG, failure(), None, [], [], waiting(["node03"]))
    assert kinds(actions) == ["Exclude", "Relaunch"]
    relaunch = actions[1]
    assert isinstance(relaunch, Relaunch) and relaunch.leave_out == ("node02",) and relaunch.spares_left == 0
    assert relaunch.launch == 0 and relaunch.failed_job_id == "77"
    assert isinstance(actions[0], Exclude) and actions[0].nodes == ("node02",)


def test_no_culprit_relaunches_on_the_same_nodes():
    actions = plan_restart(ControllerState(), WATCHDOG, failure(culprits=()), None, [], [], waiting([]))
    assert kinds(actions) == ["Relaunch"] and actions[0].leave_out == ()


def test_no_spare_left_cancels_the_job_and_restarts_at_job_level_saying_why():
    actions = plan_restart(ControllerState(), WATCHDOG, failure(), None, [], [], waiting([]))
    assert kinds(actions) == ["Exclude", "Record", "Cancel", "RestartRun"]
    assert isinstance(actions[1], Record) and "0 spare(s) left" in actions[1].event.why
    assert isinstance(actions[2], Cancel) and actions[2].job_ids == ("77",)
    assert type(actions[3]) is RestartRun


def test_a_job_without_a_launcher_or_already_ended_takes_the_job_level_path():
    no_launcher = plan_restart(ControllerState(), WATCHDOG, failure(), None, [], [], None)
    assert kinds(no_launcher) == ["Exclude", "Cancel", "RestartRun"]
    # Every job runs the launcher; one without spares never waits for a decision: job level.
    no_spares = Allocation("77", "running", 0, ["node01", "node02"], [], waits_for_decisions=False)
    assert kinds(plan_restart(ControllerState(), WATCHDOG, failure(), None, [], [], no_spares)) == kinds(no_launcher)
    ended = plan_restart(ControllerState(), WATCHDOG, failure(running=False), None, [], [], waiting(["node03"], "ended"))
    assert kinds(ended) == ["Exclude", "Record", "RestartRun"]  # nothing to cancel


def test_a_crash_loop_stops_even_with_spares():
    state = ControllerState(restarts_without_progress=3, checkpoint_step_at_last_restart=0)
    actions = plan_restart(state, WATCHDOG, failure(), None, [], [], waiting(["node03"]))
    assert kinds(actions) == ["Cancel", "Stop"] and isinstance(actions[1], Stop)


def test_only_early_or_same_step_failures_count_towards_a_crash_loop():
    """Two restarts from the checkpoint of step 0 already; the job after the second trained from
    wall time 0 (training_since; None: it never trained) and failed `trained` seconds later at step `step` (the failure before
    reached step 9)."""

    def third(trained: float, step: int, training_since: float | None = 0.0) -> list[str]:
        state = ControllerState(restarts_without_progress=3, checkpoint_step_at_last_restart=0,
                                training_since=training_since, last_failure_step=9)
        late = Incident("77", "dead_rank", (training_since or 0.0) + trained, step, ("node02",), job_running=False)
        return kinds(plan_restart(state, WATCHDOG, late, None, [], [], None))

    assert third(trained=29 * 60, step=40) == ["Stop"]  # failed early: a crash loop
    assert third(trained=31 * 60, step=9) == ["Stop"]  # later, but at the step of the last failure
    assert third(trained=31 * 60, step=40, training_since=None) == ["Stop"]  # never trained
    restarted = plan_restart(
        ControllerState(restarts_without_progress=3, checkpoint_step_at_last_restart=0, training_since=0.0,
                        last_failure_step=9),
        WATCHDOG, Incident("77", "dead_rank", 31 * 60, 40, ("node02",), job_running=False), None, [], [], None)
    assert kinds(restarted) == ["Exclude", "RestartRun"]  # a fault like any other: the count starts again
    assert restarted[1].restarts_without_progress == 1


def test_contract_refuses_hostile_or_malformed_records(tmp_path):
    good = waiting(["node03"])
    path = tmp_path / "allocation.json"
    write_allocation(path, good)
    assert read_allocation(path) == good
    for field, value in [("nodes", ["node01;reboot"]), ("state", "rm -rf"), ("job_id", "../../x"),
                         ("launch", -1), ("spares", "node03"),
                         ("ended", {"launch": 0, "exit_code": "1", "srun_exit_code": 1})]:
        data = {**good.to_dict(), field: value}
        path.write_text(json.dumps(data))
        with pytest.raises(ContractError):
            read_allocation(path)
    path.unlink()
    os.symlink(tmp_path / "elsewhere.json", path)
    with pytest.raises(ContractError, match="symbolic link"):
        read_allocation(path)
    with pytest.raises(ContractError):
        Decision.from_dict({"version": 1, "launch": 0, "action": "shell", "leave_out": []})
