"""What the controller's policy may ask for: plain values, applied in one place
(`Controller.apply` in supervisor.py), in the order the policy lists them.

The policy modules (policy.py, recovery.py, kill_resume.py) decide; they never call the scheduler,
write a file or send a notification. That keeps every decision testable with plain data, and lets
the simulation (orchestrator/simulation) drive exactly the code that runs on a login node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .state import RunStatus


@dataclass(frozen=True)
class Record:
    """One line of events.jsonl."""

    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Notify:
    kind: str  # one of notifications.events: failure, hang, restart, kill, crash_loop, disk, finish
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cancel:
    job_ids: tuple[str, ...]
    why: str  # becomes each job's outcome


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
class Restart:
    """Run again from `resume_step`: the queued successor with the new exclude list, or a new job."""

    failed_job_id: str
    cause: str
    failure_time: float  # wall clock of the login node
    last_step: int | None
    resume_step: int
    work_lost_seconds: float | None
    restarts_without_progress: int  # the counter after this restart


@dataclass(frozen=True)
class Relaunch(Restart):
    """Run again from `resume_step` inside the running job: the launcher leaves out `leave_out`
    (maybe none), takes as many spares and starts launch `launch` + 1 (orchestrator/allocation.py)."""

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
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SetStatus:
    status: RunStatus


@dataclass(frozen=True)
class ResetProgressCounter:
    """`runctl resume` forgives the restarts counted towards a crash loop."""


@dataclass(frozen=True)
class PublishRequest:
    """Make an authenticated request (requests.OperatorRequest) visible to the trainer: accepted/<name>."""

    request: Any


@dataclass(frozen=True)
class WithdrawRequest:
    """Remove accepted/<name> (and, with `consumed`, the operator's control/<name>)."""

    name: str
    consumed: bool = False


Action = (
    Record
    | Notify
    | Cancel
    | DumpStacks
    | Exclude
    | Restart
    | Relaunch
    | Submit
    | Stop
    | SetStatus
    | ResetProgressCounter
    | PublishRequest
    | WithdrawRequest
)
