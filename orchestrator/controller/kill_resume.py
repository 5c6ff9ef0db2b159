"""Operator requests policy: kill (graceful or --now), resume and nodes-clear, as actions.

The requests arrive authenticated (requests.py: the file's owner is checked against the
operators, and audited, before anything here sees it). Rules:
- kill: queued jobs are cancelled at once; the request is published to accepted/ so the trainer
  saves and exits 17 at its next step (all ranks agree on the step); `--now` cancels the running
  job too. The run is KILLED once no job of it is left running. A kill on a stopped run is noted
  and changes nothing.
- a kill withdrawn (the operator's file removed) before the trainer acted: back to supervising.
- resume: only a stopped run (killed, crash loop, config error) resumes; a finished one does not.
  The crash-loop counter is forgiven and a job is submitted if none is queued.
- nodes-clear: the named nodes (or all) leave the exclude list, whatever the run's status; the
  queued jobs get the new list at once (applier), later submissions and restarts use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.contract import KILL_REQUEST, NODES_CLEAR_REQUEST, RESUME_REQUEST, OperatorRequest
from orchestrator.contract import events as ev
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, RunStatus

from .actions import (
    Action,
    Cancel,
    ChangeState,
    ClearExclusions,
    PublishRequest,
    Record,
    SetStatus,
    Stop,
    Submit,
    WithdrawRequest,
)


@dataclass(frozen=True)
class RequestsVerdict:
    actions: list[Action]
    end_pass: bool  # the rest of the pass must wait for the next one


def on_requests(
    state: ControllerState,
    requests: dict[str, OperatorRequest],
    *,
    running_job_id: str | None,
    queued_job_ids: list[str],
    unsettled_job_ids: list[str],
) -> RequestsVerdict:
    kill = requests.get(KILL_REQUEST)
    resume = requests.get(RESUME_REQUEST)
    actions: list[Action] = clear_exclusions(requests.get(NODES_CLEAR_REQUEST))
    if resume is not None and kill is None:
        actions.append(WithdrawRequest(RESUME_REQUEST, consumed=True))
        if state.status == RunStatus.FINISHED:
            actions.append(
                Record(
                    ev.ResumeIgnored(
                        by=resume.user, reason=resume.reason, why="the run has finished training"
                    )
                )
            )
            return RequestsVerdict(actions, False)
        if state.status.stopped:
            actions += [
                Record(ev.Resumed(by=resume.user, reason=resume.reason, previous=state.status.value)),
                WithdrawRequest(KILL_REQUEST),
                SetStatus(RunStatus.WAITING),
                ChangeState(restarts_without_progress=0),
            ]
            if running_job_id is None and not queued_job_ids:
                actions.append(Submit("resume"))
            return RequestsVerdict(actions, True)
        actions.append(
            Record(
                ev.ResumeIgnored(
                    by=resume.user, reason=resume.reason, why=f"the run is {state.status.value}, not stopped"
                )
            )
        )
        return RequestsVerdict(actions, False)
    if kill is None:
        if state.status == RunStatus.KILLING:
            actions += [
                Record(ev.KillWithdrawn()),
                WithdrawRequest(KILL_REQUEST),
                SetStatus(RunStatus.RUNNING if running_job_id else RunStatus.WAITING),
            ]
        return RequestsVerdict(actions, False)
    if state.status.stopped:
        return RequestsVerdict(actions, False)  # already stopped: the audit trail has the request
    now = kill.now
    if state.status != RunStatus.KILLING:
        actions += [
            Record(ev.KillRequested(by=kill.user, reason=kill.reason, now=now)),
            SetStatus(RunStatus.KILLING),
            PublishRequest(kill),
        ]
        if queued_job_ids:
            actions.append(Cancel(tuple(queued_job_ids), "cancelled (kill switch)"))
        if now and running_job_id is not None:
            actions.append(Cancel((running_job_id,), "killed (kill --now)"))
            running_job_id = None
    if running_job_id is None and not unsettled_job_ids:
        actions.append(
            Stop(
                RunStatus.KILLED,
                Notice.KILL,
                f"run stopped by the kill switch: {kill.reason}",
                by=kill.user,
            )
        )
        return RequestsVerdict(actions, True)
    return RequestsVerdict(actions, False)


def clear_exclusions(request: OperatorRequest | None) -> list[Action]:
    """An authenticated nodes-clear (requests.py refused one that names no valid node)."""
    if request is None:
        return []
    nodes = None if request.all_nodes else tuple(request.nodes)
    return [ClearExclusions(nodes, by=request.user, reason=request.reason)]
