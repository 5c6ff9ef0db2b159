"""Launches inside a job with spares, as the controller decides about them (pure).

The job's launcher (orchestrator/slurm/launcher) records its launches in jobs/<id>/allocation.json; the
controller reads it for the running job and:
- relays the nodes that failed the health check before launch: an event, a notification, and the
  exclude list (so later jobs avoid them; the cap per incident applies);
- when a launch failed and the launcher waits for a decision, decides as on a job end
  (policy.on_launch_failed, then recovery), which may be a relaunch on a spare (`Relaunch`) or a
  job-level restart; the kill switch wins (never relaunch while a kill is in progress).
"""

from __future__ import annotations

from orchestrator.contract import Allocation, Heartbeat
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import RESPONSES, Cause
from orchestrator.contract.rank_output import RankError
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, JobRecord, RunStatus

from .actions import Action, Cancel, ChangeState, Exclude, Stop, alert
from .detection import culprit_nodes
from .policy import on_launch_failed
from .recovery import Incident


def relay_unhealthy(
    state: ControllerState, job: JobRecord, allocation: Allocation | None, cap: int
) -> list[Action]:
    if allocation is None or not allocation.unhealthy:
        return []
    seen = set(state.unhealthy_relayed)
    new = {n: why for n, why in allocation.unhealthy.items() if f"{job.job_id}:{n}" not in seen}
    if not new:
        return []
    nodes, why_not = culprit_nodes(sorted(new), cap)
    actions: list[Action] = [
        ChangeState(unhealthy_relayed=[*state.unhealthy_relayed, *(f"{job.job_id}:{n}" for n in new)]),
        *alert(
            fev.NodesUnhealthy(job_id=job.job_id, nodes=new, excluded=nodes, why_not=why_not),
            RESPONSES[Cause.UNHEALTHY].notice,
        ),
    ]
    if nodes:
        actions.append(
            Exclude(tuple(nodes), "failed the health check before launch", job.job_id, Cause.UNHEALTHY)
        )
    return actions


def launch_failed(
    state: ControllerState,
    job: JobRecord,
    allocation: Allocation,
    beats: list[Heartbeat],
    *,
    wall_now: float,
    silent_for: float,
    rank_error: RankError | None = None,
) -> tuple[list[Action], Incident | None]:
    """A launch failed and its launcher waits. `silent_for`: how long (controller clock) the
    launch's ranks have not beaten: the failure time, without a node's clock."""
    if state.status == RunStatus.KILLING:  # the kill switch wins: never relaunch
        return [
            Cancel((job.job_id,), "killed (a launch failed while saving)"),
            Stop(
                RunStatus.KILLED, Notice.KILL, "run stopped by the kill switch (a launch failed while saving)"
            ),
        ], None
    if state.status.stopping:  # a health pause or rollback: never relaunch; health_policy.settle goes on
        return [Cancel((job.job_id,), f"stopped ({state.status.value}; a launch failed while saving)")], None
    steps = [b.step for b in beats if b.job_id == job.job_id and b.launch == allocation.launch]
    return on_launch_failed(
        job,
        allocation,
        last_step=max(steps) if steps else None,
        wall_now=wall_now,
        failure_time=wall_now - silent_for,
        rank_error=rank_error,
    )
