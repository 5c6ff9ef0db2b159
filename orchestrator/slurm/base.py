"""The scheduler interface the controller and the CLI program against.

Two backends implement it: real SLURM (`sbatch`/`squeue`/`scontrol`/`scancel`/`sacct` on PATH or
with SLURM_CONF) and the mocked SLURM (a state file, no daemons). SLURM's states map to ours in one
table (`SLURM_STATE_TABLE`) onto the contract's `orchestrator.contract.JobState`; every answer
of every release is read through `orchestrator.slurm.answers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.contract import TERMINAL_JOB_STATES, JobState  # noqa: F401 - re-exported
from orchestrator.errors import SchedulerError

# The one table from SLURM's job states and state flags (long and short names) to ours
# (answers.read_job_state picks the word, as SLURM's job_state_string() does).
SLURM_STATE_TABLE: dict[str, JobState] = {
    "PENDING": JobState.PENDING, "PD": JobState.PENDING,
    "CONFIGURING": JobState.PENDING, "CF": JobState.PENDING,
    "REQUEUED": JobState.PENDING, "RQ": JobState.PENDING,
    "REQUEUE_HOLD": JobState.HELD, "RH": JobState.HELD,
    "REQUEUE_FED": JobState.PENDING, "RF": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.HELD, "RD": JobState.HELD,
    "RUNNING": JobState.RUNNING, "R": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING, "SI": JobState.RUNNING,
    "STAGE_OUT": JobState.COMPLETING, "SO": JobState.COMPLETING,
    "RESIZING": JobState.RUNNING, "RS": JobState.RUNNING,
    "SUSPENDED": JobState.HELD, "S": JobState.HELD,
    "STOPPED": JobState.HELD, "ST": JobState.HELD,
    "COMPLETING": JobState.COMPLETING, "CG": JobState.COMPLETING,
    "COMPLETED": JobState.COMPLETED, "CD": JobState.COMPLETED,
    "FAILED": JobState.FAILED, "F": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED, "BF": JobState.FAILED,
    "DEADLINE": JobState.TIMEOUT, "DL": JobState.TIMEOUT,
    "OUT_OF_MEMORY": JobState.FAILED, "OOM": JobState.FAILED,
    "PREEMPTED": JobState.CANCELLED, "PR": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED, "RV": JobState.CANCELLED,
    "SPECIAL_EXIT": JobState.FAILED, "SE": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED, "CA": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT, "TO": JobState.TIMEOUT,
    "NODE_FAIL": JobState.NODE_FAIL, "NF": JobState.NODE_FAIL,
}  # fmt: skip


@dataclass
class JobInfo:
    job_id: str
    name: str
    state: JobState
    nodes: list[str] = field(default_factory=list)
    exit_code: int | None = None  # the batch script's exit code, when known
    signal: int | None = None
    reason: str = ""
    start_time: float | None = None
    end_time: float | None = None
    held: bool = False
    user: str = ""  # who submitted it: a controller adopts only its owner's jobs
    submit_time: float | None = None


# SLURM's node states and flags (`scontrol show node`: State=IDLE+DRAIN, or --json's
# state/state_flags) that take a node out of the schedulable pool, in one place:
NODE_STATES_DOWN = frozenset(
    {
        "DOWN",
        "FAIL",
        "FAILING",
        "FUTURE",
        "UNKNOWN",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "POWER_DOWN",
        "POWERING_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "INVAL",
    }
)
NODE_STATES_DRAINED = frozenset({"DRAIN", "DRAINED", "DRAINING"})
NODE_STATES_RESERVED = frozenset({"RESERVED", "MAINT", "MAINTENANCE"})  # fmt: skip


@dataclass(frozen=True)
class NodeInfo:
    """One node as SLURM sees it: its state words (`IDLE+DRAIN` -> {"IDLE", "DRAIN"}), why an
    admin or slurmctld set it so, and its partitions (empty: not said)."""

    name: str
    states: frozenset[str]
    reason: str = ""
    partitions: tuple[str, ...] = ()

    @property
    def state(self) -> str:
        return "+".join(sorted(self.states)) or "?"

    @property
    def down(self) -> bool:
        return bool(self.states & NODE_STATES_DOWN)

    @property
    def drained(self) -> bool:
        return bool(self.states & NODE_STATES_DRAINED)

    @property
    def reserved(self) -> bool:
        return bool(self.states & NODE_STATES_RESERVED)

    @property
    def slurm_took_it(self) -> bool:
        """SLURM already keeps new jobs off it (down or drained): SLURM's problem, not an exclusion."""
        return self.down or self.drained

    @property
    def schedulable(self) -> bool:
        return not (self.down or self.drained or self.reserved)


@dataclass
class SubmitRequest:
    script: Path  # the rendered batch script
    job_name: str
    dependency: str | None = None  # e.g. "singleton"
    hold: bool = False
    exclude: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)


def sbatch_argv(request: SubmitRequest) -> list[str]:
    """The sbatch command line of a request: one definition for the real and the mocked SLURM."""
    argv = ["sbatch", "--parsable", f"--job-name={request.job_name}"]
    if request.dependency:
        argv.append(f"--dependency={request.dependency}")
    if request.hold:
        argv.append("--hold")
    if request.exclude:
        argv.append(f"--exclude={','.join(request.exclude)}")
    return [*argv, *request.extra_args, str(request.script)]


# What sbatch prints (after "Batch job submission failed: ") when no set of the partition's nodes,
# less the --exclude list, can ever run the job: the same words in Slurm 22.05 and 24.11
# (libslurmfull's ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE). SLURM refuses such a job at once
# rather than queue it, unlike one that waits for down or drained nodes.
NODE_CONFIG_UNAVAILABLE = "Requested node configuration is not available"


class NodeConfigUnavailable(SchedulerError):
    """sbatch refused the job: the nodes it may use (the partition's, less its exclusions) are too
    few for it. No job exists; the same sbatch would be refused again."""


def refused_for_nodes(sbatch_says: str) -> bool:
    return NODE_CONFIG_UNAVAILABLE.lower() in sbatch_says.lower()


class Scheduler(Protocol):
    """What the orchestrator needs from a batch scheduler. Every method raises
    `orchestrator.errors.SchedulerError` (with the scheduler's own output) on failure."""

    name: str
    # False for a backend that moves jobs through states without running their scripts (the
    # mocked SLURM's scenario mode): a probe job there could tell nothing.
    runs_job_scripts: bool = True

    def submit(self, request: SubmitRequest) -> str:
        """Submit and return the job id."""

    def jobs(self, job_ids: list[str]) -> dict[str, JobInfo]:
        """The state of each job; a job SLURM no longer knows maps to JobState.UNKNOWN unless
        accounting can tell its end state."""

    def cancel(self, job_ids: list[str], signal: str | None = None) -> None:
        """scancel, optionally with a signal (then the job is signalled, not necessarily ended)."""

    def hold(self, job_ids: list[str]) -> None: ...

    def release(self, job_ids: list[str]) -> None: ...

    def update_exclude(self, job_ids: list[str], exclude: list[str]) -> None:
        """Change the excluded nodes of pending jobs (scontrol update ExcNodeList=...)."""

    def jobs_by_name(self, name: str) -> dict[str, JobInfo]:
        """The jobs the scheduler lists under `name` (a controller that died between sbatch and
        recording the id finds its job this way)."""

    def nodes(self) -> dict[str, NodeInfo]:
        """Every node SLURM knows, with its state and reason (`scontrol show node`); {} when the
        backend cannot tell (then nothing is judged by node state)."""
