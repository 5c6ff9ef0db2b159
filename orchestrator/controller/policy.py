"""Incident policy: from what one pass saw (an assessment of the running job, or a job that ended)
to actions. Pure: the supervisor gathers the inputs and applies the actions.

- A dead, missing or hung rank in the running job: record the failure, notify, ask for stacks,
  and hand over to recovery (relaunch inside the job on a spare, or cancel it and restart, or
  stop a crash loop).
- A launch that failed inside a job with spares (its launcher waits for a decision): the same,
  blaming the task srun reports as killed by a signal.
- At least half of the ranks dead at once (a filesystem stall freezes every heartbeat; a requeue
  leaves old beats): wait one more `dead_after` before acting, in case it clears by itself; then
  restart without blaming any node.
- While a kill is in progress, ranks that stop responding end the kill (cancel), never a restart;
  while a health pause or rollback stops the job, the same cancel, and health_policy.settle goes on.
- A job that ended: by its outcome (contract.classify_end): finished, killed and config error stop
  the run, time budget continues the chain, anything else is a failure (restart), blaming the task
  srun reports as killed by a signal, or every node of a NODE_FAIL. While a health pause or
  rollback stops the run, its end is only recorded (health_policy.settle goes on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.contract import (
    PURPOSEFUL_EXITS,
    Allocation,
    Heartbeat,
    JobState,
    LaunchEnd,
    Outcome,
    classify_end,
)
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import RESPONSES, Cause, failure_cause
from orchestrator.contract.rank_output import RankError
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, JobRecord, RunStatus

from .actions import Action, Cancel, DumpStacks, Record, Stop, alert
from .pass_view import JobView
from .recovery import Incident


@dataclass(frozen=True)
class RankFailureVerdict:
    """What to do about the findings of one pass: act now (`failure`), or wait (`waiting`)."""

    actions: list[Action]
    failure: Incident | None  # set when recovery should plan a restart


def on_findings(view: JobView, *, job_wide_for: float, culprit_nodes: list[str]) -> RankFailureVerdict:
    """The assessment's findings (dead, hung or job-wide) of the running job, judged. `job_wide_for`:
    seconds (controller clock) the stall has been job-wide, 0 on its first pass; `culprit_nodes`:
    the nodes blame.py holds responsible."""
    state, job, assessment = view.state, view.job, view.assessment
    wall_now, dead_after = view.wall, view.cfg.watchdog.dead_after_seconds
    if state.status == RunStatus.KILLING:
        return RankFailureVerdict(
            [
                Cancel((job.job_id,), "killed (ranks stopped responding while saving)"),
                Stop(
                    RunStatus.KILLED,
                    Notice.KILL,
                    "run stopped by the kill switch (ranks hung while saving: cancelled)",
                ),
            ],
            None,
        )
    if state.status.stopping:  # a health pause or rollback: health_policy.settle goes on once it is gone
        return RankFailureVerdict(
            [Cancel((job.job_id,), f"stopped ({state.status.value}; ranks stopped responding while saving)")],
            None,
        )
    dead, hung = assessment.dead, assessment.hung
    findings = dead or hung
    if assessment.job_wide and job_wide_for < dead_after:
        if job_wide_for == 0:
            return RankFailureVerdict(
                [
                    Record(
                        fev.JobWideStall(
                            job_id=job.job_id,
                            ranks_stalled=len(dead),
                            world_size=assessment.world_size,
                            waiting_seconds=dead_after,
                            why="most ranks stopped beating at once: a filesystem, network or job problem, "
                            "not N nodes; waiting before acting in case it clears",
                        )
                    )
                ],
                None,
            )
        return RankFailureVerdict([], None)
    if assessment.job_wide:
        cause = Cause.JOB_STALL
    elif dead:
        cause = dead[0].kind
    else:
        cause = Cause.HANG
    failure_time = wall_now - max(f.age_seconds for f in findings)
    sample = [f.as_dict() for f in findings[:16]]
    actions: list[Action] = [
        *alert(
            fev.Failure(
                job_id=job.job_id,
                cause=cause,
                failure_time=failure_time,
                detection_time=wall_now,
                last_step=assessment.max_step,
                ranks=sample,
                ranks_affected=len(findings),
                suspects=[f.as_dict() for f in assessment.suspects[:16]] if cause == Cause.HANG else [],
                suspects_why=(assessment.suspects_why or None) if cause == Cause.HANG else None,
            ),
            RESPONSES[cause].notice,
        ),
        DumpStacks(job.job_id),
    ]
    # The job still runs: recovery cancels it, or relaunches inside it when it has spares.
    failure = Incident(
        job.job_id,
        cause,
        failure_time,
        assessment.max_step,
        tuple(culprit_nodes),
        {"ranks_affected": len(findings)},
        job_running=True,
    )
    return RankFailureVerdict(actions, failure)


def exit_code_from_beats(job_id: str, beats: list[Heartbeat]) -> int | None:
    """The trainer's own exit code, from the beats its ranks wrote while exiting (when SLURM
    does not say): a failure wins over a purposeful exit."""
    codes = [b.exit_code for b in beats if b.job_id == job_id and b.exit_code is not None]
    if not codes:
        return None
    failures = [c for c in codes if c not in PURPOSEFUL_EXITS]
    return failures[0] if failures else max(codes)


def on_job_end(
    state: ControllerState,
    record: JobRecord,
    exit_code: int | None,
    *,
    launch_end: LaunchEnd | None,
    job_beats: list[Heartbeat],
    stale_nodes: list[str],
    wall_now: float,
    queued_job_ids: list[str],
    unhealthy_nodes: tuple[str, ...] = (),
    rank_error: RankError | None = None,
) -> tuple[Outcome, list[Action], Incident | None]:
    """`unhealthy_nodes`: nodes the job's launcher found unhealthy before launching (blamed too).
    `rank_error`: what the failing rank printed last (its traceback), for the words."""
    outcome = classify_end(record.state, exit_code)
    actions: list[Action] = [
        Record(
            ev.JobEnded(job_id=record.job_id, state=record.state, exit_code=exit_code, outcome=outcome.value)
        )
    ]
    queued = tuple(queued_job_ids)

    def stop(status: RunStatus, kind: str, message: str, why: str) -> tuple[Outcome, list[Action], None]:
        if queued:
            actions.append(Cancel(queued, f"cancelled ({why})"))
        actions.append(Stop(status, kind, message))
        return outcome, actions, None

    if state.status == RunStatus.KILLING:
        return stop(
            RunStatus.KILLED,
            "kill",
            f"run stopped by the kill switch (job {record.job_id}: {outcome.value})",
            "kill switch",
        )
    if state.status.stopping:  # a health pause or rollback: health_policy.settle goes on
        if queued:
            actions.append(Cancel(queued, f"cancelled ({state.status.value})"))
        return outcome, actions, None
    if outcome is Outcome.FINISHED:
        return stop(RunStatus.FINISHED, "finish", f"training finished (job {record.job_id})", "run finished")
    if outcome is Outcome.KILLED:
        return stop(
            RunStatus.KILLED, "kill", f"job {record.job_id} stopped by the kill switch", "kill switch"
        )
    if outcome is Outcome.CONFIG_ERROR:
        return stop(
            RunStatus.CONFIG_ERROR,
            "stopped",
            f"job {record.job_id}: the trainer refused the config; fix it and `runctl resume`",
            "config error",
        )
    if outcome is Outcome.TIME_BUDGET:
        actions.append(
            Record(ev.Continue(job_id=record.job_id, why="time budget reached with a checkpoint saved"))
        )
        return outcome, actions, None
    culprits = signalled_culprit(launch_end) + list(unhealthy_nodes)
    srun_host, srun_says = (launch_end.failed_host, launch_end.what) if launch_end else (None, None)
    if record.state == JobState.NODE_FAIL.value:
        # SLURM says a node of the job failed, not which: the one whose ranks stopped beating
        # first (the per-incident cap still applies).
        culprits = list(stale_nodes)
    last_step = max((b.step for b in job_beats), default=None)
    cause = failure_cause(Cause.JOB_FAILED, exit_code, srun_says)
    # SLURM's end time (slurmctld's clock, not a compute node's) is when the job failed.
    failure_time = min(record.ended_at or wall_now, wall_now)
    actions.extend(
        alert(
            fev.Failure(
                job_id=record.job_id,
                cause=cause,
                exit_code=exit_code,
                failure_time=failure_time,
                detection_time=wall_now,
                last_step=last_step,
                srun_says=srun_says,
                host=srun_host,
                **_error_fields(rank_error),
            ),
            RESPONSES[cause].notice,
        )
    )
    return (
        outcome,
        actions,
        Incident(
            record.job_id,
            cause,
            failure_time,
            last_step,
            tuple(culprits),
            {"exit_code": exit_code, "srun_says": srun_says},
        ),
    )


def _error_fields(rank_error: RankError | None) -> dict[str, Any]:
    if rank_error is None:
        return {}
    return {"rank_error": rank_error.describe(), "rank_error_lines": list(rank_error.lines)}


def signalled_culprit(launch_end: LaunchEnd | None) -> list[str]:
    """The node of the task srun reports killed by a signal (OOM killer, a dying node): blamed.
    A task that exited with a code is not blamed: its peers exit too when one dies, and a bug
    fails the same way on every node."""
    if launch_end is None or not launch_end.blames_signalled_task or not launch_end.failed_host:
        return []
    return [launch_end.failed_host]


def on_launch_failed(
    job: JobRecord,
    allocation: Allocation,
    *,
    last_step: int | None,
    wall_now: float,
    failure_time: float,
    rank_error: RankError | None = None,
) -> tuple[list[Action], Incident]:
    """A launch inside a job with spares failed and its launcher waits for a decision: the
    failure as on a job end, then recovery decides (relaunch on a spare, or job level)."""
    culprits = signalled_culprit(allocation.ended)
    srun_host, srun_says = (
        (allocation.ended.failed_host, allocation.ended.what) if allocation.ended else (None, None)
    )
    cause = failure_cause(Cause.LAUNCH_FAILED, allocation.exit_code, srun_says)
    detail = fev.Failure(
        job_id=job.job_id,
        cause=cause,
        launch=allocation.launch,
        exit_code=allocation.exit_code,
        failure_time=failure_time,
        detection_time=wall_now,
        last_step=last_step,
        srun_says=srun_says,
        host=srun_host,
        nodes=allocation.nodes,
        **_error_fields(rank_error),
    )
    actions = alert(detail, RESPONSES[cause].notice)
    failure = Incident(
        job.job_id,
        cause,
        failure_time,
        last_step,
        tuple(culprits),
        {"exit_code": allocation.exit_code, "srun_says": srun_says, "launch": allocation.launch},
        job_running=True,
    )
    return actions, failure
