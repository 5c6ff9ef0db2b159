"""Why the controller acted: every fault class, declared once, with what it answers.

A `Cause` is written into events (`failure.cause`, `restart.cause`, an exclusion's `cause`) and
read back by people and tools, so its value is part of the run-directory contract; the code
compares members, never raw strings (tests/unit/test_cause_strings.py). Each cause has one row
of `RESPONSES`: what the controller does, the words a sentence uses for it, the notification it
sends, and whether its incident may blame nodes (exclude them from later jobs).

Adding a fault class: a member here and its row, a detector that returns it, a sentence for its
event (orchestrator/views/event_text) and a simulation scenario (docs/architecture.md).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .codes import ExitCode
from .severity import Notice


class Cause(str, enum.Enum):
    DEAD_RANK = "dead_rank"  # a node's ranks stopped beating
    MISSING_RANK = "missing_rank"  # ranks that never beat after the launch
    HANG = "hang"  # ranks beat but made no progress
    JOB_STALL = "job_stall"  # most ranks stopped at once: the job, not a node
    JOB_FAILED = "job_failed"  # the job ended with a failure
    LAUNCH_FAILED = "launch_failed"  # a launch inside a job with spares failed
    OUT_OF_MEMORY = "out_of_memory"  # a rank ran out of memory: the trainer's exit 21, or a cgroup kill
    REPEATED_STALLS = "repeated_stalls"  # a node that stalls again and again
    STRAGGLER = "straggler"  # a node much slower than its peers
    UNHEALTHY = "unhealthy"  # a node that failed the launcher's health check before the launch

    def __str__(self) -> str:
        return self.value


class Response(str, enum.Enum):
    RESTART = "restart"  # inside the job on spares when it has them, else through the queue
    EXCLUDE = "exclude"  # keep the node out of later jobs; the run goes on
    NOTIFY = "notify"  # tell the team; nothing is restarted

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CauseRow:
    response: Response
    words: str  # "after {words}", "({words}, exit 1)"
    notice: Notice
    blames_nodes: bool  # the incident's culprit nodes may be excluded


RESPONSES: dict[Cause, CauseRow] = {
    Cause.DEAD_RANK: CauseRow(Response.RESTART, "a lost node", Notice.FAILURE, True),
    Cause.MISSING_RANK: CauseRow(Response.RESTART, "ranks that never beat", Notice.FAILURE, True),
    Cause.HANG: CauseRow(Response.RESTART, "a hang", Notice.HANG, True),
    Cause.JOB_STALL: CauseRow(Response.RESTART, "a job-wide stall", Notice.FAILURE, False),
    Cause.JOB_FAILED: CauseRow(Response.RESTART, "a failed job", Notice.FAILURE, True),
    Cause.LAUNCH_FAILED: CauseRow(Response.RESTART, "a failed launch", Notice.FAILURE, True),
    Cause.OUT_OF_MEMORY: CauseRow(Response.RESTART, "a rank out of memory", Notice.FAILURE, False),
    Cause.REPEATED_STALLS: CauseRow(Response.EXCLUDE, "repeated stalls", Notice.STRAGGLER, True),
    Cause.STRAGGLER: CauseRow(Response.EXCLUDE, "a straggler", Notice.STRAGGLER, True),
    Cause.UNHEALTHY: CauseRow(Response.EXCLUDE, "a failed health check", Notice.FAILURE, True),
}


def failure_cause(default: Cause, exit_code: int | None, srun_says: str | None) -> Cause:
    """The cause of an ended job or launch: out of memory when the trainer said so (its exit
    code) or SLURM's cgroup killed a task for it (srun: "task 3: Out Of Memory"), else `default`."""
    if exit_code == ExitCode.OUT_OF_MEMORY or "out of memory" in (srun_says or "").lower():
        return Cause.OUT_OF_MEMORY
    return default


def cause_words(cause: str) -> str:
    """The words for a cause read from a record (an unknown value, from a newer tool or another
    user, is shown as it is)."""
    try:
        return RESPONSES[Cause(cause)].words
    except ValueError:
        return cause
