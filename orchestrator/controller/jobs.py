"""The run's jobs as the scheduler sees them: pure rules from what a pass observed to actions.

- Adopt the jobs `runctl submit` queued (its ledger, jobs/<id>/) and any a controller that died
  between sbatch and recording it left behind.
- Refresh every live job from the scheduler's answer; slurmctld not answering (a timeout, a
  non-zero exit, `squeue --json` with `errors`) is an outage: one event, no job judged ended,
  nothing resubmitted (the heartbeats of the job known to run are still judged).
- A job ends only on a terminal SLURM state (or one `runctl status` cached before SLURM forgot
  it), or when SLURM has not listed it for MISSING_PASSES_BEFORE_END passes in a row AND its
  ranks stopped beating (a job that never started: AND for MISSING_QUEUED_SECONDS). UNKNOWN ("not in squeue, no accounting") alone is not an end: a queue
  that lags after an outage must not end a job that trains.
- A job SLURM requeued under the same id (it went back to pending, or its SLURM start time changed)
  is marked: its old heartbeats mean nothing now.
- A run that is not stopped always has a job running or queued (submissions go through the intent
  protocol of submission.py: never twice).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestrator.contract import JobState
from orchestrator.contract import events as ev
from orchestrator.contract import pool_events as pev
from orchestrator.contract.state import ControllerState, JobRecord
from orchestrator.slurm.base import JobInfo

from .actions import Action, AdoptJob, Record, Submit, UpdateJob

QUEUED_STATES = (JobState.PENDING.value, JobState.HELD.value)
RUNNING_STATES = (JobState.RUNNING.value, JobState.COMPLETING.value)
# A job the scheduler does not list yet right after sbatch is not lost.
JUST_SUBMITTED_SECONDS = 60.0
# A predecessor's intent without a job: waited for this long before submitting anew.
INTENT_WAIT_SECONDS = 600.0
# Passes in a row a job must be missing from SLURM's answer (and silent) before it counts as ended.
MISSING_PASSES_BEFORE_END = 3
# A job that never started has no ranks whose silence could confirm it gone, so it must also be
# missing this long: longer than a queue that lags after a slurmctld outage (the soak's lags 2 min;
# at rate x10, seed 18, 3 passes ended a pending job and its resubmission as failures), and
# longer than SLURM's default MinJobAge (300 s), over which an ended job stays listed.
MISSING_QUEUED_SECONDS = 600.0


@dataclass(frozen=True)
class Missing:
    """A live job SLURM's answer did not list: for how many passes in a row and for how many
    seconds, and whether any of its ranks' beats changed within dead_after (the controller's clock)."""

    passes: int
    beating: bool
    seconds: float = 0.0


@dataclass(frozen=True)
class SchedulerView:
    """The scheduler's answer for the run's live jobs in one pass, or why there is none."""

    infos: dict[str, JobInfo]
    error: str | None = None  # slurmctld did not answer
    outage_began: bool = False  # this pass is the first without an answer
    back_after_seconds: float | None = None  # set on the first pass with an answer after an outage
    missing: dict[str, Missing] = field(default_factory=dict)  # live jobs the answer did not list


def running_job(state: ControllerState) -> JobRecord | None:
    for record in state.live_jobs():
        if record.state in RUNNING_STATES and record.ended_at is None:
            return record
    return None


def queued_jobs(state: ControllerState) -> list[JobRecord]:
    return [j for j in state.live_jobs() if j.state in QUEUED_STATES and j.ended_at is None]


def adopt(state: ControllerState, recorded_ids: list[str]) -> list[Action]:
    """Jobs of the run's ledger or jobs/ folders the state does not know yet."""
    known = {j.job_id for j in state.jobs}
    actions: list[Action] = []
    intent = state.pending_submit is not None
    for job_id in recorded_ids:
        if job_id in known:
            continue
        if intent:  # a controller died between sbatch and recording the id; the ledger has it
            why, intent = "submitted by a controller that died before recording it", False
            actions.append(AdoptJob(job_id, why, clears_intent=True))
        else:
            why = "submitted by runctl submit"
            actions.append(AdoptJob(job_id, why))
        actions.append(Record(ev.JobAdopted(job_id=job_id, why=why)))
    return actions


def refresh(
    state: ControllerState,
    view: SchedulerView,
    *,
    wall_now: float,
    last_seen: dict[str, tuple[str, int | None]],
) -> list[Action]:
    """`last_seen`: job -> (end state, exit code) that `runctl status` cached for jobs SLURM forgot."""
    actions: list[Action] = []
    if view.outage_began:
        actions.append(Record(ev.SchedulerUnreachable(error=(view.error or "")[:300])))
    if view.error is not None:
        return actions
    if view.back_after_seconds is not None:
        actions.append(Record(ev.SchedulerReachable(after_seconds=round(view.back_after_seconds, 1))))
    for record in state.live_jobs():
        info = view.infos.get(record.job_id)
        if info is not None:
            actions += job_update(
                record,
                info,
                wall_now=wall_now,
                cached_end=last_seen.get(record.job_id),
                missing=view.missing.get(record.job_id),
            )
    return actions


