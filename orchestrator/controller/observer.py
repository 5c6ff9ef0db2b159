"""What the controller sees in one pass, read without changing anything but its own memory:
the scheduler's answer, the job launcher's records, the ranks' beats judged by change on its own
monotonic clock, the learned timeouts, and whether what it trusts is still the owner's alone when
a new job folder appears. The deciding modules take what this returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from orchestrator.contract import (
    ContractError,
    Heartbeat,
    HeartbeatReader,
    JobState,
    RunPaths,
    checkpoints_dir,
    read_allocation,
)
from orchestrator.contract import failure_events as fev
from orchestrator.contract.allocation import Allocation, read_decision
from orchestrator.contract.job_end import LaunchEnd
from orchestrator.contract.ledger import read_last_seen
from orchestrator.contract.operators import check_trust
from orchestrator.contract.rank_output import RankError, read_rank_error
from orchestrator.contract.state import ControllerState, JobRecord
from orchestrator.errors import SchedulerError
from orchestrator.slurm.base import JobInfo, NodeInfo, Scheduler

from . import jobs
from .detection import Assessment, assess
from .memory import Memory
from .reporter import Reporter
from .timeouts import PhaseTimeouts, probe_after, silent_after


class Observer:
    def __init__(
        self,
        *,
        paths: RunPaths,
        cfg: Any,
        scheduler: Scheduler,
        memory: Memory,
        reporter: Reporter,
        monotonic: Callable[[], float],
    ):
        self.paths, self.cfg, self.scheduler, self.memory = paths, cfg, scheduler, memory
        self.reporter, self.monotonic = reporter, monotonic
        self._beat_reader = HeartbeatReader(paths.heartbeats)
        self._beat_files: list[list[Heartbeat]] = []
        self.rank_nodes = jobs.RankNodes(cfg.cluster.gpus_per_node)  # shared with the supervisor
        self._slurm_nodes: tuple[dict[str, NodeInfo] | None] | None = None  # this pass's answer, once asked

    def _ranks_on(self, nodes: set[str], job: JobRecord) -> frozenset[int]:
        """The ranks the launch places on `nodes` (none when there are none)."""
        if not nodes:
            return frozenset()
        node_of = self.rank_nodes.node_of
        return frozenset(r for r in range(self.cfg.world_size) if node_of(r, "", job) in nodes)

    def beats(self) -> list[Heartbeat]:
        """Every rank's last beat (entries unchanged since the last pass are not checked again).
        Kept by file for `assess`, which skips the files that did not change."""
        self._beat_files = self._beat_reader.read_files()
        return [beat for file_beats in self._beat_files for beat in file_beats]

    def scheduler_view(self, state: ControllerState) -> jobs.SchedulerView:
        live = state.live_jobs()
        if not live:
            return jobs.SchedulerView({})
        memory = self.memory
        try:
            infos = self.scheduler.jobs([j.job_id for j in live])
        except SchedulerError as exc:
            # slurmctld timing out for a while is normal on a busy cluster: keep judging the
            # heartbeats of the job we know is running; job ends wait until it answers again.
            began = memory.scheduler_down_since is None
            if began:
                memory.scheduler_down_since = self.monotonic()
            return jobs.SchedulerView({}, error=str(exc), outage_began=began)
        back = None
        if memory.scheduler_down_since is not None:
            back, memory.scheduler_down_since = self.monotonic() - memory.scheduler_down_since, None
        return jobs.SchedulerView(infos, back_after_seconds=back, missing=self._missing(infos))

    def _missing(self, infos: dict[str, JobInfo]) -> dict[str, jobs.Missing]:
        """Count the passes (and seconds) each job has gone unlisted (UNKNOWN) in a row; whether
        its ranks still beat is judged on this controller's clock (liveness of the job it supervises)."""
        counts, since = self.memory.missing_passes, self.memory.missing_since
        unlisted = {j for j, info in infos.items() if info.state is JobState.UNKNOWN}
        for job_id in list(counts):
            if job_id not in unlisted:
                del counts[job_id]
                since.pop(job_id, None)
        liveness, now = self.memory.liveness, self.monotonic()
        dead_after = self.cfg.watchdog.dead_after_seconds
        out = {}
        for job_id in unlisted:
            counts[job_id] = counts.get(job_id, 0) + 1
            since.setdefault(job_id, now)
            beating = liveness.job_id == job_id and any(
                now - view.beat_changed <= dead_after for view in liveness.ranks.values()
            )
            out[job_id] = jobs.Missing(counts[job_id], beating, now - since[job_id])
        return out

    def slurm_nodes(self) -> dict[str, NodeInfo] | None:
        """SLURM's view of every node (state, reason); None when it cannot be asked now (the
        scheduler does not answer, or this backend cannot tell): then nothing is judged by it.
        Asked once a pass (`forget_slurm_nodes` begins one): a pass that recovers from a failure
        judges the pool up to four times (the blame, before the sbatch, the spares it asks for, the
        pass's end), and what they read (down, drained, reserved) is not changed by the pass."""
        if self._slurm_nodes is None:
            self._slurm_nodes = (self._ask_slurm_nodes(),)
        return self._slurm_nodes[0]

    def forget_slurm_nodes(self) -> None:
        self._slurm_nodes = None

    def _ask_slurm_nodes(self) -> dict[str, NodeInfo] | None:
        ask = getattr(self.scheduler, "nodes", None)  # a test double may not implement it
        if ask is None:
            return None
        try:
            return ask() or None
        except SchedulerError:
            return None

    def ended_seen(self) -> dict[str, tuple[str, int | None]]:
        """The end state and exit code `runctl status` cached for jobs SLURM has since forgotten
        (jobs/last_seen.json; no accounting on the local cluster)."""
        cached = read_last_seen(self.paths.last_seen)
        return {
            job: (s.state, s.exit_code) for job, s in cached.items() if JobState.parse(s.state).is_terminal
        }

    def allocation(self, job: JobRecord) -> Allocation | None:
        """The job launcher's record (None until it wrote one); an unreadable one is said once."""
        try:
            allocation = read_allocation(self.paths.allocation(job.job_id))
        except ContractError as exc:
            if job.job_id not in self.memory.allocation_errors:
                self.memory.allocation_errors.add(job.job_id)
                self.reporter.emit(fev.AllocationUnreadable(job_id=job.job_id, error=str(exc)[:300]))
            return None
        self.rank_nodes.learn_launch(job.job_id, allocation.nodes if allocation is not None else None)
        return allocation

    def rank_error(self, job_id: str, launch_end: LaunchEnd | None) -> RankError | None:
        """What the failing rank printed last, from the tail of the job's output (srun named the
        task in `launch_end`, when it got that far). None when srun names a task killed by a
        signal: that task printed no error, and its peers' errors (a closed connection) are
        consequences that would read as the cause."""
        if launch_end is not None and launch_end.blames_signalled_task:
            return None
        task = launch_end.failed_task if launch_end is not None else None
        return read_rank_error(self.paths.job_output(job_id), task)

    def decided(self, job: JobRecord, launch: int) -> bool:
        """A decision the controller itself wrote (the owner's, valid): a file someone else planted
        there is not one, and the launch is decided now."""
        try:
            return read_decision(self.paths.launch_decision(job.job_id, launch)) is not None
        except ContractError:
            return False

    def assess(self, running: JobRecord) -> Assessment:
        """Observe the ranks whose beats the last `beats()` read: liveness by change on this
        process's clock, then the rules; the hang limits are learned per launch from the gaps
        between marks the beats report."""
        memory, mono, watchdog = self.memory, self.monotonic(), self.cfg.watchdog
        views = memory.liveness.observe(self._beat_files, running.job_id, mono)
        launch = (running.job_id, memory.liveness.incarnation)
        if memory.timeouts_launch != launch:
            memory.timeouts = PhaseTimeouts.from_watchdog(watchdog)
            memory.timeouts_launch = launch
        memory.timeouts.learn(memory.liveness.gaps_changed)
        assessment = assess(
            views,
            job_id=running.job_id,
            job_seen_at=memory.liveness.job_seen_at,
            world_size=self.cfg.world_size,
            now=mono,
            dead_after=watchdog.dead_after_seconds,
            silent_after=silent_after(watchdog),
            timeouts=memory.timeouts,
            stall_tolerance=watchdog.stall_tolerance_seconds,
            probed=memory.prober.verdicts(running.job_id),
            ask_after=probe_after(watchdog),
            stalled_ranks=self._ranks_on(memory.prober.stalled_nodes(running.job_id), running),
            first_beat_at=memory.liveness.first_beat_at,
        )
        memory.node_beat_age = assessment.host_beat_age
        return assessment

    def trust_problems(self) -> tuple[list[str], list[str]]:
        """(new job folders, the trust check's problems) when jobs/<id>/ folders appeared since the
        last look; ([], []) otherwise. The check at start cannot see what a job makes later (a job
        folder made under a careless umask by an older job script); it runs again, whole, each
        time one appears. The first look only notes what is there (the start checked it)."""
        try:
            now = {name for name in os.listdir(self.paths.jobs) if name.isdigit()}
        except OSError:
            return [], []
        seen = self.memory.job_dirs_checked
        self.memory.job_dirs_checked = now | (seen or set())
        new = sorted(now - seen, key=int) if seen is not None else []
        if not new:
            return [], []
        ckpt = checkpoints_dir(self.paths.root, self.cfg.checkpoint.dir)
        return new, check_trust(self.paths, self.cfg.operators, ckpt)

    def silent_for(self) -> float:
        """How long the current incarnation's ranks have not beaten (the longest, on this clock)."""
        mono = self.monotonic()
        return max((mono - view.beat_changed for view in self.memory.liveness.ranks.values()), default=0.0)
