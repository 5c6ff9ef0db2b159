"""orchestrator/controller/health_policy.py: from findings and operators' rollback requests to
actions, on plain data. Every expected directive is worked out by hand in the comments (which
checkpoint, which sample range), from the rules of the issue, not from the planner's code."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from orchestrator.contract import (
    KILL_REQUEST,
    ROLLBACK_REQUEST,
    Heartbeat,
    OperatorRequest,
    Rollback,
    RollbackAsk,
    StepMetrics,
)
from orchestrator.contract import health_events as hev
from orchestrator.contract.state import ControllerState, RunStatus
from orchestrator.contract.training_health import RollbackCandidate, TrainingFinding
from orchestrator.controller import health_policy as hp
from orchestrator.controller.actions import (
    Cancel,
    ChangeState,
    Consume,
    Notify,
    PublishDirective,
    PublishRequest,
    Record,
    SetStatus,
    Stop,
    Submit,
    WithdrawRequest,
)
from orchestrator.controller.pass_view import Jobs
from orchestrator.plan.config.schema import HealthConfig
from tests.pass_views import run_view

NOW = 1_000_000.0
GBS = 8
# Steps 1..40 of a history, consumed_samples = 8 x step; checkpoints every 10 steps.
HISTORY = [StepMetrics(step=s, time=float(s), loss=3.0, consumed_samples=GBS * s, global_batch=GBS) for s in range(1, 41)]
CKPTS = [RollbackCandidate(s, GBS * s, True) for s in (10, 20, 30)]
RUNNING = Jobs(running="101", queued=("102",))


def finding(kind="loss_spike", onset=25, met=27) -> TrainingFinding:
    return TrainingFinding(kind, onset, met, 9.0, 3.0, 3.1, f"{kind}: onset {onset}")


def health(**policy) -> HealthConfig:
    return HealthConfig(policy=policy, rollback_margin_steps=3, rollback_skip_margin_batches=2, rollback_budget=2)


def running_state(**changes) -> ControllerState:
    return replace(ControllerState(status=RunStatus.RUNNING), **changes)


def decide(state, findings, cfg, jobs=RUNNING):
    view = run_view(state, jobs=jobs, wall=NOW, cfg=SimpleNamespace(health=cfg))
    return hp.on_findings(view, findings, history=HISTORY, checkpoints=CKPTS, directive_id="rb-t1", owner_uid=1234)


def recorded(actions, kind):
    return [a.event for a in actions if isinstance(a, Record) and isinstance(a.event, kind)]


def stop_request(actions) -> OperatorRequest:
    [publish] = [a for a in actions if isinstance(a, PublishRequest)]
    assert publish.request.name == KILL_REQUEST and not publish.request.now
    return publish.request



def counted_rollbacks(actions) -> list[list[float]]:
    """What the actions set the rollback budget's times to."""
    return [a.rollback_times for a in actions if isinstance(a, ChangeState) and "rollback_times" in a.changes()]


def pending_rollbacks(actions) -> list[Rollback]:
    """The directives the actions leave pending (None: cleared, not counted)."""
    return [a.pending_rollback for a in actions if isinstance(a, ChangeState) and a.changes().get("pending_rollback")]

def test_notify_records_and_notifies_and_does_nothing_else():
    actions = decide(running_state(), [finding()], health())
    [event] = recorded(actions, hev.HealthFinding)
    assert (event.finding, event.onset_step, event.met_step, event.policy) == ("loss_spike", 25, 27, "notify")
    assert (event.measured, event.baseline, event.limit) == (9.0, 3.0, 3.1)
    assert [type(a) for a in actions] == [Record, Notify]
    assert actions[1].kind == "health" and "onset 25" in actions[1].message


def test_pause_stops_through_the_kill_path_and_settles_once_the_job_is_gone():
    actions = decide(running_state(), [finding()], health(loss_spike="pause"))
    assert SetStatus(RunStatus.PAUSING) in actions and Cancel(("102",), "cancelled (pausing)") in actions
    assert stop_request(actions).user == hp.CONTROLLER and stop_request(actions).uid == 1234
    assert recorded(actions, hev.HealthPauseRequested)[0].job_id == "101"
    pausing = ControllerState(status=RunStatus.PAUSING)
    assert hp.settle(pausing, Jobs(running="101")) == []  # still saving
    assert hp.settle(pausing, Jobs(unsettled=("101",))) == []  # its end not handled yet
    [stop] = hp.settle(pausing, Jobs())
    assert isinstance(stop, Stop) and stop.status == RunStatus.PAUSED and stop.notify_kind == "stopped"  # a page: a person looks