def job_update(
    record: JobRecord,
    info: JobInfo,
    *,
    wall_now: float,
    cached_end: tuple[str, int | None] | None,
    missing: Missing | None = None,
) -> list[Action]:
    if info.state is JobState.UNKNOWN and cached_end is None:
        return _not_listed(record, missing, wall_now)
    state = info.state.value
    running = state in RUNNING_STATES
    requeued = record.state in RUNNING_STATES and state in QUEUED_STATES
    # Both from SLURM: a new start time under the same id is a requeue we did not see pending.
    restarted = bool(info.start_time and record.slurm_start and info.start_time != record.slurm_start)
    requeue = requeued or (restarted and running)
    started_at = None if requeue else record.started_at
    if info.start_time and running:
        started_at = info.start_time
    if state == JobState.RUNNING.value and not started_at:
        started_at = wall_now
    exit_code = info.exit_code if info.exit_code is not None else record.exit_code
    ended_at = record.ended_at
    unknown = info.state is JobState.UNKNOWN
    if unknown and cached_end is not None:
        state, exit_code = cached_end
    if (info.state.is_terminal or unknown) and ended_at is None:
        ended_at = info.end_time or wall_now
    update = UpdateJob(
        job_id=record.job_id,
        state=state,
        nodes=tuple(info.nodes) if info.nodes else tuple(record.nodes),
        started_at=started_at,
        ended_at=ended_at,
        exit_code=exit_code,
        slurm_start=info.start_time if info.start_time and running else record.slurm_start,
        requeued=requeue,
    )
    actions: list[Action] = [update]
    if requeue:
        actions.append(
            Record(ev.JobRequeued(job_id=record.job_id, state=state, requeues=record.requeues + 1))
        )
    return actions


def _not_listed(record: JobRecord, missing: Missing | None, wall_now: float) -> list[Action]:
    """A live job SLURM did not list: an event on the first pass; ended (state unknown, judged
    by its exit beats) only once missing for MISSING_PASSES_BEFORE_END passes with silent ranks
    and not just submitted (the scheduler may not list a new job yet); one that never started,
    only once missing for MISSING_QUEUED_SECONDS as well."""
    passes = missing.passes if missing is not None else 0  # not counted: never an end
    beating = missing.beating if missing is not None else False
    seconds = missing.seconds if missing is not None else 0.0
    long_enough = record.started_at is not None or seconds >= MISSING_QUEUED_SECONDS
    actions: list[Action] = []
    if passes == 1 and record.ended_at is None:
        actions.append(
            Record(
                pev.JobNotListed(
                    job_id=record.job_id,
                    last_state=record.state,
                    why="SLURM's answer does not list it (no accounting to ask): not an end while its "
                    f"ranks beat; ended after {MISSING_PASSES_BEFORE_END} such passes with silent ranks "
                    f"(a job that never started: after {MISSING_QUEUED_SECONDS:.0f} s)",
                )
            )
        )
    just_submitted = wall_now - record.submitted_at < JUST_SUBMITTED_SECONDS
    gone = passes >= MISSING_PASSES_BEFORE_END and not beating and long_enough and not just_submitted
    if record.ended_at is not None or not gone:
        return actions
    actions.append(
        UpdateJob(
            job_id=record.job_id,
            state=JobState.UNKNOWN.value,
            nodes=tuple(record.nodes),
            started_at=record.started_at,
            ended_at=wall_now,
            exit_code=record.exit_code,
            slurm_start=record.slurm_start,
        )
    )
    return actions


def ensure_a_job(state: ControllerState, wall_now: float) -> list[Action]:
    """A run that is not stopped always has a job running or queued."""
    if state.live_jobs():
        return []
    intent = state.pending_submit
    if intent is not None:
        # A predecessor died mid-submit and this backend cannot list jobs by name: wait until the
        # job shows up (heartbeats, jobs/) rather than risk a duplicate.
        if wall_now - intent.time < INTENT_WAIT_SECONDS:
            return []
        return [
            Record(ev.IntentExpired(intent=asdict(intent))),
            Submit("continue" if state.jobs else "initial"),
        ]
    return [Submit("initial" if not state.jobs else "continue")]


class RankNodes:
    """The SLURM node name of a rank. The heartbeat's host is the node name on a real cluster;
    where it is not (a rank that never beat, emulated nodes that all share one hostname), the
    launch places rank r on its node r // tasks-per-node: of the launch's own nodes in rank order,
    as the job's launcher recorded them (`launch_nodes`, allocation.json), else of SLURM's list of
    the job's nodes. SLURM's list is not the launch's order once a relaunch on a spare replaced a
    node, or a failed node left the job: the ranks after it would be placed one node off."""

    def __init__(self, gpus_per_node: int):
        self.gpus_per_node = gpus_per_node
        self._known: tuple[list[str] | None, frozenset[str]] = (None, frozenset())
        self.launch_nodes: tuple[str, list[str]] | None = None  # (job, the current launch's nodes)

    def learn_launch(self, job_id: str, nodes: list[str] | None) -> None:
        """The job launcher's record of its current launch's nodes, each pass (None: none yet)."""
        self.launch_nodes = (job_id, nodes) if nodes else None

    def node_of(self, rank: int, host: str, job: JobRecord) -> str:
        launch = self.launch_nodes
        nodes = launch[1] if launch is not None and launch[0] == job.job_id else job.nodes
        if not nodes:
            return host
        known = self._known
        if known[0] is not nodes:  # a set per node list (the applier replaces the list): 2,048 nodes
            known = self._known = (nodes, frozenset(nodes))
        if host in known[1]:
            return host
        index = rank // self.gpus_per_node
        return nodes[index] if 0 <= index < len(nodes) else host
