"""Training-health policy: from the findings on metrics.jsonl, and the operators' rollback
requests, to actions. Pure: the supervisor gathers the inputs (metrics_follower.py, the
checkpoints' trainer_state.json) and the applier carries the actions out.

Per finding (orchestrator/contract/training_health.py), the config's policy `health.policy.<kind>`:
- notify: a `health_finding` event and a "health" notification, nothing else;
- pause: the same, then a graceful stop through the kill switch's own path: accepted/kill is
  published, so the trainer saves and exits 17 at its next step (nothing new is obeyed), queued
  jobs are cancelled, the run is PAUSING, then PAUSED (`paused_for_health`) once no job runs:
  stopped until `runctl resume` (or `runctl rollback`);
- rollback: the same stop (ROLLING_BACK) for a directive made by the planner
  (training_health.plan_rollback: the checkpoint before the onset, the exact samples to skip, the
  LR cut); once no job runs, the directive is written to accepted/rollback, accepted/kill is
  withdrawn and a job submitted (`rollback_started`, `job_submitted`); when rank 0 of a later job
  says it applied it, `rollback_applied`. When the planner says no (the budget of automatic
  rollbacks in its window is spent, or no verified checkpoint is early enough): `rollback_refused`,
  a notification, and a pause: a person decides.
Several findings in one pass are each recorded and notified; the strongest policy acts (rollback
over pause over notify), a rollback for the earliest onset among the findings that ask for one.
Findings are acted on only while the run is supervised as usual (not stopping, not stopped).

Operators: `runctl rollback` (control/rollback, authenticated and audited by requests.py) leads to
the same stop and continuation, by that operator, outside the budget of automatic rollbacks. It is
refused on a finished run and while a kill is pending; on a stopped run (killed, paused, crash
loop, config error) it goes on at once; during a pause or another rollback, it takes over.
A kill that takes over while a rollback waits for its job to stop abandons the rollback
(`rollback_refused`, nothing written).

What is judged after a rollback (`to_judge`): the stopped job kept training and writing metrics
until it saw the stop; those steps are the abandoned history, read when polling resumes, maybe
before the new job wrote anything. They are never judged: after a rollback to step S the new
history begins with a step <= S + 1, and the steps above it read before that are passed over.
"""

from __future__ import annotations

import math

from orchestrator.contract import (
    KILL_REQUEST,
    ROLLBACK_REQUEST,
    Heartbeat,
    OperatorRequest,
    Rollback,
    StepMetrics,
)
from orchestrator.contract import health_events as hev
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, RunStatus
from orchestrator.contract.training_health import (
    RollbackCandidate,
    TrainingFinding,
    TrendJudgement,
    plan_rollback,
    policy_for,
)

from .actions import (
    Action,
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
    alert,
)
from .pass_view import Jobs, RunView

POLICY_ORDER = ("notify", "pause", "rollback")
CONTROLLER = "controller (training health)"


MAX_ROLLBACK_TIMES = 1000  # the times of the last automatic rollbacks: the largest budget (HealthConfig)


def on_findings(view: RunView, findings: list[TrainingFinding], **inputs) -> list[Action]:
    """`inputs`: see _on_findings. The notifications come last: a slow chat server must not delay
    the stop (the trainer keeps training meanwhile)."""
    return _notifications_last(
        _on_findings(view.state, findings, view.cfg.health, jobs=view.jobs, wall_now=view.wall, **inputs)
    )


def _notifications_last(actions: list[Action]) -> list[Action]:
    return [a for a in actions if not isinstance(a, Notify)] + [a for a in actions if isinstance(a, Notify)]


def _trend_fields(judged: TrendJudgement | None) -> dict[str, float | None]:
    """The trend, spread, margin and distance of a trend rule's finding, as the event's fields."""
    if judged is None:
        return {}
    return {
        "trend": judged.trend,
        "trend_slope": judged.slope,
        "residual_spread": judged.spread,
        "margin": judged.margin,
        "spreads": judged.spreads if math.isfinite(judged.spreads) else None,
    }


