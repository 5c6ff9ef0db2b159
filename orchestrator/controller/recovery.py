"""Recovery policy: from one failure to a restart (or a crash-loop stop), as actions.

Rules:
- Resume point: the checkpoint the ranks will resume from, predicted without reading bytes
  (checkpoints.resume_point); newer ones that fail the cheap check are reported, never deleted.
- Crash loop: `watchdog.max_restarts_without_progress` restarts that all resume from the same
  step stop the run and page a person (restarting again would only burn GPU hours).
- Exclusion: the culprit nodes of one incident are excluded from every later job, at most
  `watchdog.max_excluded_per_incident` of them (detection.culprit_nodes: more at once means the
  job, the filesystem or the network, not the nodes).
- Lost work: the steps and the seconds since the resume checkpoint was saved, recomputed after
  the restart.
- Where: inside the running job when it has spares (contract.allocation): its launcher
  leaves out the excluded nodes, takes as many spares and launches again, with no queue wait.
  Otherwise (no launcher, too few spares left, the job gone) at job level: the failed job is
  cancelled if it still runs, and the queued successor or a new job restarts the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import Allocation, LauncherState
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import RESPONSES, Cause
from orchestrator.contract.checkpoints import CheckpointInfo
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, RunStatus

from .actions import Action, Cancel, Exclude, Record, Relaunch, RestartRun, Stop
from .detection import culprit_nodes


@dataclass(frozen=True)
class Incident:
    """One incident, as the policy saw it."""

    job_id: str
    cause: Cause
    failure_time: float  # wall clock of the login node
    last_step: int | None
    culprits: tuple[str, ...] = ()  # node names to blame (before the per-incident cap)
    evidence: dict[str, Any] = field(default_factory=dict)
    job_running: bool = False  # the failed job still holds its allocation (cancel it, or relaunch in it)


def _trained_on(state: ControllerState, watchdog: Any, failure: Incident) -> bool:
    """The failed job trained for `crash_loop_training_minutes` after its resume and did not fail at
    the step the failure before it did: not a crash loop (a bug fails early, or at one step, every
    time; honest faults land anywhere)."""
    if state.training_since is None:
        return False  # it never trained: failed in its start-up
    trained = failure.failure_time - state.training_since
    same_step = failure.last_step is not None and failure.last_step == state.last_failure_step
    return trained >= 60.0 * watchdog.crash_loop_training_minutes and not same_step


def plan_restart(
    state: ControllerState,
    watchdog: Any,
    failure: Incident,
    resume: CheckpointInfo | None,
    skipped: list[tuple[CheckpointInfo, str]],
    queued_job_ids: list[str],
    allocation: Allocation | None = None,
) -> list[Action]:
    """`allocation`: the failed job's launcher record when it has one (jobs with spares)."""
    cancel_failed = [Cancel((failure.job_id,), f"failed ({failure.cause})")] if failure.job_running else []
    actions: list[Action] = [
        Record(
            ev.CheckpointCorrupt(
                step=info.step,
                path=str(info.path),
                problem=problem,
                action="skipped (kept on disk for inspection)",
            )
        )
        for info, problem in skipped
    ]
    resume_step = resume.step if resume else 0
    without_progress = state.restarts_without_progress
    if resume_step != state.checkpoint_step_at_last_restart or _trained_on(state, watchdog, failure):
        without_progress = 0  # a new checkpoint since the last restart, or a fault like any other
    limit = watchdog.max_restarts_without_progress
    if without_progress >= limit:
        actions.extend(cancel_failed)
        if queued_job_ids:
            actions.append(Cancel(tuple(queued_job_ids), "cancelled (crash loop)"))
        actions.append(
            Stop(
                RunStatus.CRASH_LOOP,
                Notice.CRASH_LOOP,
                f"{without_progress} restarts without a new checkpoint (still at step {resume_step}): stopped. "
                "Look at events.jsonl and jobs/, fix the cause, then `runctl resume`",
            )
        )
        return actions
    blamed = list(failure.culprits) if RESPONSES[failure.cause].blames_nodes else []
    nodes, why_not = culprit_nodes(blamed, watchdog.max_excluded_per_incident)
    if why_not:
        actions.append(
            Record(
                fev.ExclusionCapped(
                    job_id=failure.job_id,
                    cause=failure.cause,
                    nodes=sorted(set(failure.culprits))[:64],
                    why=why_not,
                )
            )
        )
    if nodes:
        actions.append(
            Exclude(tuple(nodes), f"{failure.cause} in job {failure.job_id}", failure.job_id, failure.cause)
        )
    work_lost_seconds = None
    if resume is not None and resume.saved_at is not None:
        work_lost_seconds = max(0.0, failure.failure_time - resume.saved_at)
    common = dict(
        failed_job_id=failure.job_id,
        cause=failure.cause,
        failure_time=failure.failure_time,
        last_step=failure.last_step,
        resume_step=resume_step,
        work_lost_seconds=work_lost_seconds,
        restarts_without_progress=without_progress + 1,
    )
    inside, why_not = _relaunch_possible(failure, allocation, nodes)
    if inside:
        assert allocation is not None
        spares_left = len(allocation.spares) - len(nodes)
        actions.append(
            Relaunch(**common, launch=allocation.launch, leave_out=tuple(nodes), spares_left=spares_left)
        )
        return actions
    if why_not:
        actions.append(Record(fev.RelaunchNotPossible(job_id=failure.job_id, why=why_not)))
    actions.extend(cancel_failed)
    actions.append(RestartRun(**common))
    return actions


def _relaunch_possible(
    failure: Incident, allocation: Allocation | None, leave_out: list[str]
) -> tuple[bool, str]:
    """(True, "") when the failed job's launcher can relaunch on its own spares; else why not
    ("" when the job has no launcher at all: a job without spares)."""
    if allocation is None or allocation.job_id != failure.job_id or not allocation.waits_for_decisions:
        return False, ""  # no launcher record, or one that never waits (a job without spares)
    if not failure.job_running or allocation.state not in (
        LauncherState.RUNNING,
        LauncherState.WAITING_DECISION,
    ):
        return False, f"the job's launcher is {allocation.state.value}, not waiting for a decision"
    if len(leave_out) > len(allocation.spares):
        return False, (
            f"{len(leave_out)} node(s) to leave out ({', '.join(leave_out)}), "
            f"{len(allocation.spares)} spare(s) left in the job"
        )
    return True, ""
