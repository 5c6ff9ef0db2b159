"""Operator requests policy: kill (graceful or --now) and resume, as actions.

The requests arrive authenticated (requests.py: the file's owner is checked against the
operators, and audited, before anything here sees it). Rules:
- kill: queued jobs are cancelled at once; the request is published to accepted/ so the trainer
  saves and exits 17 at its next step (all ranks agree on the step); `--now` cancels the running
  job too. The run is KILLED once no job of it is left running. A kill on a stopped run is noted
  and changes nothing.
- a kill withdrawn (the operator's file removed) before the trainer acted: back to supervising.
- resume: only a stopped run (killed, crash loop, config error) resumes; a finished one does not.
  The crash-loop counter is forgiven and a job is submitted if none is queued.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.protocol import KILL_REQUEST, RESUME_REQUEST

from .actions import (
    Action,
    Cancel,
    PublishRequest,
    Record,
    ResetProgressCounter,
    SetStatus,
    Stop,
    Submit,
    WithdrawRequest,
)
from .state import ControllerState, RunStatus


@dataclass(frozen=True)
class RequestsVerdict:
    actions: list[Action]
    end_pass: bool  # the rest of the pass must wait for the next one


def _who(request: Any) -> dict[str, Any]:
    return {"by": getattr(request, "user", None), "reason": getattr(request, "reason", None)}


def on_requests(
    state: ControllerState,
    requests: dict[str, Any],
    *,
    running_job_id: str | None,
    queued_job_ids: list[str],
    unsettled_job_ids: list[str],
) -> RequestsVerdict:
    kill = requests.get(KILL_REQUEST)
    resume = requests.get(RESUME_REQUEST)
    actions: list[Action] = []
    if resume is not None and kill is None:
        actions.append(WithdrawRequest(RESUME_REQUEST, consumed=True))
        if state.status == RunStatus.FINISHED:
            actions.append(Record("resume_ignored", {**_who(resume), "why": "the run has finished training"}))
            return RequestsVerdict(actions, False)
        if state.status.stopped:
            actions += [
                Record("resumed", {**_who(resume), "previous": state.status.value}),
                WithdrawRequest(KILL_REQUEST),
                SetStatus(RunStatus.WAITING),
                ResetProgressCounter(),
            ]
            if running_job_id is None and not queued_job_ids:
                actions.append(Submit("resume"))
            return RequestsVerdict(actions, True)
        actions.append(
            Record("resume_ignored", {**_who(resume), "why": f"the run is {state.status.value}, not stopped"})
        )
        return RequestsVerdict(actions, False)
    if kill is None:
        if state.status == RunStatus.KILLING:
            actions += [
                Record("kill_withdrawn", {}),
                WithdrawRequest(KILL_REQUEST),
                SetStatus(RunStatus.RUNNING if running_job_id else RunStatus.WAITING),
            ]
        return RequestsVerdict(actions, False)
    if state.status.stopped:
        return RequestsVerdict(actions, False)  # already stopped: the audit trail has the request
    now = bool(getattr(kill, "now", False))
    if state.status != RunStatus.KILLING:
        actions += [
            Record("kill_requested", {**_who(kill), "now": now}),
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
                "kill",
                f"run stopped by the kill switch: {getattr(kill, 'reason', '')}",
                {"by": getattr(kill, "user", None)},
            )
        )
        return RequestsVerdict(actions, True)
    return RequestsVerdict(actions, False)
