"""The small vocabularies both sides share: exit codes, phases, job states, outcomes, launcher
states. Each is defined once here and compared by enum, never as a raw string or int elsewhere."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """How a trainer process (and the launcher that runs it) tells the controller why it stopped.

    Anything not listed here (a Python traceback gives 1, a signal gives 128+N) is a failure:
    the controller restarts after checks.
    """

    FINISHED = 0  # trained all samples: never restart
    FAILED = 1  # generic failure: restart from the newest good checkpoint
    KILLED = 17  # stopped by the kill switch after saving: never restart
    TIME_BUDGET = 18  # exit duration / pre-timeout signal reached, checkpoint saved: continue the chain
    CONFIG_ERROR = 19  # the trainer refused the config: restarting would fail the same way
    # The launcher found fewer healthy nodes than the run needs (allocation.json says which
    # failed and why): a failure, restarted at job level without them.
    UNHEALTHY_NODES = 20
    # A rank ran out of memory (host MemoryError, or the accelerator's out-of-memory error): a
    # failure of the job's size or a leak, not of the node it ran on.
    OUT_OF_MEMORY = 21

    @classmethod
    def describe(cls, code: int | None) -> str:
        if code is None:
            return "unknown"
        try:
            return cls(code).name.lower()
        except ValueError:
            if code > 128:
                return f"failed (signal {code - 128})"
            return f"failed (exit {code})"


# Exits that are the trainer's own decision: never a reason to relaunch or to blame a node.
PURPOSEFUL_EXITS = frozenset(
    {ExitCode.FINISHED, ExitCode.KILLED, ExitCode.TIME_BUDGET, ExitCode.CONFIG_ERROR}
)


class Phase(str, enum.Enum):
    """What a rank is doing; hang timeouts are per phase."""

    INIT = "init"
    STEP = "step"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"
    EXITING = "exiting"

    @classmethod
    def parse(cls, value: object) -> Phase:
        """A recorded phase back to the enum; anything unrecognised counts as a step (the
        strictest timeout that still allows the work)."""
        try:
            return cls(value)
        except ValueError:
            return cls.STEP


class Mark(str, enum.Enum):
    """The finest units of progress a rank reports (Heartbeat.progress_count counts them, and
    `progress_unit` names the last): a step is not atomic, and a rank that has finished none of
    these for a few times the longest honest gap between two of them is stuck, whatever its step
    time. WAIT is entering a point where the rank waits for its peers after its own work (the
    gradient reduce, a barrier after its share of a save): the time there is theirs, not its."""

    FORWARD = "forward"  # one micro-batch forward on this pipeline stage
    BACKWARD = "backward"  # one micro-batch backward
    REDUCE = "reduce"  # the gradient reduce finished
    OPTIMIZER = "optimizer"  # the optimizer step finished
    SAVE_BYTES = "save_bytes"  # a chunk of a checkpoint written (or hashed)
    LOAD_BYTES = "load_bytes"  # a chunk of a checkpoint read
    EVAL = "eval"  # one eval micro-batch
    PHASE = "phase"  # a phase began (a step, a save, an eval, the exit)
    WAIT = "wait"

    @classmethod
    def parse(cls, value: object) -> Mark | None:
        try:
            return cls(value)
        except ValueError:
            return None


class JobState(str, enum.Enum):
    """A job's state as both sides record it (state.json, jobs/last_seen.json). The scheduler
    backends map their own states onto these (orchestrator.slurm.base.SLURM_STATE_TABLE)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"
    HELD = "held"
    UNKNOWN = "unknown"  # not in squeue any more and no accounting to ask

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES

    @classmethod
    def parse(cls, value: str) -> JobState:
        """A recorded state back to the enum; anything unrecognised is UNKNOWN."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


TERMINAL_JOB_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL}
)


class Outcome(str, enum.Enum):
    """What an ended job means for the run (classify_end)."""

    FINISHED = "finished"
    KILLED = "killed"
    TIME_BUDGET = "time_budget"
    CONFIG_ERROR = "config_error"
    FAILED = "failed"
    CANCELLED = "cancelled"  # cancelled from outside (scancel by a person, preemption)


def classify_end(state: str, exit_code: int | None) -> Outcome:
    """How a job ended: the exit code when known (it says why), else the scheduler's end state.
    The one classification: the controller acts on it and `runctl status` shows it."""
    state = JobState.parse(state)
    if exit_code is not None:
        if exit_code == ExitCode.FINISHED:
            if state in (JobState.COMPLETED, JobState.UNKNOWN):
                return Outcome.FINISHED
            return Outcome.FAILED
        if exit_code == ExitCode.KILLED:
            return Outcome.KILLED
        if exit_code == ExitCode.TIME_BUDGET:
            return Outcome.TIME_BUDGET
        if exit_code == ExitCode.CONFIG_ERROR:
            return Outcome.CONFIG_ERROR
        return Outcome.FAILED
    if state is JobState.COMPLETED:
        return Outcome.FINISHED
    if state is JobState.TIMEOUT:
        return Outcome.TIME_BUDGET  # the scheduler's limit: the pre-timeout signal made the trainer save
    if state is JobState.CANCELLED:
        return Outcome.CANCELLED
    return Outcome.FAILED


class LauncherState(str, enum.Enum):
    """The job launcher's states (allocation.json), in order: checking health, a launch running,
    a launch ended and a decision awaited, the launcher gone (the job ends with its exit code)."""

    HEALTH_CHECK = "health_check"
    RUNNING = "running"
    WAITING_DECISION = "waiting_decision"
    ENDED = "ended"
