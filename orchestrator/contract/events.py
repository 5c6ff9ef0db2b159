"""events.jsonl: what the controller (and the aux-job commands) saw and did, one typed record a
line. Each kind is a frozen dataclass below, with its fields: the supervisor writes these,
and goodput, the report, the dashboard, the exporter and the simulation read them back as the
same types (`read_events`), never as dicts.

A line is {"event": KIND, "time": login-node epoch seconds, "version": N, **fields}. A field
missing from an older line reads as its default (None, or empty); a line of an unknown kind
reads as `UnknownEvent` (kept, never guessed at); a newer version is a ContractVersionError.
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Every kind defined by subject registers here when imported: what makes `read_events` know them.
from . import failure_events, health_events, interval, pool_events  # noqa: E402,F401
from .event_base import _KINDS, EVENT_VERSION, Event, UnknownEvent  # noqa: F401 - the module's names
from .files import append_jsonl, read_jsonl


def event_kinds() -> dict[str, type[Event]]:
    return dict(_KINDS)


def write_event(path: Path, event: Event, now: float | None = None) -> Event:
    """Append one event to events.jsonl, stamped with `now` (default: this machine's clock)."""
    stamped = event.stamped(_time.time() if now is None else now)
    append_jsonl(path, stamped.to_dict())
    return stamped


def read_events(
    path: Path, last: int | None = None, kinds: tuple[type[Event], ...] | None = None
) -> list[Event]:
    """Every event of the file (the last `last`), optionally only those of `kinds`."""
    events = [Event.from_dict(record) for record in read_jsonl(path)]
    if kinds is not None:
        events = [e for e in events if isinstance(e, kinds)]
    return events[-last:] if last else events


# -- the controller itself --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ControllerStarted(Event):
    KIND = "controller_started"
    status: str
    jobs: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class PermissionsWarning(Event):
    KIND = "permissions_warning"
    message: str


@dataclass(frozen=True, kw_only=True)
class PassFailed(Event):
    KIND = "pass_failed"
    error: str
    passes_failed_in_a_row: int
    retry_in_seconds: float
    where: str = ""


@dataclass(frozen=True, kw_only=True)
class PassRecovered(Event):
    KIND = "pass_recovered"
    after_failed_passes: int


@dataclass(frozen=True, kw_only=True)
class StateNotSaved(Event):
    KIND = "state_not_saved"
    error: str


@dataclass(frozen=True, kw_only=True)
class Notified(Event):
    KIND = "notified"
    kind: str  # the notification's kind (notifications.events)


@dataclass(frozen=True, kw_only=True)
class NotificationFailed(Event):
    KIND = "notification_failed"
    kind: str
    problem: str


# -- jobs ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class JobAdopted(Event):
    KIND = "job_adopted"
    job_id: str
    why: str


@dataclass(frozen=True, kw_only=True)
class JobSubmitted(Event):
    KIND = "job_submitted"
    job_id: str
    reason: str
    exclude: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class JobRequeued(Event):
    KIND = "job_requeued"
    job_id: str
    state: str
    requeues: int


@dataclass(frozen=True, kw_only=True)
class JobEnded(Event):
    KIND = "job_ended"
    job_id: str
    state: str
    exit_code: int | None
    outcome: str


@dataclass(frozen=True, kw_only=True)
class JobsCancelled(Event):
    KIND = "jobs_cancelled"
    job_ids: list[str]
    why: str


@dataclass(frozen=True, kw_only=True)
class IntentExpired(Event):
    KIND = "intent_expired"
    intent: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SchedulerUnreachable(Event):
    KIND = "scheduler_unreachable"
    error: str


@dataclass(frozen=True, kw_only=True)
class SchedulerReachable(Event):
    KIND = "scheduler_reachable"
    after_seconds: float


@dataclass(frozen=True, kw_only=True)
class Continue(Event):
    """A job ended at its time budget with a checkpoint saved: the chain goes on."""

    KIND = "continue"
    job_id: str
    why: str


@dataclass(frozen=True, kw_only=True)
class JobTraining(Event):
    """Rank 0 of a launch first beat in the step phase (goodput takes the load time from it)."""

    KIND = "job_training"
    job_id: str
    launch: int = 0  # the launcher's numbering: 0 is the job's first launch
    step: int | None = None  # the first step seen (not where it resumed)
    resumed_from: int | None = None  # the trainer's own word; None: it started from scratch
    checkpoint_load_seconds: float | None = None
    init_seconds: float | None = None


# -- checkpoints and disk -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CheckpointCorrupt(Event):
    KIND = "checkpoint_corrupt"
    step: int | None
    path: str
    problem: str
    action: str
    reported_by_job: str | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointComplete(Event):
    KIND = "checkpoint_complete"
    step: int
    saved_at: float | None = None
    size_bytes: int | None = None


@dataclass(frozen=True, kw_only=True)
class Disk(Event):
    KIND = "disk"
    level: str  # ok, warning, critical
    free_bytes: int | None = None
    expected_bytes: int | None = None
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class DiskFullPaused(Event):
    """A failure seen while the checkpoint filesystem cannot hold the next checkpoint: the run
    pauses (no restart, no exclusion, no crash-loop count) until space is back."""

    KIND = "disk_full_paused"
    mount: str
    free_bytes: int
    needed_bytes: int
    job_id: str | None = None
    cause: str = ""  # the failure seen while the disk was full
    to_delete: list[dict[str, Any]] = field(default_factory=list)  # {"path", "bytes", "why"}


@dataclass(frozen=True, kw_only=True)
class DiskFullResumed(Event):
    KIND = "disk_full_resumed"
    mount: str
    free_bytes: int
    needed_bytes: int
    paused_seconds: float | None = None
    how: str = ""


# -- operators ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RequestAccepted(Event):
    KIND = "request_accepted"
    request: str
    user: str
    uid: int
    reason: str
    now: bool = False
    basis: str | None = None


@dataclass(frozen=True, kw_only=True)
class RequestRefused(Event):
    KIND = "request_refused"
    request: str
    user: str
    uid: int
    why: str


@dataclass(frozen=True, kw_only=True)
class Quarantined(Event):
    KIND = "quarantined"
    file: str
    why: str
    user: str
    uid: int
    kind: str  # what the file was: regular file, fifo, symbolic link, ...
    size: int
    moved_to: str | None = None
    deleted: str | None = None
    left_in_place: str | None = None


@dataclass(frozen=True, kw_only=True)
class QuarantineSkipped(Event):
    KIND = "quarantine_skipped"
    file: str
    why: str


@dataclass(frozen=True, kw_only=True)
class NodesCleared(Event):
    """An operator's authenticated nodes-clear request, carried out."""

    KIND = "nodes_cleared"
    by: str
    reason: str
    asked: list[str]  # the nodes the request named (empty with all_nodes)
    all_nodes: bool = False
    removed: list[str] = field(default_factory=list)  # those that were on the list
    excluded: list[str] = field(default_factory=list)  # the whole list after this change


@dataclass(frozen=True, kw_only=True)
class NodesClearFailed(Event):
    """The list could not be changed (its lock, the disk): the request stays and is tried again."""

    KIND = "nodes_clear_failed"
    by: str
    error: str


@dataclass(frozen=True, kw_only=True)
class TrustProblem(Event):
    """A file or folder the controller trusts became writable by someone else during the run,
    found when a new job folder appeared (operators.check_trust): each problem says the fix."""

    KIND = "trust_problem"
    job_ids: list[str]  # the new job folders that made the controller look again
    problems: list[str]


@dataclass(frozen=True, kw_only=True)
class KillRequested(Event):
    KIND = "kill_requested"
    by: str | None
    reason: str | None
    now: bool = False


@dataclass(frozen=True, kw_only=True)
class KillWithdrawn(Event):
    KIND = "kill_withdrawn"


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    KIND = "resumed"
    by: str | None
    reason: str | None
    previous: str


@dataclass(frozen=True, kw_only=True)
class ResumeIgnored(Event):
    KIND = "resume_ignored"
    by: str | None
    reason: str | None
    why: str


# -- auxiliary jobs (runctl preprocess|convert|export-hf|eval) ------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AuxSubmitted(Event):
    KIND = "aux_submitted"
    kind: str  # preprocess, convert, export-hf, eval
    job_id: str
    where: str
    user: str
    host: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    log: str = ""
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class AuxEnded(Event):
    kind: str
    job_id: str
    where: str
    user: str
    log: str = ""
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    state: str | None = None
    seconds: float | None = None
    error_log: str | None = None
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class AuxFinished(AuxEnded):
    KIND = "aux_finished"


@dataclass(frozen=True, kw_only=True)
class AuxFailed(AuxEnded):
    KIND = "aux_failed"


@dataclass(frozen=True, kw_only=True)
class AuxDetached(AuxEnded):
    """The command waiting for the job was interrupted; the job runs on."""

    KIND = "aux_detached"
