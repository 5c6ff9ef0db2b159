"""The controller's memory: state.json (atomic write-and-rename) and events.jsonl (append-only).

state.json is what a restarted controller resumes from: the job chain it manages, the submission
it was about to make (intent written *before* sbatch, so a crash between the two is reconciled
instead of submitting twice), restart counters and the learned phase durations.
events.jsonl is the history for people and for `runctl report`: one JSON object a line, each
with `time` and `event`.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.protocol import RunPaths, append_jsonl, atomic_write_json, read_json, read_jsonl

STATE_VERSION = 1


class RunStatus(str, enum.Enum):
    """What the controller thinks the run is doing (its value is what state.json holds)."""

    WAITING = "waiting"  # nothing submitted yet / job pending
    RUNNING = "running"
    RESTARTING = "restarting"
    KILLING = "killing"  # kill requested, the trainer is saving and stopping
    KILLED = "killed"  # stopped by the kill switch: never restart until `runctl resume`
    FINISHED = "finished"
    CRASH_LOOP = "crash_loop"  # K restarts without a new checkpoint: stopped, a person must look
    CONFIG_ERROR = "config_error"  # the trainer refused the config: restarting cannot help

    def __str__(self) -> str:
        return self.value

    @property
    def stopped(self) -> bool:
        return self in STOPPED


STOPPED = frozenset({RunStatus.KILLED, RunStatus.FINISHED, RunStatus.CRASH_LOOP, RunStatus.CONFIG_ERROR})
RunStatus.STOPPED = STOPPED  # type: ignore[attr-defined]  # `status in RunStatus.STOPPED`

_ACTIVE = (RunStatus.WAITING, RunStatus.RUNNING, RunStatus.RESTARTING)
# The one table of allowed status changes; anything else is a controller bug and raises.
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.WAITING: frozenset({*_ACTIVE, RunStatus.KILLING, *STOPPED}),
    RunStatus.RUNNING: frozenset({*_ACTIVE, RunStatus.KILLING, *STOPPED}),
    RunStatus.RESTARTING: frozenset({*_ACTIVE, RunStatus.KILLING, *STOPPED}),
    # A kill ends in KILLED, or goes back to supervision when the request is withdrawn.
    RunStatus.KILLING: frozenset({RunStatus.KILLED, RunStatus.RUNNING, RunStatus.WAITING}),
    # Stopped runs move only by `runctl resume`; a finished run never moves again.
    RunStatus.KILLED: frozenset({RunStatus.WAITING}),
    RunStatus.CRASH_LOOP: frozenset({RunStatus.WAITING}),
    RunStatus.CONFIG_ERROR: frozenset({RunStatus.WAITING}),
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
class ControllerState:
    status: RunStatus = RunStatus.WAITING
    jobs: list[JobRecord] = field(default_factory=list)
    # {"token", "time", "reason", "exclude", "job_name"}: written before sbatch, cleared after.
    pending_submit: dict[str, Any] | None = None
    restarts: int = 0
    restarts_without_progress: int = 0
    checkpoint_step_at_last_restart: int | None = None
    observed_durations: dict[str, float] = field(default_factory=dict)
    timeouts_job: str | None = None  # the job observed_durations were learned from (per-job learning)
    # The restart being followed until its first step: failure/detection/restart times, resume step.
    recovering: dict[str, Any] | None = None
    disk_level: str = "ok"
    damage_reports_seen: int = 0  # lines of checkpoints/damaged.jsonl already relayed as events
    unhealthy_relayed: list[str] = field(default_factory=list)  # "<job>:<node>" health failures relayed
    stragglers: dict[str, Any] = field(default_factory=dict)  # per-node scores (stragglers.py), for status
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
    def from_dict(cls, data: dict[str, Any]) -> ControllerState:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "jobs"}
        state = cls(**known)
        state.status = RunStatus(state.status)
        state.jobs = [JobRecord.from_dict(j) for j in data.get("jobs", [])]
        return state


def load_state(paths: RunPaths) -> ControllerState:
    data = read_json(paths.state)
    if not data:
        return ControllerState()
    return ControllerState.from_dict(data)


def save_state(paths: RunPaths, state: ControllerState) -> None:
    state.controller = {"pid": os.getpid(), "host": socket.gethostname(), "saved_at": time.time()}
    atomic_write_json(paths.state, state.to_dict(), mode=0o664)


def record_event(paths: RunPaths, event: str, **fields: Any) -> dict[str, Any]:
    record = {"time": fields.pop("time", time.time()), "event": event, **fields}
    append_jsonl(paths.events, record)
    return record


def read_events(paths: RunPaths, last: int | None = None) -> list[dict[str, Any]]:
    events = read_jsonl(paths.events)
    return events[-last:] if last else events
