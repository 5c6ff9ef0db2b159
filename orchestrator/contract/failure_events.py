"""events.jsonl records of failures and recovery: an incident and its cause, the restart or
relaunch that answers it, exclusions, stack dumps, the run stopping, and stragglers. Same rules
as events.py (registered by kind on import; the contract package imports this module, so
`read_events` always knows them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .event_base import Event


@dataclass(frozen=True, kw_only=True)
class NodeProbed(Event):
    """A node whose every rank went silent while the job ran was asked (controller/probe.py):
    `verdict` lost, dead, stall or undecided, `why` in words, `ranks` rank -> process state.
    `early`: asked after one late beat; unless "lost", such an answer stands until the node, still
    silent, is asked again (controller/probing.py). `before_first_beat`: asked because none of its
    ranks had beaten in a launch whose others had (no ranks to look at: its filesystem answers)."""

    KIND = "node_probed"
    job_id: str
    node: str
    verdict: str
    why: str
    fs_answers: bool | None = None
    ranks: dict[str, str] = field(default_factory=dict)
    early: bool = False
    before_first_beat: bool = False


@dataclass(frozen=True, kw_only=True)
class JobWideStall(Event):
    KIND = "job_wide_stall"
    job_id: str
    ranks_stalled: int
    world_size: int
    waiting_seconds: float
    why: str


@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    """One incident: `cause` is dead_rank, missing_rank, hang, job_stall, job_failed or launch_failed."""

    KIND = "failure"
    job_id: str
    cause: str
    failure_time: float
    detection_time: float
    last_step: int | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)  # detection.Finding.as_dict(), a sample
    ranks_affected: int | None = None
    # A hang's ranks behind the others (detection.behind: Finding.as_dict()), and why they, or
    # nobody, are named.
    suspects: list[dict[str, Any]] = field(default_factory=list)
    suspects_why: str | None = None
    exit_code: int | None = None
    srun_says: str | None = None
    host: str | None = None
    launch: int | None = None
    nodes: list[str] = field(default_factory=list)
    # What the failing rank itself printed last (rank_output.RankError): `rank 3: ValueError: ...`
    # and its traceback, made inert.
    rank_error: str | None = None
    rank_error_lines: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Restart(Event):
    KIND = "restart"
    job_id: str  # the job that trains next (the failed one itself when in_allocation)
    in_allocation: bool
    failed_job_id: str
    cause: str
    failure_time: float
    detection_time: float
    restart_time: float
    resume_step: int
    last_step: int | None = None
    work_lost_steps: int | None = None
    work_lost_seconds: float | None = None
    excluded: list[str] = field(default_factory=list)
    how: str = ""
    restarts_without_progress: int = 0


@dataclass(frozen=True, kw_only=True)
class FirstStepAfterRestart(Event):
    KIND = "first_step_after_restart"
    job_id: str
    step: int
    resume_step: int
    resumed_from: int
    seconds_since_failure: float
    seconds_since_restart: float
    # Rank 0's start, part by part (trainer/__main__.py), and the bytes every rank's load read by
    # where they came from: local, peer (a buddy replica) or shared.
    start_phases: dict[str, float] = field(default_factory=dict)
    restore_bytes: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CheckpointCopyDropped(Event):
    """A node-local or buddy copy of a checkpoint file failed its check (sha256 or probe) at a
    restore: `copy` names the node and the file; the next copy in order was used."""

    KIND = "checkpoint_copy_dropped"
    job_id: str
    launch: int
    copy: str


@dataclass(frozen=True, kw_only=True)
class RelaunchNotPossible(Event):
    KIND = "relaunch_not_possible"
    job_id: str
    why: str


@dataclass(frozen=True, kw_only=True)
class ExclusionCapped(Event):
    KIND = "exclusion_capped"
    job_id: str
    cause: str
    nodes: list[str]
    why: str


@dataclass(frozen=True, kw_only=True)
class NodesExcluded(Event):
    KIND = "nodes_excluded"
    nodes: list[str]
    job_id: str
    cause: str
    excluded: list[str] = field(default_factory=list)  # the whole list after this change
    until: float | None = None  # the probation's end (controller clock); None: until cleared


@dataclass(frozen=True, kw_only=True)
class ExcludeFailed(Event):
    KIND = "exclude_failed"
    nodes: list[str]
    error: str


@dataclass(frozen=True, kw_only=True)
class NodesUnhealthy(Event):
    KIND = "nodes_unhealthy"
    job_id: str
    nodes: dict[str, str]  # node: why
    excluded: list[str] = field(default_factory=list)
    why_not: str | None = None


@dataclass(frozen=True, kw_only=True)
class AllocationUnreadable(Event):
    KIND = "allocation_unreadable"
    job_id: str
    error: str


@dataclass(frozen=True, kw_only=True)
class RunStopped(Event):
    KIND = "run_stopped"
    status: str
    message: str
    by: str | None = None


@dataclass(frozen=True, kw_only=True)
class StacksDumped(Event):
    KIND = "stacks_dumped"
    job_id: str
    files: list[str] = field(default_factory=list)
    ranks_answered: int = 0
    ranks_expected: int = 0
    directory: str = ""
    flight_recorder: list[str] = field(default_factory=list)
    flight_recorder_dumps: int = 0


@dataclass(frozen=True, kw_only=True)
class StacksNotDumped(Event):
    KIND = "stacks_not_dumped"
    job_id: str
    error: str


@dataclass(frozen=True, kw_only=True)
class StragglerChange(Event):
    node: str
    job_id: str
    score: float | None = None  # compute time over its peers' median, or over its own history
    vs_median: float | None = None
    vs_history: float | None = None
    compute_seconds: float | None = None
    slow_for_seconds: float | None = None
    step: int | None = None
    threshold: float | None = None
    straggler_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class Straggler(StragglerChange):
    KIND = "straggler"
    # watchdog.straggler_exclude: left out of every later job (else a person has it drained);
    # None where the record does not say.
    excluded_next: bool | None = None


@dataclass(frozen=True, kw_only=True)
class StragglerRecovered(StragglerChange):
    KIND = "straggler_recovered"
