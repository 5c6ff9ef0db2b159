"""A simulated SLURM that implements `orchestrator.slurm.base.Scheduler` on virtual time.

What it does, and the rules it follows (SLURM 22.05's, simplified):
- submit: a job asks for the nodes its batch script's `#SBATCH --nodes=` says (fewer spares when
  the controller found the pool short; `nodes_per_job` for other users' jobs); sbatch refuses it
  at once (NodeConfigUnavailable) when the pool less its exclude list has fewer nodes than that,
  down ones counted as SLURM counts them; else it waits in the queue for a seeded exponential
  time (mean from Timings), then starts on the first nodes of the pool that are up, free and not
  in its exclude list;
  `--dependency=singleton` holds it while another job of the same name and user runs;
- a node that dies is declared DOWN after SlurmdTimeout; its job ends NODE_FAIL, or, when the
  harness asks for a requeue, goes back to the queue under the same job id with
  SLURM_RESTART_COUNT + 1 (never on the DOWN node again); a job with spares runs with --no-kill
  (sbatch_templates/train.sbatch.j2): it loses the node and lives on (`on_node_lost` tells the
  world, whose launcher relaunches on a spare);
- repair: a DOWN node returns to service (as an admin's `scontrol update state=resume`) after a
  repair time drawn uniformly from `repair_seconds` (None: only when `repair(node)` is called);
- the time limit: the pre-timeout signal (`--signal`) at limit - pre_timeout_seconds, TIMEOUT at
  the limit; the trainer normally saves and exits 18 first;
- `unreachable_until`: every call raises SchedulerError, as when slurmctld does not answer;
- `outage(t, seconds, kind, lag)`: the real answers of a slurmctld that is down (Slurm 22.05):
  kind "errors": `squeue --json` answers at once, exit 0, with `errors` and an empty job list
  (read by the real parser, orchestrator.slurm.node_query); kind "timeout": every call waits
  `answer_timeout` virtual seconds, then fails; then for `lag` seconds the queue lags: it
  answers without the run's jobs;
- nodes: `nodes()` answers as `scontrol show node` does (IDLE, ALLOCATED, DOWN with its reason,
  +RESERVED inside a reservation); `reserve(nodes, start, end)` is a maintenance reservation
  (running jobs keep their nodes, no job starts on them inside it); `repair(node)` is an admin
  returning a DOWN node to service;
- the queue holds other users' jobs too, some under the run's own name;
- `probe_node`: the controller's probe step of a silent node (`srun --overlap` inside the job),
  answered by the world (`on_probe`: the node's ranks as /proc would show them); it fails (None)
  while slurmctld does not answer, as srun does then.
Jobs are never forgotten (as with accounting), so `jobs()` answers UNKNOWN only for ids it never had.
The world is told when a job starts and stops (`on_start`, `on_stop`) and when a node goes DOWN
(`on_node_down`: the controller sees the pool shrink then); the ranks are the world's.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import SchedulerError
from orchestrator.slurm.answers import jobs_from_json
from orchestrator.slurm.base import (
    NODE_CONFIG_UNAVAILABLE,
    JobInfo,
    JobState,
    NodeConfigUnavailable,
    NodeInfo,
    SubmitRequest,
)

from .clock import VirtualClock


@dataclass
class SimJob:
    job_id: str
    name: str
    user: str
    submit_time: float  # virtual seconds
    exclude: list[str]
    singleton: bool
    held: bool = False
    state: JobState = JobState.PENDING
    nodes: list[str] = field(default_factory=list)
    eligible_at: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    restart_count: int = 0
    signalled: bool = False
    requeue_on_node_fail: bool = False
    wants: int | None = None  # the nodes it asked for (None: the simulation's nodes_per_job)


class SimSlurm:
    name = "simulated"

    def __init__(
        self,
        clock: VirtualClock,
        pool: list[str],
        *,
        nodes_per_job: int,
        rng: random.Random,
        queue_wait_mean: float,
        slurmd_timeout: float,
        time_limit: float,
        pre_timeout: float,
        owner: str = "bloom",
        no_kill: bool = False,
        repair_seconds: tuple[float, float] | None = None,
    ):
        self.clock = clock
        self.pool = list(pool)
        self.nodes_per_job = nodes_per_job
        self.rng = rng
        self.queue_wait_mean = queue_wait_mean
        self.slurmd_timeout = slurmd_timeout
        self.time_limit = time_limit
        self.pre_timeout = pre_timeout
        self.owner = owner
        self.no_kill = no_kill
        self.repair_seconds = repair_seconds
        self.repairs: list[tuple[float, str]] = []  # (t, node) returned to service
        self._repair_at: dict[str, float] = {}
        self.jobs_by_id: dict[str, SimJob] = {}
        self.down: set[str] = set()
        self.unreachable_until = -math.inf
        self.outage_window = (math.inf, -math.inf, "errors", 0.0)  # (start, end, kind, lag seconds)
        self.answer_timeout = 30.0  # what squeue waits for a stopped slurmctld
        self.reservations: list[tuple[frozenset[str], float, float]] = []
        self.down_reason: dict[str, str] = {}
        self.starved: list[tuple[float, str, int]] = []  # (t, job, free nodes) a run job could not start
        self.calls: list[tuple[float, str, object]] = []
        self.on_start: Callable[[SimJob, float], None] = lambda job, t: None
        self.on_stop: Callable[[SimJob, float, str], None] = lambda job, t, why: None
        self.on_signal: Callable[[SimJob, float], None] = lambda job, t: None
        self.on_node_lost: Callable[[SimJob, str, float], None] = lambda job, node, t: None
        self.on_node_down: Callable[[str, float], None] = lambda node, t: None
        self.on_probe: Callable[[str, str, float], str | None] = lambda job_id, node, timeout: None
        self._node_fail_at: dict[str, float] = {}  # node -> when SLURM declares it DOWN
        self._next_id = 4200
        self._processed_at = -math.inf

    # -- the Scheduler protocol (what the controller calls) -------------------------------------
    def _answer(self, method: str, arg: object) -> None:
        self.calls.append((self.clock.t, method, arg))
        if self.clock.t < self.unreachable_until:
            raise SchedulerError(
                f"{method}: slurm_load_jobs error: Socket timed out on send/recv operation "
                "(slurmctld does not answer; retry later)"
            )

    def outage(self, t: float, seconds: float, kind: str = "errors", lag: float = 0.0) -> None:
        self.outage_window = (t, t + seconds, kind, lag)

    def probe_node(self, job_id: str, node: str, script: str, timeout: float) -> str | None:
        """The probe step on `node` inside job `job_id` (orchestrator/slurm/real.py's): the world's
        answer to it, None when it did not run or did not answer within `timeout`."""
        self.calls.append((self.clock.t, "probe_node", node))
        start, end, _, _ = self.outage_window
        if self.clock.t < self.unreachable_until or start <= self.clock.t < end:
            raise SchedulerError("slurmctld does not answer: the node could not be asked (simulated)")
        return self.on_probe(str(job_id), node, timeout)

    def answers(self, node: str) -> bool:
        """The node's slurmd answers: it is not DOWN and not failing (SLURM not told yet)."""
        return node not in self.down and node not in self._node_fail_at

    def _outage_answer(self, method: str) -> None:
        """What a stopped slurmctld answers: errors with an empty list (through the real parser),
        or nothing until the command times out."""
        start, end, kind, _ = self.outage_window
        if not start <= self.clock.t < end:
            return
        if kind == "timeout" or method != "jobs":
            self.clock.sleep(self.answer_timeout)
            raise SchedulerError(
                f"`{method}` did not answer within {self.answer_timeout:.0f} s: is slurmctld up?"
            )
        answer = {"errors": [{"source": "slurm_load_jobs", "error": "Unable to contact slurm controller "
                              "(connect failure)", "errno": 1007}], "jobs": []}  # fmt: skip
        jobs_from_json(json.dumps(answer), lambda: "squeue --json (simulated)")  # raises, as for real

    def _lagging(self, job: SimJob) -> bool:
        """Right after an outage the queue lags: it lists none of the run's jobs yet (valid JSON,
        no errors: read alone, the job would look gone)."""
        _, end, _, lag = self.outage_window
        return end <= self.clock.t < end + lag and job.user == self.owner

    def nodes(self) -> dict[str, NodeInfo]:
        self._answer("nodes", None)
        self._outage_answer("nodes")
        t = self.clock.t
        busy = {n for j in self.running() for n in j.nodes}
        out = {}
        for node in self.pool:
            states = {"DOWN"} if node in self.down else {"ALLOCATED"} if node in busy else {"IDLE"}
            if self._reserved(node, t):
                states.add("RESERVED")
            out[node] = NodeInfo(
                node, frozenset(states), self.down_reason.get(node, "") if node in self.down else ""
            )
        return out

    def _reserved(self, node: str, t: float) -> bool:
        return any(node in nodes and a <= t < b for nodes, a, b in self.reservations)

    def reserve(self, nodes: list[str], start: float, end: float) -> None:
        self.reservations.append((frozenset(nodes), start, end))

    def repair(self, node: str, t: float | None = None) -> None:
        """An admin returns the node to service (`scontrol update state=resume`)."""
        self.down.discard(node)
        self.down_reason.pop(node, None)
        self._repair_at.pop(node, None)
        self.repairs.append((self.clock.t if t is None else t, node))
        for job in self.jobs_by_id.values():
            if job.state is JobState.PENDING:
                self._reschedule(job)

    def submit(self, request: SubmitRequest) -> str:
        self._answer("submit", request.job_name)
        self._outage_answer("submit")
        wants = requested_nodes(request.script) or self.nodes_per_job
        usable = sum(1 for n in self.pool if n not in request.exclude)
        if usable < wants:
            raise NodeConfigUnavailable(
                f"sbatch: error: Batch job submission failed: {NODE_CONFIG_UNAVAILABLE} "
                f"({wants} nodes asked, {usable} in the partition less the exclude list; simulated)"
            )
        job = self._new_job(
            request.job_name,
            self.owner,
            list(request.exclude),
            singleton=request.dependency == "singleton",
            held=request.hold,
        )
        job.wants = wants
        return job.job_id

    def jobs(self, job_ids: list[str]) -> dict[str, JobInfo]:
        self._answer("jobs", list(job_ids))
        self._outage_answer("jobs")
        out = {}
        for j in map(str, job_ids):
            job = self.jobs_by_id.get(j)
            out[j] = self._info(None if job is None or self._lagging(job) else job, j)
        return out

    def jobs_by_name(self, name: str) -> dict[str, JobInfo]:
        self._answer("jobs_by_name", name)
        return {j.job_id: self._info(j, j.job_id) for j in self.jobs_by_id.values() if j.name == name}

    def cancel(self, job_ids: list[str], signal: str | None = None) -> None:
        self._answer("cancel", list(job_ids))
        t = self.clock.t
        for job_id in job_ids:
            job = self.jobs_by_id.get(str(job_id))
            if job is None or job.state.is_terminal:
                continue
            if signal:
                self.on_signal(job, t)
                continue
            was_running = job.state is JobState.RUNNING
            self._end(job, t, JobState.CANCELLED, None)
            if was_running:
                self.on_stop(job, t, "cancelled")

    def hold(self, job_ids: list[str]) -> None:
        self._answer("hold", list(job_ids))
        for job_id in job_ids:
            if (job := self.jobs_by_id.get(str(job_id))) and job.state is JobState.PENDING:
                job.held = True

    def release(self, job_ids: list[str]) -> None:
        self._answer("release", list(job_ids))
        for job_id in job_ids:
            if job := self.jobs_by_id.get(str(job_id)):
                job.held = False

    def update_exclude(self, job_ids: list[str], exclude: list[str]) -> None:
        self._answer("update_exclude", (list(job_ids), list(exclude)))
        for job_id in job_ids:
            if (job := self.jobs_by_id.get(str(job_id))) and job.state is JobState.PENDING:
                job.exclude = list(exclude)
                self._reschedule(job)

    def _reschedule(self, job: SimJob) -> None:
        """slurmctld's scheduler looks at a pending job again a moment after it changed."""
        job.eligible_at = max(job.eligible_at, self.clock.t + 1.0)

    # -- what the world and the harness do to it ---------------------------------------------------
    def add_foreign_job(self, name: str, user: str, state: JobState) -> SimJob:
        """Another user's job in the queue (held so that it never takes the run's nodes)."""
        job = self._new_job(name, user, [], singleton=True, held=True)
        if state.is_terminal:
            self._end(job, self.clock.t, state, 0 if state is JobState.COMPLETED else 1)
        return job

    def fail_node(self, node: str, t: float, requeue: bool = False) -> None:
        """The node stops answering now; SLURM notices after SlurmdTimeout."""
        self._node_fail_at.setdefault(node, t + self.slurmd_timeout)
        for job in self.jobs_by_id.values():
            if job.state is JobState.RUNNING and node in job.nodes:
                job.requeue_on_node_fail = requeue

    def requeue(self, job_id: str, t: float) -> None:
        """`scontrol requeue` (or a failed node health check): the same id goes back to the queue."""
        job = self.jobs_by_id[str(job_id)]
        if job.state is JobState.RUNNING:
            self.on_stop(job, t, "requeued")
            job.state, job.nodes, job.start_time = JobState.PENDING, [], None
            job.restart_count += 1
            job.eligible_at = t + 60.0 + self.rng.expovariate(1.0 / self.queue_wait_mean)

    def job_exited(self, job: SimJob, t: float, exit_code: int) -> None:
        """The batch script's srun returned: the job ends with its exit code."""
        if job.state is not JobState.RUNNING:
            return
        self._end(job, t, JobState.COMPLETED if exit_code == 0 else JobState.FAILED, exit_code)
        self.on_stop(job, t, f"exit {exit_code}")

    def running(self) -> list[SimJob]:
        return [j for j in self.jobs_by_id.values() if j.state is JobState.RUNNING]

    def next_event_time(self) -> float:
        times = list(self._node_fail_at.values()) + list(self._repair_at.values())
        times += [b for _, a, b in self.reservations if b > self._processed_at]  # pending jobs may start
        for job in self.jobs_by_id.values():
            if job.state is JobState.PENDING and not job.held and job.eligible_at > self._processed_at:
                times.append(job.eligible_at)  # a job that could not start is retried at every event
            elif job.state is JobState.RUNNING and job.start_time is not None:
                if not job.signalled and self.pre_timeout:
                    times.append(job.start_time + self.time_limit - self.pre_timeout)
                times.append(job.start_time + self.time_limit)
        return min(times, default=math.inf)

    def process(self, t: float) -> None:
        """Everything SLURM does at time t: nodes declared down, signals, time limits, starts."""
        self._processed_at = t
        for node, when in list(self._node_fail_at.items()):
            if when <= t:
                del self._node_fail_at[node]
                self._node_down(node, when)
        for node, when in list(self._repair_at.items()):
            if when <= t:
                self.repair(node, when)
        for job in self.running():
            if (
                not job.signalled
                and self.pre_timeout
                and job.start_time + self.time_limit - self.pre_timeout <= t
            ):
                job.signalled = True
                self.on_signal(job, t)
            if job.start_time + self.time_limit <= t:
                self._end(job, t, JobState.TIMEOUT, None)
                self.on_stop(job, t, "time limit")
        for job in sorted(self.jobs_by_id.values(), key=lambda j: int(j.job_id)):
            if job.state is JobState.PENDING and not job.held and job.eligible_at <= t:
                self._try_start(job, t)

    # -- internals ------------------------------------------------------------------------------
    def _new_job(self, name: str, user: str, exclude: list[str], singleton: bool, held: bool) -> SimJob:
        self._next_id += 1
        t = self.clock.t
        job = SimJob(
            str(self._next_id),
            name,
            user,
            t,
            exclude,
            singleton,
            held=held,
            eligible_at=t + self.rng.expovariate(1.0 / self.queue_wait_mean),
        )
        self.jobs_by_id[job.job_id] = job
        return job

    def _try_start(self, job: SimJob, t: float) -> None:
        if job.singleton and any(j.name == job.name and j.user == job.user for j in self.running()):
            return
        busy = {n for j in self.running() for n in j.nodes}
        free = [
            n
            for n in self.pool
            if n not in busy and n not in self.down and n not in job.exclude and not self._reserved(n, t)
        ]
        wants = job.wants or self.nodes_per_job
        if len(free) < wants:
            if job.user == self.owner:
                self.starved.append((t, job.job_id, len(free)))
            return  # waits for resources (a repaired node, a cleared exclude list, a reservation's end)
        job.state, job.nodes, job.start_time, job.signalled = (
            JobState.RUNNING,
            free[:wants],
            t,
            False,
        )
        self.on_start(job, t)

    def _node_down(self, node: str, t: float) -> None:
        self.down.add(node)
        self.down_reason[node] = "Not responding"
        self.on_node_down(node, t)
        if self.repair_seconds is not None:
            self._repair_at[node] = t + self.rng.uniform(*self.repair_seconds)
        for job in self.running():
            if node not in job.nodes:
                continue
            if self.no_kill and job.user == self.owner and len(job.nodes) > 1:
                job.nodes = [n for n in job.nodes if n != node]  # --no-kill: the job lives on without it
                self.on_node_lost(job, node, t)
            elif job.requeue_on_node_fail:
                self.on_stop(job, t, "requeued")
                job.state, job.nodes, job.start_time = JobState.PENDING, [], None
                job.restart_count += 1
                job.eligible_at = t + 60.0 + self.rng.expovariate(1.0 / self.queue_wait_mean)  # same id
                job.requeue_on_node_fail = False
            else:
                self._end(job, t, JobState.NODE_FAIL, None)
                self.on_stop(job, t, "node failure")

    def _end(self, job: SimJob, t: float, state: JobState, exit_code: int | None) -> None:
        job.state, job.end_time, job.exit_code = state, t, exit_code

    def _info(self, job: SimJob | None, job_id: str) -> JobInfo:
        if job is None:
            return JobInfo(job_id=job_id, name="", state=JobState.UNKNOWN)
        wall = self.clock.to_wall
        fields = dict(
            job_id=job.job_id,
            name=job.name,
            state=JobState.HELD if job.held and job.state is JobState.PENDING else job.state,
            nodes=list(job.nodes),
            exit_code=job.exit_code,
            start_time=wall(job.start_time) if job.start_time is not None else None,
            end_time=wall(job.end_time) if job.end_time is not None else None,
            held=job.held,
            user=job.user,
            submit_time=wall(job.submit_time),
            reason="Resources" if job.state is JobState.PENDING else "",
        )
        known = JobInfo.__dataclass_fields__  # older JobInfo without user/submit_time: leave them out
        return JobInfo(**{k: v for k, v in fields.items() if k in known})


def requested_nodes(script: Path) -> int | None:
    """The node count a batch script asks for (`#SBATCH --nodes=N`, as sbatch reads it: the
    directives before the first command); None when it does not say or cannot be read."""
    try:
        lines = script.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("#SBATCH --nodes="):
            value = line.split("=", 1)[1].split()[0]
            return int(value) if value.isdigit() else None
    return None
