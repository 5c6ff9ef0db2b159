"""Failure policy: from what one pass saw (an assessment of the running job, or a job that ended)
to actions. Pure: the supervisor gathers the inputs and applies the actions.

- A dead, missing or hung rank in the running job: record the failure, notify, ask for stacks,
  and hand over to recovery (relaunch inside the job on a spare, or cancel it and restart, or
  stop a crash loop).
- A launch that failed inside a job with spares (its launcher waits for a decision): the same,
  blaming the task srun reports as killed by a signal.
- At least half of the ranks dead at once (a filesystem stall freezes every heartbeat; a requeue
  leaves old beats): wait one more `dead_after` before acting, in case it clears by itself; then
  restart without blaming any node.
- While a kill is in progress, ranks that stop responding end the kill (cancel), never a restart.
- A job that ended: by its outcome (protocol.classify_end): finished, killed and config error stop
  the run, time budget continues the chain, anything else is a failure (restart), blaming the task
  srun reports as killed by a signal, or every node of a NODE_FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.allocation import Allocation
from orchestrator.protocol import ExitCode, JobState, Outcome, classify_end

from .actions import Action, Cancel, DumpStacks, Notify, Record, Stop
from .detection import Assessment
from .recovery import Failure
from .state import ControllerState, JobRecord, RunStatus

# Exit codes that mean the trainer left on purpose (the others are failures).
PURPOSEFUL_EXITS = frozenset(
    {ExitCode.FINISHED, ExitCode.KILLED, ExitCode.TIME_BUDGET, ExitCode.CONFIG_ERROR}
)


@dataclass(frozen=True)
class RankFailureVerdict:
    """What to do about the findings of one pass: act now (`failure`), or wait (`waiting`)."""

    actions: list[Action]
    failure: Failure | None  # set when recovery should plan a restart


def on_findings(
    state: ControllerState,
    job: JobRecord,
    assessment: Assessment,
    *,
    wall_now: float,
    job_wide_for: float,
    dead_after: float,
    culprit_nodes: list[str],
    queued_job_ids: list[str],
) -> RankFailureVerdict:
    """`job_wide_for`: seconds (controller clock) the stall has been job-wide, 0 on its first pass."""
    if state.status == RunStatus.KILLING:
        return RankFailureVerdict(
            [
                Cancel((job.job_id,), "killed (ranks stopped responding while saving)"),
                Stop(
                    RunStatus.KILLED,
                    "kill",
                    "run stopped by the kill switch (ranks hung while saving: cancelled)",
                ),
            ],
            None,
        )
    dead, hung = assessment.dead, assessment.hung
    findings = dead or hung
    if assessment.job_wide and job_wide_for < dead_after:
        if job_wide_for == 0:
            return RankFailureVerdict(
                [
                    Record(
                        "job_wide_stall",
                        {
                            "job_id": job.job_id,
                            "ranks_stalled": len(dead),
                            "world_size": assessment.world_size,
                            "waiting_seconds": dead_after,
                            "why": "most ranks stopped beating at once: a filesystem, network or job problem, not N nodes; "
                            "waiting before acting in case it clears",
                        },
                    )
                ],
                None,
            )
        return RankFailureVerdict([], None)
    if assessment.job_wide:
        cause = "job_stall"
    elif dead:
        cause = dead[0].kind.value
    else:
        cause = "hang"
    failure_time = wall_now - max(f.age_seconds for f in findings)
    sample = [f.as_dict() for f in findings[:16]]
    actions: list[Action] = [
        Record(
            "failure",
            {
                "job_id": job.job_id,
                "cause": cause,
                "failure_time": failure_time,
                "detection_time": wall_now,
                "last_step": assessment.max_step,
                "ranks": sample,
                "ranks_affected": len(findings),
            },
        ),
        Notify(
            "hang" if cause == "hang" else "failure",
            f"job {job.job_id}: {cause} of {len(findings)} rank(s), e.g. rank {findings[0].rank} "
            f"on {findings[0].host or '?'}",
            {"job_id": job.job_id, "ranks": sample[:8]},
        ),
        DumpStacks(job.job_id),
    ]
    # The job still runs: recovery cancels it, or relaunches inside it when it has spares.
    failure = Failure(
        job.job_id,
        cause,
        failure_time,
        assessment.max_step,
        tuple(culprit_nodes),
        {"ranks_affected": len(findings)},
        job_running=True,
    )
    return RankFailureVerdict(actions, failure)


def exit_code_from_beats(job_id: str, beats: list[dict[str, Any]]) -> int | None:
    """The trainer's own exit code, from the beats its ranks wrote while exiting (when SLURM
    does not say): a failure wins over a purposeful exit."""
    codes = []
    for beat in beats:
        if str(beat.get("job_id")) != job_id:
            continue
        extra = beat.get("extra")
        code = extra.get("exit_code") if isinstance(extra, dict) else None
        if isinstance(code, int) and not isinstance(code, bool):
            codes.append(code)
    if not codes:
        return None
    failures = [c for c in codes if c not in PURPOSEFUL_EXITS]
    return failures[0] if failures else max(codes)


def on_job_end(
    state: ControllerState,
    record: JobRecord,
    exit_code: int | None,
    *,
    srun_host: str | None,
    srun_says: str | None,
    job_beats: list[dict[str, Any]],
    stale_nodes: list[str],
    wall_now: float,
    queued_job_ids: list[str],
    unhealthy_nodes: tuple[str, ...] = (),
) -> tuple[Outcome, list[Action], Failure | None]:
    """`unhealthy_nodes`: nodes the job's launcher found unhealthy before launching (blamed too)."""
    outcome = classify_end(record.state, exit_code)
    actions: list[Action] = [
        Record(
            "job_ended",
            {
                "job_id": record.job_id,
                "state": record.state,
                "exit_code": exit_code,
                "outcome": outcome.value,
            },
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
    if outcome is Outcome.FINISHED:
        return stop(RunStatus.FINISHED, "finish", f"training finished (job {record.job_id})", "run finished")
    if outcome is Outcome.KILLED:
        return stop(
            RunStatus.KILLED, "kill", f"job {record.job_id} stopped by the kill switch", "kill switch"
        )
    if outcome is Outcome.CONFIG_ERROR:
        return stop(
            RunStatus.CONFIG_ERROR,
            "failure",
            f"job {record.job_id}: the trainer refused the config; fix it and `runctl resume`",
            "config error",
        )
    if outcome is Outcome.TIME_BUDGET:
        actions.append(
            Record(
                "continue", {"job_id": record.job_id, "why": "time budget reached with a checkpoint saved"}
            )
        )
        return outcome, actions, None
    culprits = signalled_culprit(srun_host, srun_says) + list(unhealthy_nodes)
    if record.state == JobState.NODE_FAIL.value:
        # SLURM says a node of the job failed, not which: the one whose ranks stopped beating
        # first (the per-incident cap still applies).
        culprits = list(stale_nodes)
    steps = [b.get("step") for b in job_beats if isinstance(b.get("step"), int)]
    last_step = max(steps) if steps else None
    # SLURM's end time (slurmctld's clock, not a compute node's) is when the job failed.
    failure_time = min(record.ended_at or wall_now, wall_now)
    actions.append(
        Record(
            "failure",
            {
                "job_id": record.job_id,
                "cause": "job_failed",
                "exit_code": exit_code,
                "failure_time": failure_time,
                "detection_time": wall_now,
                "last_step": last_step,
                "srun_says": srun_says,
                "host": srun_host,
            },
        )
    )
    actions.append(
        Notify(
            "failure",
            f"job {record.job_id} failed ({outcome.value}, exit {exit_code}; "
            f"{srun_says or 'no srun detail'})",
            {"job_id": record.job_id, "exit_code": exit_code, "host": srun_host},
        )
    )
    return (
        outcome,
        actions,
        Failure(
            record.job_id,
            "job_failed",
            failure_time,
            last_step,
            tuple(culprits),
            {"exit_code": exit_code, "srun_says": srun_says},
        ),
    )


def signalled_culprit(srun_host: str | None, srun_says: str | None) -> list[str]:
    """The node of the task srun reports killed by a signal (OOM killer, a dying node): blamed.
    A task that exited with a code is not blamed: its peers exit too when one dies, and a bug
    fails the same way on every node."""
    signalled = bool(srun_host and srun_says and ("Killed" in srun_says or "signal" in srun_says.lower()))
    return [srun_host] if signalled and srun_host else []


def on_launch_failed(
    job: JobRecord,
    allocation: Allocation,
    *,
    srun_host: str | None,
    srun_says: str | None,
    last_step: int | None,
    wall_now: float,
    failure_time: float,
) -> tuple[list[Action], Failure]:
    """A launch inside a job with spares failed and its launcher waits for a decision: the
    failure as on a job end, then recovery decides (relaunch on a spare, or job level)."""
    culprits = signalled_culprit(srun_host, srun_says)
    detail = {
        "job_id": job.job_id,
        "cause": "launch_failed",
        "launch": allocation.launch,
        "exit_code": allocation.exit_code,
        "failure_time": failure_time,
        "detection_time": wall_now,
        "last_step": last_step,
        "srun_says": srun_says,
        "host": srun_host,
        "nodes": allocation.nodes,
    }
    actions: list[Action] = [
        Record("failure", detail),
        Notify(
            "failure",
            f"job {job.job_id}: launch {allocation.launch} failed (exit {allocation.exit_code}; "
            f"{srun_says or 'no srun detail'})",
            {"job_id": job.job_id, "exit_code": allocation.exit_code, "host": srun_host},
        ),
    ]
    failure = Failure(
        job.job_id,
        "launch_failed",
        failure_time,
        last_step,
        tuple(culprits),
        {"exit_code": allocation.exit_code, "srun_says": srun_says, "launch": allocation.launch},
        job_running=True,
    )
    return actions, failure
