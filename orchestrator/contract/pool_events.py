"""events.jsonl records of the node pool and of SLURM's word: what SLURM says of a
node before the controller blames it, stalls, probations, a pool too small to schedule the job,
and jobs SLURM's answer does not list. Same rules as events.py (registered by kind on import;
the contract package imports this module, so `read_events` always knows them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .event_base import Event


@dataclass(frozen=True, kw_only=True)
class JobNotListed(Event):
    """SLURM answered without this job (no accounting to ask): not an end while its ranks beat."""

    KIND = "job_not_listed"
    job_id: str
    last_state: str
    why: str


@dataclass(frozen=True, kw_only=True)
class NodeLeftToSlurm(Event):
    """A node the controller would have excluded, but SLURM already drains or downs it."""

    KIND = "node_left_to_slurm"
    node: str
    job_id: str
    cause: str
    slurm_state: str
    slurm_reason: str = ""


@dataclass(frozen=True, kw_only=True)
class NodeStalled(Event):
    """A node's beats stopped and came back while its job lived (storage, a paging storm)."""

    KIND = "node_stalled"
    node: str
    job_id: str
    seconds: float
    stalls_in_window: int
    window_hours: float
    excluded: bool = False  # this stall was one too many: the node is on probation now


@dataclass(frozen=True, kw_only=True)
class ProbationEnded(Event):
    """Nodes back in the pool: their probation expired, or the policy released the oldest."""

    KIND = "probation_ended"
    nodes: list[str]
    why: str
    excluded: list[str] = field(default_factory=list)  # the list after the change


@dataclass(frozen=True, kw_only=True)
class PoolShort(Event):
    """Critical: exclusions, down, drained and reserved nodes leave fewer than the job's nodes
    (spares not counted): the next job cannot start."""

    KIND = "pool_short"
    usable: int
    needed: int
    pool: int
    excluded: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    reserved: list[str] = field(default_factory=list)
    policy: str = "wait"
    message: str = ""


@dataclass(frozen=True, kw_only=True)
class PoolRecovered(Event):
    KIND = "pool_recovered"
    usable: int
    needed: int
    short_for_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class SparesForNextJob(Event):
    """The pool has the job's nodes but not all its spares: the next job asks for `spares_next`
    (a warning: it trains, with less room to replace a node inside it). Also when they return."""

    KIND = "spares_for_next_job"
    usable: int
    nodes: int
    spares: int  # configured (cluster.spare_nodes)
    spares_next: int


@dataclass(frozen=True, kw_only=True)
class SubmissionRefused(Event):
    """sbatch refused the next job because its exclude list left too few nodes ("Requested node
    configuration is not available"): the controller ended early the probations of its own
    exclusions with the weakest evidence, and submits again on the next pass."""

    KIND = "submission_refused"
    exclude: list[str]  # the refused sbatch's --exclude
    returned: list[str]  # probations ended, weakest evidence first
    why: str  # the evidence of each returned node, and the count that decided
    error: str = ""  # sbatch's words
