"""What the controller's policy may ask for: plain values, applied in one place
(applier.Applier.apply), in the order the policy lists them.

The deciding modules (jobs.py, upkeep.py, launches.py, policy.py, recovery.py, kill_resume.py,
stragglers.py, health_policy.py) never call the scheduler, write a file, send a notification or change the
controller's state: what should change is an action here, the bookkeeping of state.json
included. That keeps every decision testable with plain data, and lets the simulation drive
exactly the code that runs on a login node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from orchestrator.contract.directive import Rollback
from orchestrator.contract.events import Event
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import DiskPause, PoolStatus, Recovery, RunStatus
from orchestrator.views.event_text import sentence


@dataclass(frozen=True)
class Record:
    """One line of events.jsonl (stamped with the controller's clock when applied)."""

    event: Event


@dataclass(frozen=True)
class Notify:
    """A notification that is not an event's (a status or a condition, worded where it is found)."""

    kind: Notice
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cancel:
    job_ids: tuple[str, ...]
    why: str  # becomes each job's outcome


@dataclass(frozen=True)
class Hold:
    """Queued jobs must not start (the run is paused): `scontrol hold`."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class Release:
    job_ids: tuple[str, ...]


@dataclass(frozen=True)
class DumpStacks:
    job_id: str


@dataclass(frozen=True)
class Exclude:
    nodes: tuple[str, ...]
    reason: str
    job_id: str
    cause: str


@dataclass(frozen=True)
class ReleaseExclusions:
    """Nodes back in the pool before an operator asked: their probation expired, or a short pool
    released the oldest (pool.py). Queued jobs get the new exclude list too."""

    nodes: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class ClearExclusions:
    """An operator's authenticated nodes-clear: take `nodes` (None: all) off the exclude list,
    then consume the request; when the list cannot be changed the request stays for the next pass."""

    nodes: tuple[str, ...] | None
    by: str
    reason: str


@dataclass(frozen=True)
class RestartRun:
    """Run again from `resume_step`: the queued successor with the new exclude list, or a new job."""

    failed_job_id: str
    cause: str
    failure_time: float  # wall clock of the login node
    last_step: int | None
    resume_step: int
    work_lost_seconds: float | None
    restarts_without_progress: int  # the counter after this restart


@dataclass(frozen=True)
class Relaunch(RestartRun):
    """Run again from `resume_step` inside the running job: the launcher leaves out `leave_out`
    (maybe none), takes as many spares and starts launch `launch` + 1 (contract.allocation)."""

    launch: int = 0  # the launch that failed
    leave_out: tuple[str, ...] = ()
    spares_left: int = 0  # after this relaunch


@dataclass(frozen=True)
class Submit:
    reason: str


@dataclass(frozen=True)
class Stop:
    """The run stops: finished, killed, crash loop or config error."""

    status: RunStatus
    notify_kind: str
    message: str
    by: str | None = None  # the operator whose request stopped it


@dataclass(frozen=True)
class SetStatus:
    status: RunStatus


@dataclass(frozen=True)
class PublishRequest:
    """Make an authenticated request (requests.OperatorRequest) visible to the trainer: accepted/<name>."""

    request: Any


@dataclass(frozen=True)
class WithdrawRequest:
    """Remove accepted/<name> (and, with `consumed`, the operator's control/<name>)."""

    name: str
    consumed: bool = False


@dataclass(frozen=True)
class Consume:
    """Remove the operator's control/<name> once acted upon (accepted/ is left as it is)."""

    name: str


@dataclass(frozen=True)
class PublishDirective:
    """Write the rollback directive to accepted/rollback, where the trainer reads it at its start."""

    directive: Rollback


# -- the bookkeeping of state.json ------------------------------------------------------------------
@dataclass(frozen=True)
class AdoptJob:
    """A job of the run the controller did not submit itself (`runctl submit`'s chain, or a
    controller that died between sbatch and recording it): tracked from now on."""

    job_id: str
    why: str
    clears_intent: bool = False


@dataclass(frozen=True)
class UpdateJob:
    """What the scheduler says of a job now (None: unchanged)."""

    job_id: str
    state: str
    nodes: tuple[str, ...] = ()
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    slurm_start: float | None = None
    requeued: bool = False  # SLURM requeued it under the same id: its old beats mean nothing now


@dataclass(frozen=True)
class SetOutcome:
    job_id: str
    outcome: str


@dataclass(frozen=True)
class FollowRecovery:
    """The restart being followed: where rank 0 says it resumed from (None: done, stop following,
    the job has trained for `trained_seconds`: its steps since the resume times its step time, as
    its beat reports them, so that a pass that comes late does not make the training look late)."""

    recovery: Recovery | None
    trained_seconds: float = 0.0


class _Keep:
    """A field of ChangeState left as it is."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()


@dataclass(frozen=True)
class ChangeState:
    """state.json's own bookkeeping from one decision: every field given is set as it is (a
    rollback directive as its dict), the others are KEEP."""

    disk_level: str = KEEP
    disk_pause: DiskPause | None = KEEP  # None: the pause is over
    pool: PoolStatus = KEEP  # pool.py's summary: what `runctl status` and `doctor` show
    stragglers: dict[str, Any] = KEEP  # stragglers.StragglerScorer.summary, for `runctl status`
    metrics_offset: int = KEEP  # metrics.jsonl judged up to this byte (a restarted controller goes on)
    pending_rollback: Rollback | None = KEEP  # the directive to write once the stopping job is gone
    rollback_awaited: str | None = KEEP  # the directive whose application rank 0 should report
    # After a rollback to step S: metrics.jsonl's new history starts at or before S + 1; None once it has.
    new_history_by_step: int | None = KEEP
    restarts_without_progress: int = KEEP  # 0: `runctl resume` or a rollback forgives the crash-loop count
    unhealthy_relayed: list[str] = KEEP  # "<job>:<node>" of the launcher's unhealthy nodes already said
    damage_reports_seen: int = KEEP  # the trainer's damage reports already said
    rollback_times: list[float] = KEEP  # the automatic rollbacks' times, counted by the budget

    def changes(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not KEEP}


Action = (
    Record
    | ChangeState
    | Notify
    | Cancel
    | Hold
    | Release
    | DumpStacks
    | Exclude
    | ClearExclusions
    | ReleaseExclusions
    | RestartRun
    | Relaunch
    | Submit
    | Stop
    | SetStatus
    | PublishRequest
    | WithdrawRequest
    | Consume
    | PublishDirective
    | AdoptJob
    | UpdateJob
    | SetOutcome
    | FollowRecovery
)


def alert(event: Event, notice: Notice) -> list[Action]:
    """An event and the notification that words it by the event's own sentence (views/event_text):
    the pager says what `runctl events` and `runctl status` say. The details are its plain values
    (a list of 16 ranks or a traceback stays in events.jsonl)."""
    details = {k: v for k, v in event.details().items() if isinstance(v, (str, int, float)) and k != "time"}
    return [Record(event), Notify(notice, sentence(event), details)]