def test_rollback_goes_back_before_the_onset_and_skips_to_the_onset_plus_margin():
    actions = decide(running_state(), [finding(onset=25)], health(loss_spike="rollback"))
    # Onset 25, margin 3 steps: the newest checkpoint at or before 25 - 1 - 3 = 21 is step 20
    # (consumed 160). Skip from 160 to the onset's 25 x 8 = 200, plus 2 batches of 8: 216.
    [planned] = recorded(actions, hev.RollbackPlanned)
    assert (planned.to_step, planned.skip_samples, planned.automatic) == (20, [[160, 216]], True)
    assert planned.directive_id == "rb-t1" and planned.job_id == "101" and planned.rollbacks_in_window == 0
    assert SetStatus(RunStatus.ROLLING_BACK) in actions and ChangeState(rollback_times=[NOW]) in actions
    assert stop_request(actions).reason.startswith("rollback: ")
    # The stop before any notification: a slow chat server must not let the trainer run on.
    kinds = [type(a) for a in actions]
    assert kinds.index(PublishRequest) < kinds.index(Notify) and kinds[-2:] == [Notify, Notify]
    [pending] = pending_rollbacks(actions)
    assert (pending.to_step, pending.skip_samples, pending.requested_by) == (20, ((160, 216),), hp.CONTROLLER)
    # Nothing is written for the trainer while the job still runs; once it is gone, in this order:
    rolling = ControllerState(status=RunStatus.ROLLING_BACK, pending_rollback=pending.to_dict())
    assert hp.settle(rolling, Jobs(running="101")) == []
    after = hp.settle(rolling, Jobs())
    # the new history begins at step 20 + 1 at the latest; the crash-loop count is forgiven
    bookkeeping = ChangeState(
        pending_rollback=None, rollback_awaited="rb-t1", new_history_by_step=21, restarts_without_progress=0
    )
    assert after[:3] == [PublishDirective(pending), WithdrawRequest(KILL_REQUEST), bookkeeping]
    assert SetStatus(RunStatus.WAITING) in after
    assert after[-1] == Submit("rollback rb-t1") and recorded(after, hev.RollbackStarted)[0].to_step == 20


def test_the_strongest_policy_acts_for_the_earliest_onset_that_asks_for_it():
    cfg = health(loss_spike="rollback", grad_norm_explosion="pause", divergence="rollback")
    found = [finding("grad_norm_explosion", 12, 13), finding("loss_spike", 33, 35), finding("divergence", 31, 40)]
    actions = decide(running_state(), found, cfg)
    assert [e.policy for e in recorded(actions, hev.HealthFinding)] == ["pause", "rollback", "rollback"]
    # Rollback (over pause), for onset 31 (not 12, whose policy is pause): at or before 31 - 4 = 27 -> step 20;
    # skip [160, 31 x 8 + 16 = 264).
    [planned] = recorded(actions, hev.RollbackPlanned)
    assert (planned.to_step, planned.skip_samples) == (20, [[160, 264]])
    assert not recorded(actions, hev.HealthPauseRequested)


def test_budget_spent_refuses_notifies_and_pauses():
    # Two automatic rollbacks in the last 24 h (one 25 h ago does not count): the budget of 2 is spent.
    state = running_state(rollback_times=[NOW - 25 * 3600, NOW - 600, NOW - 60])
    actions = decide(state, [finding()], health(loss_spike="rollback"))
    [refused] = recorded(actions, hev.RollbackRefused)
    assert refused.rollbacks_in_window == 2 and "budget" in refused.why
    assert not recorded(actions, hev.RollbackPlanned) and not counted_rollbacks(actions)
    assert SetStatus(RunStatus.PAUSING) in actions and stop_request(actions)
    assert any(isinstance(a, Notify) and "no automatic rollback" in a.message for a in actions)


def test_no_checkpoint_early_enough_pauses_too():
    actions = decide(running_state(), [finding(onset=12)], health(loss_spike="rollback"))
    # 12 - 1 - 3 = 8: no checkpoint at or before step 8.
    assert "no verified checkpoint at or before step 8" in recorded(actions, hev.RollbackRefused)[0].why
    assert SetStatus(RunStatus.PAUSING) in actions


def test_findings_are_recorded_but_not_acted_on_while_stopping():
    for status in (RunStatus.KILLING, RunStatus.ROLLING_BACK, RunStatus.PAUSING):
        actions = decide(ControllerState(status=status), [finding()], health(loss_spike="rollback"))
        assert [type(a) for a in actions] == [Record, Notify], status


def operator(ask: RollbackAsk | None, user: str = "oncall") -> OperatorRequest:
    return OperatorRequest(name=ROLLBACK_REQUEST, user=user, uid=2001, reason="spike at 25", now=False, time=NOW,
                           rollback=ask)


ASK = RollbackAsk(to_step=20, skip_samples=((160, 216),), lr_scale=0.5, lr_scale_steps=10)


def by_operator(state, jobs=RUNNING, kill_pending=False, ask=ASK):
    return hp.on_rollback_request(state, operator(ask), kill_pending=kill_pending, jobs=jobs, wall_now=NOW,
                                  directive_id="rb-op")