def _on_findings(
    state: ControllerState,
    findings: list[TrainingFinding],
    health,
    *,
    history,
    checkpoints: list[RollbackCandidate],
    jobs: Jobs,
    wall_now: float,
    directive_id: str,
    owner_uid: int,
) -> list[Action]:
    """`history`: the lineage's recent StepMetrics; `checkpoints`: the rollback candidates (only
    needed when a finding's policy is rollback)."""
    actions: list[Action] = []
    policies = [policy_for(f, health) for f in findings]
    for finding, policy in zip(findings, policies, strict=True):
        actions += [
            *alert(
                hev.HealthFinding(
                    finding=finding.kind,
                    onset_step=finding.onset_step,
                    met_step=finding.step,
                    measured=finding.value,
                    baseline=finding.baseline,
                    limit=finding.threshold,
                    message=finding.message,
                    policy=policy,
                    numbers=dict(finding.details),
                    **_trend_fields(finding.judged),
                ),
                Notice.HEALTH,
            ),
        ]
    if not findings or not state.status.active:
        return actions
    strongest = max(policies, key=POLICY_ORDER.index)
    if strongest == "notify":
        return actions

    acting = [f for f, p in zip(findings, policies, strict=True) if p == strongest]
    why = "; ".join(f.message for f in acting)
    if strongest == "rollback":
        onset = min(f.onset_step for f in acting)
        plan = plan_rollback(onset, checkpoints, history, health, state.rollback_times, wall_now)
        if plan.decision == "rollback":
            directive = plan.directive(directive_id, CONTROLLER, wall_now)
            return [
                *actions,
                *_rollback(directive, jobs, True, owner_uid, wall_now, plan.rollbacks_in_window),
                ChangeState(rollback_times=[*state.rollback_times, wall_now][-MAX_ROLLBACK_TIMES:]),
            ]
        actions.append(
            Record(
                hev.RollbackRefused(
                    why=plan.reason, by=CONTROLLER, rollbacks_in_window=plan.rollbacks_in_window
                )
            )
        )
        why = f"{why}; no automatic rollback: {plan.reason}"
    pause = hev.HealthPauseRequested(why=why[:2000], job_id=jobs.running)
    # A pause the rules chose is said by its findings; one instead of a refused rollback is news.
    said = alert(pause, Notice.HEALTH) if strongest == "rollback" else [Record(pause)]
    return [
        *actions,
        *said,
        *_stop(RunStatus.PAUSING, jobs, CONTROLLER, owner_uid, f"training health: {why}"[:500], wall_now),
    ]


def on_rollback_request(
    state: ControllerState,
    request: OperatorRequest,
    *,
    kill_pending: bool,
    jobs: Jobs,
    wall_now: float,
    directive_id: str,
) -> list[Action]:
    """An operator's authenticated `runctl rollback` (its ask already checked by the intake)."""
    consumed: list[Action] = [Consume(ROLLBACK_REQUEST)]
    if request.rollback is None:  # the intake refuses these; never guessed at
        return consumed
    if state.status == RunStatus.FINISHED:
        return [Record(hev.RollbackRefused(why="the run has finished training", by=request.user)), *consumed]
    if kill_pending or state.status == RunStatus.KILLING:
        why = (
            "a kill request is pending (control/kill): `runctl rollback` withdraws it; or `runctl resume` "
            "first, then roll back"
        )
        return [Record(hev.RollbackRefused(why=why, by=request.user)), *consumed]
    directive = request.rollback.directive(directive_id, request.reason, request.user, wall_now)
    status = state.status
    if status == RunStatus.ROLLING_BACK:  # the job is stopping already: this directive replaces the other
        return [
            Record(_planned(directive, False, jobs.running)),
            ChangeState(pending_rollback=directive),
            *consumed,
        ]
    if status == RunStatus.PAUSING:
        return [
            Record(_planned(directive, False, jobs.running)),
            ChangeState(pending_rollback=directive),
            SetStatus(RunStatus.ROLLING_BACK),
            *consumed,
        ]
    if status.stopped:  # nothing runs, nothing is queued: settle() goes on in this pass
        return [
            Record(_planned(directive, False, None)),
            ChangeState(pending_rollback=directive),
            SetStatus(RunStatus.ROLLING_BACK),
            *consumed,
        ]
    return _notifications_last([*_rollback(directive, jobs, False, request.uid, wall_now, 0), *consumed])


