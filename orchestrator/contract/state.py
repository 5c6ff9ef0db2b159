"""state.json: the controller's memory, written by the owner's controller only (atomic
write-and-rename) and read by a restarted controller, `runctl status`, goodput and the exporter.

It holds the job chain the controller manages, the submission it was about to make (the intent is
written *before* sbatch, so a crash between the two is reconciled instead of submitting twice),
restart counters, the learned phase durations, the restart being followed to its first step, and
training health's bookkeeping: how far metrics.jsonl was judged, the automatic rollbacks (their
budget), the rollback planned while the job stops, and the one awaited from the trainer.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from .files import ContractError, atomic_write_json, check_version, read_json
from .paths import RunPaths
from .values import int_or_none, is_number, number_or_none

STATE_VERSION = 1


class RunStatus(str, enum.Enum):
    """What the controller thinks the run is doing (its value is what state.json holds)."""

    WAITING = "waiting"  # nothing submitted yet / job pending
    RUNNING = "running"
    RESTARTING = "restarting"
    KILLING = "killing"  # kill requested, the trainer is saving and stopping
    KILLED = "killed"  # stopped by the kill switch: never restart until `runctl resume`
    # Training health (controller/health_policy.py): the trainer is asked to save and stop through
    # the kill switch's accepted/kill, then the run is paused, or goes on from an earlier checkpoint.
    PAUSING = "pausing"
    PAUSED = "paused_for_health"  # stopped: a person looks (`runctl health`), then resume or rollback
    ROLLING_BACK = "rolling_back"
    FINISHED = "finished"
    CRASH_LOOP = "crash_loop"  # K restarts without a new checkpoint: stopped, a person must look
    CONFIG_ERROR = "config_error"  # the trainer refused the config: restarting cannot help
    # Paused: the checkpoint filesystem cannot hold the next checkpoint (state.disk_pause says
    # where, how much and what to delete). Not stopped: it resumes by itself once space is back.
    DISK_FULL = "disk_full"

    def __str__(self) -> str:
        return self.value

    @property
    def stopped(self) -> bool:
        return self in STOPPED

    @property
    def stopping(self) -> bool:
        """A graceful stop is under way (the trainer saves and exits 17): nothing is restarted."""
        return self in STOPPING

    @property
    def active(self) -> bool:
        """Supervised as usual: neither stopped nor stopping."""
        return self in ACTIVE


STOPPED = frozenset(
    {RunStatus.KILLED, RunStatus.FINISHED, RunStatus.CRASH_LOOP, RunStatus.CONFIG_ERROR, RunStatus.PAUSED}
)
STOPPING = frozenset({RunStatus.KILLING, RunStatus.PAUSING, RunStatus.ROLLING_BACK})
ACTIVE = frozenset({RunStatus.WAITING, RunStatus.RUNNING, RunStatus.RESTARTING, RunStatus.DISK_FULL})
RunStatus.STOPPED = STOPPED  # type: ignore[attr-defined]  # `status in RunStatus.STOPPED`

_HEALTH_STOPS = (RunStatus.PAUSING, RunStatus.ROLLING_BACK)
# The one table of allowed status changes; anything else is a controller bug and raises.
# DISK_FULL is ACTIVE (supervised: requests, health, the disk checked every pass) but no job is
# ensured while state.disk_pause is set; it goes back to WAITING by itself once the disk has room
# (controller/disk_pause.py).
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    **{status: frozenset({*ACTIVE, RunStatus.KILLING, *_HEALTH_STOPS, *STOPPED}) for status in ACTIVE},
    # A kill ends in KILLED, or goes back to supervision when the request is withdrawn.
    RunStatus.KILLING: frozenset({RunStatus.KILLED, RunStatus.RUNNING, RunStatus.WAITING}),
    # A pause ends in PAUSED; an operator's kill or rollback takes over. A rollback goes on as a
    # new job (WAITING), or is paused (nothing to go back to), or killed.
    RunStatus.PAUSING: frozenset({RunStatus.PAUSED, RunStatus.KILLING, RunStatus.ROLLING_BACK}),
    RunStatus.ROLLING_BACK: frozenset({RunStatus.WAITING, RunStatus.PAUSED, RunStatus.KILLING}),
    # Stopped runs move only by `runctl resume` or `runctl rollback`; a finished run never moves again.
    RunStatus.KILLED: frozenset({RunStatus.WAITING, RunStatus.ROLLING_BACK}),
    RunStatus.CRASH_LOOP: frozenset({RunStatus.WAITING, RunStatus.ROLLING_BACK}),
    RunStatus.CONFIG_ERROR: frozenset({RunStatus.WAITING, RunStatus.ROLLING_BACK}),
    RunStatus.PAUSED: frozenset({RunStatus.WAITING, RunStatus.ROLLING_BACK}),
    RunStatus.FINISHED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass
class JobRecord:
    job_id: str
    submitted_at: float
    state: str = "pending"
    reason: str = "submitted"  # why this job exists: "initial", "chain", "restart", "resume"
    exclude: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    outcome: str | None = None  # see detection.Outcome, once the job has ended
    requeues: int = 0  # times SLURM requeued it under the same id
    slurm_start: float | None = None  # start time as SLURM reports it (changes when it is requeued)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class SubmitIntent:
    """What the controller was about to submit (written to state.json before sbatch runs)."""

    token: str
    time: float
    reason: str
    job_name: str
    exclude: list[str] = field(default_factory=list)
    pid: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubmitIntent:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class Recovery:
    """A restart followed until the run trains again (the `first_step_after_restart` event)."""

    job_id: str
    failure_time: float
    restart_time: float
    resume_step: int
    resumed_from: int | None = None  # where rank 0 says it resumed (None: not told yet)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recovery:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class PoolStatus:
    """The node pool as the controller last judged it (controller/pool.py)."""

    short: bool = False  # fewer usable nodes than the job's nodes: the next job cannot start
    usable: int = 0  # schedulable in the partition, not excluded
    needed: int = 0  # the job's nodes (spares not counted)
    since: float | None = None  # the controller's clock when it became short
    message: str = ""  # what is missing and what to do, for status and doctor
    spares_next: int | None = None  # spares the next job asks for; None: as configured

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolStatus:
        """Tolerant: a field of the wrong type is left at its default (state.json is the owner's)."""
        return cls(
            short=data.get("short") is True,
            usable=int_or_none(data.get("usable")) or 0,
            needed=int_or_none(data.get("needed")) or 0,
            since=number_or_none(data.get("since")),
            message=data["message"] if isinstance(data.get("message"), str) else "",
            spares_next=int_or_none(data.get("spares_next")),
        )


@dataclass
class DiskPause:
    """Why the run is paused on a full disk (RunStatus.DISK_FULL), refreshed every pass."""

    mount: str  # the mount point of the checkpoint filesystem
    free_bytes: int
    needed_bytes: int  # the next checkpoint's expected size plus the margin
    since: float  # wall clock of the login node
    job_id: str | None = None  # the job that failed on it
    to_delete: list[dict[str, Any]] = field(default_factory=list)  # {"path", "bytes", "why"}
    held_jobs: list[str] = field(default_factory=list)  # queued jobs held by the pause (released after)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiskPause:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class ControllerState:
    status: RunStatus = RunStatus.WAITING
    jobs: list[JobRecord] = field(default_factory=list)
    pending_submit: SubmitIntent | None = None  # written before sbatch, cleared after
    restarts: int = 0
    restarts_without_progress: int = 0
    checkpoint_step_at_last_restart: int | None = None
    # The crash-loop rule's evidence (controller/recovery.py): when the job after the last restart
    # first trained (wall clock; None until it does) and the step the failure before it reached.
    training_since: float | None = None
    last_failure_step: int | None = None
    recovering: Recovery | None = None  # the restart being followed until its first step
    disk_level: str = "ok"
    damage_reports_seen: int = 0  # lines of checkpoints/damaged.jsonl already relayed as events
    unhealthy_relayed: list[str] = field(default_factory=list)  # "<job>:<node>" health failures relayed
    stragglers: dict[str, Any] = field(default_factory=dict)  # per-node scores (stragglers.py), for status
    # Nodes a hang suspected without proof (controller/blame.py): node -> [job id, controller clock].
    hang_suspects: dict[str, list] = field(default_factory=dict)
    # Training health. metrics_offset: metrics.jsonl was judged up to this byte (None: never; a new
    # controller starts from the file's end). rollback_times: the controller's clock at each
    # automatic rollback (the budget). pending_rollback: the directive (contract.directive.Rollback
    # as a dict) to write once the stopping job is gone. rollback_awaited: its id, until rank 0 says
    # it applied it. new_history_by_step: after a rollback to step S, the new history's first step
    # is at most S + 1; the steps above it read before that are the stopped job's (abandoned) tail.
    metrics_offset: int | None = None
    rollback_times: list[float] = field(default_factory=list)
    pending_rollback: dict[str, Any] | None = None
    rollback_awaited: str | None = None
    new_history_by_step: int | None = None
    # The node pool as last judged (controller/pool.py); `runctl status` and `runctl doctor` show a
    # short pool. None: not judged yet (SLURM not asked, or it could not tell).
    pool: PoolStatus | None = None
    disk_pause: DiskPause | None = None  # set while the run is paused on a full disk
    last_pass: float | None = None
    controller: dict[str, Any] = field(default_factory=dict)
    version: int = STATE_VERSION

    def move_to(self, status: RunStatus | str) -> bool:
        """Change the run's status along TRANSITIONS; True when it changed."""
        new = RunStatus(status)
        if new == self.status:
            return False
        if new not in TRANSITIONS[self.status]:
            raise IllegalTransition(
                f"run status {self.status.value} -> {new.value} is not allowed (TRANSITIONS in state.py)"
            )
        self.status = new
        return True

    def job(self, job_id: str) -> JobRecord | None:
        for record in self.jobs:
            if record.job_id == str(job_id):
                return record
        return None

    def live_jobs(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.outcome is None]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: Any) -> ControllerState:
        if not isinstance(data, dict):
            raise ContractError("state.json: expected a JSON object")
        check_version(data, "state.json", STATE_VERSION)
        nested = ("jobs", "pending_submit", "recovering", "pool", "disk_pause", "hang_suspects")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k not in nested}
        state = cls(**known)
        state.status = RunStatus(state.status)
        state.jobs = [JobRecord.from_dict(j) for j in data.get("jobs", []) if isinstance(j, dict)]
        if isinstance(data.get("pending_submit"), dict):
            state.pending_submit = SubmitIntent.from_dict(data["pending_submit"])
        if isinstance(data.get("recovering"), dict):
            state.recovering = Recovery.from_dict(data["recovering"])
        if isinstance(data.get("pool"), dict):
            state.pool = PoolStatus.from_dict(data["pool"])
        if isinstance(data.get("disk_pause"), dict):
            state.disk_pause = DiskPause.from_dict(data["disk_pause"])
        suspects = data.get("hang_suspects")
        state.hang_suspects = {
            str(node): [str(seen[0]), float(seen[1])]
            for node, seen in (suspects.items() if isinstance(suspects, dict) else ())
            if isinstance(seen, list) and len(seen) == 2 and is_number(seen[1])
        }
        return state


def load_state(paths: RunPaths) -> ControllerState:
    """The run's state; a fresh one when there is none yet. ContractError when it is malformed,
    ContractVersionError when a newer runctl wrote it."""
    data = read_json(paths.state)
    if not data:
        return ControllerState()
    return ControllerState.from_dict(data)


def save_state(paths: RunPaths, state: ControllerState) -> None:
    state.controller = {"pid": os.getpid(), "host": socket.gethostname(), "saved_at": time.time()}
    atomic_write_json(paths.state, state.to_dict(), mode=0o644)  # only the owner writes it (docs/security.md)
