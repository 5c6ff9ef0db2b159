"""The pass's bookkeeping, as pure rules from what it observed to actions: the restart followed to
its first training step, the first step of each launch, checkpoints that completed, the ranks'
damage reports, the disk, trust lost during the run, and the run's status."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.contract import JobState, Phase, step_of
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.checkpoints import CheckpointInfo
from orchestrator.contract.disk_space import DiskCheck
from orchestrator.contract.manifest import DamageReport
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, RunStatus

from .actions import Action, ChangeState, FollowRecovery, Record, SetStatus, alert
from .detection import Assessment


def trust_lost(job_ids: list[str], problems: list[str]) -> list[Action]:
    """Files the controller trusts became writable by others during the run (found when a new job
    folder appeared): an event and its notification, and supervision goes on (stopping would leave the run
    unsupervised; what the controller reads from there is read as untrusted anyway)."""
    if not problems:
        return []
    return alert(ev.TrustProblem(job_ids=list(job_ids), problems=list(problems)), Notice.FAILURE)


def follow_recovery(state: ControllerState, assessment: Assessment, wall_now: float) -> list[Action]:
    """The first training step after a restart (the end of the outage)."""
    rec = state.recovering
    if rec is None or assessment.job_id != rec.job_id or assessment.max_step is None:
        return []
    resumed_from = rec.resumed_from
    if resumed_from is None:
        # The restart only predicted the resume step (a checkpoint damaged inside is found by the
        # ranks' hashes): rank 0 says where it really resumed from once it trains.
        reference = assessment.reference
        if reference is None or reference.phase is not Phase.STEP:
            return []
        resumed_from = reference.resumed_from if reference.resumed_from is not None else reference.step
    if assessment.max_step <= resumed_from:
        return (
            []
            if rec.resumed_from == resumed_from
            else [FollowRecovery(replace(rec, resumed_from=resumed_from))]
        )
    return [
        Record(
            fev.FirstStepAfterRestart(
                job_id=rec.job_id,
                step=assessment.max_step,
                resume_step=rec.resume_step,
                resumed_from=resumed_from,
                seconds_since_failure=wall_now - rec.failure_time,
                seconds_since_restart=wall_now - rec.restart_time,
                start_phases=dict(reference.start_phases) if (reference := assessment.reference) else {},
                restore_bytes=dict(reference.restore_bytes) if reference else {},
            )
        ),
        FollowRecovery(None, trained_seconds=_trained_seconds(assessment, resumed_from)),
    ]


def _trained_seconds(assessment: Assessment, resumed_from: int) -> float:
    """How long the job has trained when its first step is seen: its steps since the resume times
    rank 0's step time (durations measured on the node: no clock of a node is compared with ours)."""
    beat = assessment.reference
    per_step = beat.step_seconds if beat is not None and beat.step_seconds else 0.0
    return max(0, (assessment.max_step or 0) - resumed_from) * per_step


def training_started(assessment: Assessment) -> tuple[str, ev.JobTraining] | None:
    """(key, event) when rank 0 of a launch beats in the step phase: `job_training` is written
    once per key (goodput takes the checkpoint load time from it)."""
    beat = assessment.reference
    if beat is None or beat.phase is not Phase.STEP:
        return None
    key = f"{assessment.job_id}/{beat.launch}"  # a job with spares trains again after each relaunch
    return key, ev.JobTraining(
        job_id=str(assessment.job_id),
        launch=beat.launch,
        step=beat.step,
        resumed_from=beat.resumed_from,
        checkpoint_load_seconds=beat.checkpoint_load_seconds,
        init_seconds=beat.durations.get(Phase.INIT.value),
    )


def dropped_copies(assessment: Assessment) -> list[fev.CheckpointCopyDropped]:
    """One event per checkpoint copy rank 0 says its launch's restore dropped (recorded with the
    launch's `job_training`, once)."""
    beat = assessment.reference
    if beat is None:
        return []
    return [
        fev.CheckpointCopyDropped(job_id=str(assessment.job_id), launch=beat.launch, copy=copy)
        for copy in beat.dropped_copies
    ]


def completed_checkpoints(complete: list[CheckpointInfo], seen: set[int] | None) -> list[Action]:
    """`checkpoint_complete` for each checkpoint that completed while this controller watched (the
    save's end outlives keep-last cleanup: goodput's save-stall accounting). `seen` None: the
    first look, which says nothing about checkpoints older than the controller."""
    if seen is None:
        return []
    return [
        Record(ev.CheckpointComplete(step=info.step, saved_at=info.saved_at, size_bytes=info.size_bytes))
        for info in complete
        if info.step not in seen
    ]


def damage_reports(reports: list[DamageReport], seen: int) -> list[Action]:
    """Checkpoints the ranks found damaged when they resumed (by hash or probe): an event and a
    notification for each new report. The checkpoint is kept for inspection."""
    actions: list[Action] = []
    for report in reports[seen:]:
        problem = "; ".join(report.problems[:3]) or "damaged"
        damaged = ev.CheckpointCorrupt(
            step=step_of(report.checkpoint),
            path=report.checkpoint,
            problem=problem,
            reported_by_job=report.job_id,
            action="skipped by the ranks, who resumed from an older one (kept on disk for inspection)",
        )
        actions += alert(damaged, Notice.FAILURE)
    if len(reports) > seen:
        actions.append(ChangeState(damage_reports_seen=len(reports)))
    return actions


def disk_level(check: DiskCheck, current: str, paused: bool = False) -> list[Action]:
    """An event (and for warning/critical a notification) when the level changes; while the run
    is paused on a full disk the pause's notification has said it."""
    if check.level == current or check.level == "unknown":
        return []
    event = ev.Disk(
        level=check.level,
        free_bytes=check.free_bytes,
        expected_bytes=check.expected_bytes,
        message=check.message(),
    )
    said = [Record(event)]
    if check.level in ("warning", "critical") and not paused:
        said = alert(event, Notice.DISK if check.level == "critical" else Notice.DISK_LOW)
    return [*said, ChangeState(disk_level=check.level)]


def status_after_pass(state: ControllerState) -> list[Action]:
    """A run supervised as usual (not stopped, not stopping, not paused on a full disk) runs while a
    job of it runs, else waits."""
    if not state.status.active or state.disk_pause is not None:
        return []
    live = state.live_jobs()
    if any(j.state == JobState.RUNNING.value for j in live):
        return [SetStatus(RunStatus.RUNNING)]
    if live:
        return [SetStatus(RunStatus.WAITING)]
    return []