def settle(state: ControllerState, jobs: Jobs) -> list[Action]:
    """Every pass: a pause or a rollback whose job is gone goes on; a rollback overtaken by
    something else is abandoned."""
    if state.status == RunStatus.PAUSING and not jobs.any_left:
        return [
            Stop(
                RunStatus.PAUSED,
                Notice.STOPPED,
                "run paused for training health (the trainer saved a checkpoint): read `runctl health`, "
                "then `runctl resume` or `runctl rollback`",
            )
        ]
    pending = Rollback.from_dict(state.pending_rollback) if state.pending_rollback is not None else None
    if state.status == RunStatus.ROLLING_BACK and not jobs.any_left:
        if pending is None:  # cannot happen through this module; a person decides rather than a guess
            return [Stop(RunStatus.PAUSED, Notice.STOPPED, "rolling back without a directive: paused")]
        return [
            PublishDirective(pending),
            WithdrawRequest(KILL_REQUEST),
            ChangeState(
                pending_rollback=None,
                rollback_awaited=pending.id,
                new_history_by_step=pending.to_step + 1,
                restarts_without_progress=0,
            ),
            Record(hev.RollbackStarted(directive_id=pending.id, to_step=pending.to_step)),
            SetStatus(RunStatus.WAITING),
            Submit(f"rollback {pending.id}"),
        ]
    if pending is not None and state.status != RunStatus.ROLLING_BACK:
        why = f"abandoned: the run is {state.status.value} (it took over before the job stopped); nothing written"
        return [
            Record(hev.RollbackRefused(why=why, by=pending.requested_by)),
            ChangeState(pending_rollback=None),
        ]
    return []


def to_judge(
    new: list[StepMetrics], new_history_by_step: int | None
) -> tuple[list[StepMetrics], list[Action]]:
    """(the steps read this pass that are to be judged, actions): all of them, unless a rollback's
    new history has not begun yet (see the module docstring)."""
    if new_history_by_step is None:
        return new, []
    begins = next((i for i, r in enumerate(new) if r.step <= new_history_by_step), None)
    if begins is None:
        return [], []
    return new[begins:], [ChangeState(new_history_by_step=None)]


def rollback_applied(state: ControllerState, job_id: str, beat: Heartbeat | None) -> list[Action]:
    """Rank 0's beat says it applied the awaited directive: where it resumed from."""
    awaited = state.rollback_awaited
    if awaited is None or beat is None or beat.rollback_applied != awaited:
        return []
    return [
        Record(hev.RollbackApplied(directive_id=awaited, job_id=job_id, resumed_from=beat.resumed_from)),
        ChangeState(rollback_awaited=None),
    ]


def _planned(
    directive: Rollback, automatic: bool, job_id: str | None, in_window: int = 0
) -> hev.RollbackPlanned:
    return hev.RollbackPlanned(
        directive_id=directive.id,
        to_step=directive.to_step,
        skip_samples=[list(r) for r in directive.skip_samples],
        lr_scale=directive.lr_scale,
        lr_scale_steps=directive.lr_scale_steps,
        reason=directive.reason,
        by=directive.requested_by,
        automatic=automatic,
        rollbacks_in_window=in_window,
        job_id=job_id,
    )


def _rollback(
    directive: Rollback, jobs: Jobs, automatic: bool, uid: int, wall_now: float, in_window: int
) -> list[Action]:
    return [
        *alert(_planned(directive, automatic, jobs.running, in_window), Notice.HEALTH),
        ChangeState(pending_rollback=directive),
        *_stop(
            RunStatus.ROLLING_BACK,
            jobs,
            directive.requested_by,
            uid,
            f"rollback: {directive.reason}"[:500],
            wall_now,
        ),
    ]


def _stop(status: RunStatus, jobs: Jobs, user: str, uid: int, reason: str, wall_now: float) -> list[Action]:
    """The kill switch's graceful stop, for a pause or a rollback: the trainer saves and exits 17."""
    request = OperatorRequest(name=KILL_REQUEST, user=user, uid=uid, reason=reason, now=False, time=wall_now)
    actions: list[Action] = [SetStatus(status), PublishRequest(request)]
    if jobs.queued:
        actions.append(Cancel(jobs.queued, f"cancelled ({status.value})"))
    return actions
