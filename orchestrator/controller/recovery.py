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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .actions import Action, Cancel, Exclude, Record, Restart, Stop
from .checkpoints import CheckpointInfo
from .detection import culprit_nodes
from .state import ControllerState, RunStatus


@dataclass(frozen=True)
class Failure:
    """One incident, as the policy saw it."""

    job_id: str
    cause: str  # dead_rank, missing_rank, hang, job_stall, job_failed
    failure_time: float  # wall clock of the login node
    last_step: int | None
    culprits: tuple[str, ...] = ()  # node names to blame (before the per-incident cap)
    evidence: dict[str, Any] = field(default_factory=dict)


def plan_restart(
    state: ControllerState,
    watchdog: Any,
    failure: Failure,
    resume: CheckpointInfo | None,
    skipped: list[tuple[CheckpointInfo, str]],
    queued_job_ids: list[str],
) -> list[Action]:
    actions: list[Action] = [
        Record(
            "checkpoint_corrupt",
            {
                "step": info.step,
                "path": str(info.path),
                "problem": problem,
                "action": "skipped (kept on disk for inspection)",
            },
        )
        for info, problem in skipped
    ]
    resume_step = resume.step if resume else 0
    without_progress = state.restarts_without_progress
    if resume_step != state.checkpoint_step_at_last_restart:
        without_progress = 0  # a new checkpoint since the last restart: the run is moving
    limit = watchdog.max_restarts_without_progress
    if without_progress >= limit:
        if queued_job_ids:
            actions.append(Cancel(tuple(queued_job_ids), "cancelled (crash loop)"))
        actions.append(
            Stop(
                RunStatus.CRASH_LOOP,
                "crash_loop",
                f"{without_progress} restarts without a new checkpoint (still at step {resume_step}): stopped. "
                "Look at events.jsonl and jobs/, fix the cause, then `runctl resume`",
            )
        )
        return actions
    nodes, why_not = culprit_nodes(list(failure.culprits), watchdog.max_excluded_per_incident)
    if why_not:
        actions.append(
            Record(
                "exclusion_capped",
                {
                    "job_id": failure.job_id,
                    "cause": failure.cause,
                    "nodes": sorted(set(failure.culprits))[:64],
                    "why": why_not,
                },
            )
        )
    if nodes:
        actions.append(
            Exclude(tuple(nodes), f"{failure.cause} in job {failure.job_id}", failure.job_id, failure.cause)
        )
    work_lost_seconds = None
    if resume is not None and resume.saved_at is not None:
        work_lost_seconds = max(0.0, failure.failure_time - resume.saved_at)
    actions.append(
        Restart(
            failed_job_id=failure.job_id,
            cause=failure.cause,
            failure_time=failure.failure_time,
            last_step=failure.last_step,
            resume_step=resume_step,
            work_lost_seconds=work_lost_seconds,
            restarts_without_progress=without_progress + 1,
        )
    )
    return actions
