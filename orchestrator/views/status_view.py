"""The facts `runctl status` shows, as one typed value: the screen (views.status_screen), the
JSON of `runctl status --json` and the live views read this shape, built once by
views.dashboard.status_data.

    view = status_data(run_dir, scheduler)
    view.dashboard.training.step, view.jobs[0].state      # typed, for the screen
    json.dumps(view.to_json())                             # the same facts, for scripts

The JSON keeps each record's field names and order; what a person cannot act on is left out
rather than shown as null only where the JSON always did so (NextDue).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.contract.events import Event
from orchestrator.contract.state import DiskPause, PoolStatus

if TYPE_CHECKING:  # operate.runs pulls in the config models; the view only names its rows
    from orchestrator.operate.runs import JobRow


@dataclass(frozen=True)
class Training:
    step: int | None
    total_steps: int | None
    loss: float | None
    tokens_per_s: float | None
    tflops_per_gpu: float | None
    eta_seconds: float | None
    metrics_age: float | None  # seconds since the last step's metrics were written


@dataclass(frozen=True)
class NextDue:
    """When the next checkpoint is due, by step and by time; None: not due that way (left out
    of the JSON)."""

    step: int | None = None
    in_seconds: float | None = None  # negative: overdue


@dataclass(frozen=True)
class CheckpointView:
    dir: str
    last_step: int | None
    age_seconds: float | None
    bytes: int | None
    next_due: NextDue


@dataclass(frozen=True)
class NodeBeats:
    """One node of the beating job: its oldest rank beat's age, its ranks, phase and step."""

    age: float
    rank_count: int
    phase: str | None = None
    step: int | None = None


@dataclass(frozen=True)
class DiskView:
    level: str  # "ok" or the controller's disk level
    message: str


@dataclass(frozen=True)
class StorageStall:
    """The running job's node the controller's probe found blocked on the filesystem."""

    node: str
    why: str
    time: float
    age_seconds: float = 0.0  # since the probe found it
    tolerance_seconds: float | None = None  # watchdog.stall_tolerance_seconds (None: no config)


@dataclass(frozen=True)
class GoodputWindow:
    goodput: float | None
    fraction: dict[str, float]


@dataclass(frozen=True)
class Goodput:
    whole_run: GoodputWindow
    last_24h: GoodputWindow


@dataclass(frozen=True)
class Dashboard:
    run: str
    run_dir: str
    status: str  # a RunStatus value
    controller: dict[str, Any] | None  # the lock holder's record (pid, host, ...); None: no controller
    controller_failing_passes: int
    last_pass_age: float | None
    restarts: int
    training: Training
    checkpoint: CheckpointView
    heartbeat_job: str | None
    heartbeat_job_running: bool
    nodes: dict[str, NodeBeats]  # sorted by name
    ranks_in_job: int
    ranks_beating: int
    dead_after: float
    late_after: float
    excluded: dict[str, dict[str, Any]]  # node -> the exclude list's entry, as written
    events: tuple[Event, ...]  # the most recent, oldest first
    stop_message: str | None
    disk: DiskView
    storage_stall: StorageStall | None
    disk_pause: DiskPause | None
    goodput: Goodput | None


@dataclass(frozen=True)
class StatusView:
    run_dir: str
    name: str
    now: float
    jobs: tuple[JobRow, ...]
    dashboard: Dashboard
    stragglers: dict[str, Any]  # the controller's straggler scores, as it saved them
    pool: PoolStatus | None
    scheduler_problem: str | None  # why the scheduler was not asked; None: it was
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain data for `runctl status --json`."""
        return plain(self)


def plain(value: Any) -> Any:
    """A view as JSON-ready data: records as dicts in field order, events as their records."""
    if isinstance(value, Event):
        return value.to_dict()
    if isinstance(value, NextDue):
        return {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