def test_an_operators_rollback_of_a_running_run_stops_it_in_their_name_outside_the_budget():
    actions = by_operator(running_state())
    [planned] = recorded(actions, hev.RollbackPlanned)
    assert (planned.by, planned.automatic, planned.lr_scale, planned.lr_scale_steps) == ("oncall", False, 0.5, 10)
    assert stop_request(actions).user == "oncall" and stop_request(actions).uid == 2001
    assert not counted_rollbacks(actions) and Consume(ROLLBACK_REQUEST) in actions
    [pending] = pending_rollbacks(actions)
    assert pending == Rollback(id="rb-op", to_step=20, skip_samples=((160, 216),), lr_scale=0.5, lr_scale_steps=10,
                               reason="spike at 25", requested_by="oncall", requested_at=NOW)


def test_an_operators_rollback_of_a_stopped_run_goes_on_at_once():
    for status in (RunStatus.KILLED, RunStatus.PAUSED, RunStatus.CRASH_LOOP):
        actions = by_operator(ControllerState(status=status), jobs=Jobs())
        assert SetStatus(RunStatus.ROLLING_BACK) in actions and not any(isinstance(a, PublishRequest) for a in actions)
        state = ControllerState(status=status)
        state.move_to(RunStatus.ROLLING_BACK)  # the table allows it
        state.pending_rollback = pending_rollbacks(actions)[0].to_dict()
        assert hp.settle(state, Jobs())[-1] == Submit("rollback rb-op")


def test_an_operators_rollback_of_a_waiting_run_cancels_what_is_queued():
    actions = by_operator(ControllerState(status=RunStatus.WAITING), jobs=Jobs(queued=("102",)))
    assert SetStatus(RunStatus.ROLLING_BACK) in actions and Cancel(("102",), "cancelled (rolling_back)") in actions


def test_an_operators_rollback_is_refused_when_finished_or_a_kill_is_pending():
    finished = by_operator(ControllerState(status=RunStatus.FINISHED), jobs=Jobs())
    assert "finished" in recorded(finished, hev.RollbackRefused)[0].why and finished[-1] == Consume(ROLLBACK_REQUEST)
    pending = by_operator(running_state(), kill_pending=True)
    assert "kill request is pending" in recorded(pending, hev.RollbackRefused)[0].why
    assert not any(isinstance(a, PublishRequest) for a in finished + pending) and not pending_rollbacks(finished + pending)


def test_an_operators_rollback_takes_over_a_pause_or_another_rollback():
    over_pause = by_operator(ControllerState(status=RunStatus.PAUSING))
    assert SetStatus(RunStatus.ROLLING_BACK) in over_pause and not any(isinstance(a, PublishRequest) for a in over_pause)
    over_rollback = by_operator(ControllerState(status=RunStatus.ROLLING_BACK))
    assert [type(a) for a in over_rollback] == [Record, ChangeState, Consume] and pending_rollbacks(over_rollback)


def test_a_kill_during_a_rollback_abandons_it():
    pending = Rollback(id="rb-x", to_step=20, skip_samples=((160, 216),), requested_by="controller")
    for status in (RunStatus.KILLING, RunStatus.KILLED):
        actions = hp.settle(ControllerState(status=status, pending_rollback=pending.to_dict()), Jobs())
        assert "abandoned" in recorded(actions, hev.RollbackRefused)[0].why and actions[-1] == ChangeState(pending_rollback=None)
        assert not any(isinstance(a, (PublishDirective, Submit)) for a in actions)


def test_rollback_applied_is_said_once_rank_0_reports_it():
    state = ControllerState(status=RunStatus.RUNNING, rollback_awaited="rb-t1")
    beat = Heartbeat(rank=0, world_size=1, host="n1", job_id="103", pid=1, step=21, phase="step", beat_time=NOW,
                     progress_time=NOW, phase_started=NOW, resumed_from=20, rollback_applied="rb-t1")
    assert hp.rollback_applied(state, "103", replace(beat, rollback_applied=None)) == []
    actions = hp.rollback_applied(state, "103", beat)
    assert recorded(actions, hev.RollbackApplied)[0].resumed_from == 20 and actions[-1] == ChangeState(rollback_awaited=None)


def test_after_a_rollback_the_stopped_jobs_tail_is_never_judged():
    # Rollback to step 12 decided at step 16's metrics; the stopped job went on to step 30 before it
    # saw the stop. Its steps 17-30 come in first, then the new job's 13, 14, 15.
    tail, fresh = HISTORY[16:30], HISTORY[12:15]
    assert hp.to_judge(tail, 13) == ([], [])
    assert hp.to_judge(tail[-3:] + fresh, 13) == (fresh, [ChangeState(new_history_by_step=None)])
    assert hp.to_judge(fresh, None) == (fresh, [])


@pytest.mark.parametrize("status", list(RunStatus))
def test_every_status_is_either_active_stopping_or_stopped(status):
    assert [status.active, status.stopping, status.stopped].count(True) == 1
