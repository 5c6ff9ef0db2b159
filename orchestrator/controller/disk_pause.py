"""A full disk that heals: the run pauses while the checkpoint filesystem cannot hold the next
checkpoint, and resumes by itself once it can. Pure rules over what the pass observed.

- A failure (a job that ended, ranks dead or hung) seen while the next checkpoint does not fit
  (disk.DiskCheck.fits: free < expected size + margin) is the disk's, not a node's: nothing is
  restarted, no node is excluded, nothing counts towards a crash loop. The failed job is
  cancelled if it still runs and queued jobs are held (each would fail the same way). The status
  becomes DISK_FULL; one event and one notification (instead of the failure's) name the
  filesystem, the bytes free and needed, and what to delete (disk.what_to_delete).
- A failure while already paused: cancelled and held as above, with nothing new to say.
- Every pass while paused, the numbers and the advice are refreshed (state.disk_pause, what
  `runctl status` shows). Once the next checkpoint fits: an event, and the held jobs are released
  (or, with none queued, a job is submitted): a normal resume from the newest good checkpoint.
Running jobs are never paused: a run that trains may still save once someone makes room, and
the disk's warning and critical levels (upkeep.disk_level) have said so already.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.contract import JobState
from orchestrator.contract import events as ev
from orchestrator.contract.disk_space import DiskCheck
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, DiskPause, JobRecord, RunStatus

from .actions import Action, Cancel, ChangeState, Hold, Record, Release, SetStatus, Submit, alert


def pause_on_failure(
    state: ControllerState,
    *,
    job_id: str,
    cause: str,
    job_running: bool,
    check: DiskCheck,
    to_delete: list[dict[str, Any]],
    queued: list[JobRecord],
    wall_now: float,
) -> list[Action] | None:
    """The actions of a pause, or None when the disk holds the next checkpoint (recover as usual)."""
    if check.fits:
        return None
    actions: list[Action] = []
    if job_running:
        actions.append(Cancel((job_id,), f"failed ({cause}) while the checkpoint disk was full"))
    # Only jobs that would start: one a person held stays theirs (never released by the pause).
    to_hold = tuple(j.job_id for j in queued if j.state == JobState.PENDING.value)
    if to_hold:
        actions.append(Hold(to_hold))
    pause = state.disk_pause
    if pause is not None:
        if to_hold:
            actions.append(ChangeState(disk_pause=replace(pause, held_jobs=[*pause.held_jobs, *to_hold])))
        return actions
    pause = DiskPause(
        mount=check.mount,
        free_bytes=check.free_bytes,
        needed_bytes=check.needed_bytes or 0,
        since=wall_now,
        job_id=job_id,
        to_delete=list(to_delete),
        held_jobs=list(to_hold),
    )
    paused = ev.DiskFullPaused(
        mount=pause.mount,
        free_bytes=pause.free_bytes,
        needed_bytes=pause.needed_bytes,
        job_id=job_id,
        cause=cause,
        to_delete=pause.to_delete,
    )
    return [
        *actions,
        *alert(paused, Notice.DISK),
        ChangeState(disk_pause=pause),
        SetStatus(RunStatus.DISK_FULL),
    ]


def while_paused(
    state: ControllerState, check: DiskCheck, to_delete: list[dict[str, Any]], wall_now: float
) -> list[Action]:
    """Every pass of a paused run: refresh what status shows, or resume once the checkpoint fits."""
    pause = state.disk_pause
    if pause is None or state.status.stopped or state.status.stopping:
        return []
    if not check.fits:
        fresh = replace(
            pause,
            free_bytes=check.free_bytes,
            needed_bytes=check.needed_bytes or 0,
            to_delete=list(to_delete),
        )
        actions: list[Action] = [] if fresh == pause else [ChangeState(disk_pause=fresh)]
        if state.status != RunStatus.DISK_FULL:  # e.g. a kill withdrawn while paused
            actions.append(SetStatus(RunStatus.DISK_FULL))
        return actions
    live = {j.job_id: j for j in state.live_jobs()}
    held = tuple(j for j in pause.held_jobs if j in live and live[j].ended_at is None)
    if held:
        how, resume = f"released held job(s) {', '.join(held)}", [Release(held)]
    elif not live:
        how, resume = "submitted a job", [Submit("resume after the checkpoint disk was full")]
    else:
        how, resume = "its queued job goes on", []
    return [
        Record(
            ev.DiskFullResumed(
                mount=pause.mount,
                free_bytes=check.free_bytes,
                needed_bytes=check.needed_bytes or 0,
                paused_seconds=max(0.0, wall_now - pause.since),
                how=how,
            )
        ),
        ChangeState(disk_pause=None),
        SetStatus(RunStatus.WAITING),
        *resume,
    ]
