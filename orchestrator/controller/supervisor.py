"""The controller of one run: the loop (`run`) and one supervision pass (`tick`).

Each pass goes through the same stages, and in each one observes what it needs (files, the
scheduler), decides with pure rules (jobs.py, kill_resume.py, launches.py, policy.py, recovery.py,
stragglers.py, upkeep.py: they return actions) and applies the actions (applier.py, the only
place that changes the world):
1. jobs: the ones `runctl submit` queued, refreshed from the scheduler (a requeue is noticed here);
   a new job folder makes the trust check run again (an event and a page when it fails);
2. operator requests in control/, authenticated (requests.py) -> kill_resume (kill, resume,
   nodes-clear), health_policy (a rollback);
3. the running job: its launcher's record, its heartbeats judged by change on this process's
   monotonic clock (liveness.py, detection.py) -> policy -> recovery;
4. training health: the metrics.jsonl lines written since the last pass (metrics_follower.py)
   judged by training_health's rules -> health_policy (notify, pause, rollback);
5. jobs that ended -> policy -> recovery; a health pause or rollback whose job is gone goes on;
6. upkeep: a run supervised as usual always has a job; the disk before the next checkpoint;
   checkpoints that completed; the ranks' damage reports; the run's status.
A failure seen while the checkpoint disk cannot hold the next checkpoint pauses the run instead
of restarting it, and every pass of a paused run checks whether it can resume (disk_pause.py).
Everything it does goes to events.jsonl; state.json is saved when something changed.

Never ending: a pass that raises (squeue timing out, a full disk, a bug) is recorded, notified once
per kind of error, and retried with backoff. The run stays supervised; the controller only stops
when the run does.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.contract import (
    KILL_REQUEST,
    ROLLBACK_REQUEST,
    Heartbeat,
    Outcome,
    RunPaths,
    checkpoints_dir,
    classify_end,
    new_directive_id,
)
from orchestrator.contract import events as ev
from orchestrator.contract import exclude as exclude_list
from orchestrator.contract.checkpoints import (
    CheckpointInfo,
    list_checkpoints,
    resume_point,
    rollback_candidates,
)
from orchestrator.contract.controller_lock import ControllerLock
from orchestrator.contract.disk_space import DiskCheck, check_disk, what_to_delete
from orchestrator.contract.files import pass_collection
from orchestrator.contract.manifest import read_damage_reports
from orchestrator.contract.operators import check_trust, prepare_permissions
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, JobRecord, load_state
from orchestrator.contract.training_health import assess, history_length, policy_for
from orchestrator.errors import PermissionDeniedError
from orchestrator.plan.planner import planned_checkpoint_bytes
from orchestrator.slurm.base import Scheduler

from . import blame, disk_pause, health_policy, jobs, launches, pool, upkeep
from . import requests as intake
from .actions import Action, ChangeState, Notify, Record, SetOutcome
from .applier import Applier
from .detection import Assessment, stale_hosts
from .interval import IntervalLearner
from .kill_resume import on_requests
from .memory import NOT_ASKED, Memory
from .metrics_follower import MetricsFollower
from .observer import Observer
from .pass_view import Jobs, JobView, RunView
from .persistence import Persistence
from .policy import exit_code_from_beats, on_findings, on_job_end
from .recovery import Incident, plan_restart
from .reporter import Reporter
from .stalls import StallWatch
from .submission import Submitter, default_submitter, discover_chain_jobs, reconcile_intent
from .timeouts import PhaseTimeouts

log = logging.getLogger("runctl.controller")
MAX_BACKOFF_SECONDS = 300.0


@dataclass
class PassResult:
    time: float
    status: str
    assessment: Assessment | None = None
    actions: list[str] = field(default_factory=list)
    error: str | None = None


class Controller:
    def __init__(
        self,
        run_dir: str | Path,
        cfg: Any,
        scheduler: Scheduler,
        *,
        submitter: Submitter | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        stack_wait_seconds: float = 5.0,
    ):
        self.paths = RunPaths.of(run_dir)
        self.cfg = cfg
        self._scheduler = scheduler
        self.submitter = submitter or default_submitter(self.paths, cfg, scheduler, self._spares_now)
        self.clock = clock  # wall clock of the login node: timestamps of events
        self.monotonic = monotonic  # durations and liveness (a simulation passes a virtual one)
        self.sleep = sleep
        self.lock = ControllerLock(self.paths.root)
        self.state = ControllerState()
        self.memory = Memory.fresh(cfg.watchdog)
        self.memory.stalls = StallWatch(cfg.exclusions, cfg.watchdog.heartbeat_seconds)
        self.interval = IntervalLearner.of(cfg, self.paths)
        self.reporter = Reporter(self.paths, cfg, clock)
        self.applier = Applier(
            paths=self.paths,
            cfg=cfg,
            scheduler=scheduler,
            memory=self.memory,
            reporter=self.reporter,
            submitter=lambda: self.submitter,
            clock=clock,
            monotonic=monotonic,
            sleep=sleep,
            stack_wait_seconds=stack_wait_seconds,
            judge_pool=lambda: self._pool([]),
        )
        self.observer = Observer(
            paths=self.paths,
            cfg=cfg,
            scheduler=scheduler,
            memory=self.memory,
            reporter=self.reporter,
            monotonic=monotonic,
        )
        self.persistence = Persistence(self.paths, cfg, self.reporter, clock)
        self._started = False
        self._failing_passes = 0
        self._notified_errors: set[str] = set()
        self._disk_full_error = False  # the last failed pass hit a full disk (no backoff)
        self._pass_disk: tuple[list[CheckpointInfo], DiskCheck] | None = None  # this pass's look
        self._wall, self._mono = clock(), monotonic()  # the pass's one reading of each clock (tick)
        self._node_of = self.observer.rank_nodes.node_of

    @property
    def scheduler(self) -> Scheduler:
        return self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Scheduler) -> None:
        """One scheduler for the controller and its applier (tests and tools swap it)."""
        self._scheduler = self.applier.scheduler = self.observer.scheduler = scheduler

    @property
    def timeouts(self) -> PhaseTimeouts:
        """The per-phase hang limits learned for the running launch (timeouts.py)."""
        return self.memory.timeouts

    @property
    def ckpt_dir(self) -> Path:
        return checkpoints_dir(self.paths.root, self.cfg.checkpoint.dir)

    # Lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Take the run's lock and pick up where the last controller left off."""
        self.lock.acquire()
        self._started = True
        for warning in prepare_permissions(self.paths, self.cfg.operators):
            self.reporter.emit(ev.PermissionsWarning(message=warning))
        problems = check_trust(self.paths, self.cfg.operators, self.ckpt_dir)
        if problems:
            # Like sshd's StrictModes: a file the controller trusts that someone else can write
            # could steer it (forged state, a swapped run.yaml); refuse, and say how to fix it.
            self.lock.release()
            self._started = False
            raise PermissionDeniedError(
                f"refusing to supervise {self.paths.root}: files it trusts are not the owner's alone:\n  - "
                + "\n  - ".join(problems)
            )
        self.state = load_state(self.paths)
        for record in reconcile_intent(self.state, self.scheduler):
            self.reporter.emit(
                ev.JobAdopted(
                    job_id=record.job_id, why="submitted by a controller that died before recording it"
                )
            )
        jobs_now = [j.job_id for j in self.state.live_jobs()]
        self.reporter.emit(ev.ControllerStarted(status=self.state.status.value, jobs=jobs_now))
        self.persistence.save(self.state)

    def stop(self) -> None:
        if self._started:
            self.persistence.save(self.state)
            self.lock.release()
            self._started = False

    def run(
        self,
        on_pass: Callable[[PassResult], None] | None = None,
        stay: bool = False,
        max_seconds: float | None = None,
    ) -> str:
        """Supervise until the run stops (finished, killed, crash loop), or forever with `stay`.
        A pass that raises is recorded and retried with backoff; it never ends the loop."""
        began = self.monotonic()
        while True:
            result = self.safe_tick()
            if on_pass:
                try:
                    on_pass(result)
                except OSError as exc:  # the caller's output (a full disk under stdout): not the run's end
                    log.error("the per-pass hook failed (%s); supervision goes on", exc)
            if self.state.status.stopped and not stay and result.error is None:
                return result.status
            if max_seconds is not None and self.monotonic() - began > max_seconds:
                return result.status
            self.sleep(self._pause())

    def _pause(self) -> float:
        poll = self.cfg.watchdog.poll_seconds
        if not self._failing_passes or self._disk_full_error:
            return poll  # a full disk is retried every pass: the run goes on as soon as there is room
        return min(MAX_BACKOFF_SECONDS, poll * 2 ** min(self._failing_passes - 1, 10))

    def safe_tick(self) -> PassResult:
        """One pass; an exception becomes an event and a notification (once per kind), never a crash."""
        try:
            with pass_collection():  # see there: a collection a pass traversing 16,384 ranks' beats otherwise
                result = self.tick()
        except Exception as exc:  # noqa: BLE001 - the run must stay supervised whatever failed
            self._failing_passes += 1
            self._disk_full_error = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
            kind = f"{type(exc).__name__}: {str(exc)[:200]}"
            log.error("supervision pass failed (%d in a row): %s", self._failing_passes, kind)
            self.reporter.emit(
                ev.PassFailed(
                    error=kind,
                    passes_failed_in_a_row=self._failing_passes,
                    retry_in_seconds=self._pause(),
                    where=traceback.format_exc(limit=3)[-800:],
                )
            )
            if type(exc).__name__ not in self._notified_errors:
                self._notified_errors.add(type(exc).__name__)
                self.reporter.notify(
                    Notice.FAILURE,
                    f"controller pass failed: {kind}; retrying every {self._pause():.0f} s "
                    "(the run is still supervised)",
                    {"error": kind},
                )
            self.persistence.beat(self.state, self._failing_passes, self.memory.node_beat_age)
            return PassResult(time=self.clock(), status=self.state.status.value, error=kind)
        if self._failing_passes:
            self.reporter.emit(ev.PassRecovered(after_failed_passes=self._failing_passes))
            self._failing_passes, self._disk_full_error = 0, False
        return result

    # One pass -------------------------------------------------------------------------------
    def tick(self) -> PassResult:  # one reading of each clock: every decision of a pass is made at one time
        self._wall, self._mono = self.clock(), self.monotonic()
        self.observer.forget_slurm_nodes()  # asked once a pass, like the disk (_pass_disk)
        result = PassResult(time=self._wall, status=self.state.status.value)
        done = result.actions
        self._pass_disk = None
        self._apply(jobs.adopt(self.state, discover_chain_jobs(self.paths)), done)
        self._apply(upkeep.trust_lost(*self.observer.trust_problems()), done)
        self._apply(
            jobs.refresh(
                self.state,
                self.observer.scheduler_view(self.state),
                wall_now=self._wall,
                last_seen=self.observer.ended_seen(),
            ),
            done,
        )
        if self._requests(done) or self.state.status.stopped:
            return self._finish_pass(result)
        if self.state.disk_pause is not None:
            check = self._disk_check()[1]
            self._apply(disk_pause.while_paused(self.state, check, self._to_delete(check), self._wall), done)
        beats = self.observer.beats()
        running = jobs.running_job(self.state)
        if running is not None and self._supervise(running, beats, result):
            return self._finish_pass(result)
        # Before the ends: a job seen ended at the start of this pass wrote its last metrics already.
        self._judge_health(done)
        for record in list(self.state.jobs):
            if record.outcome is None and record.ended_at is not None:
                self._job_ended(record, beats, done)
                if self.state.status.stopped:
                    break
        if not self.state.status.stopped:
            self._apply(health_policy.settle(self.state, Jobs.of(self.state)), done)
        if self.state.status.active and self.state.disk_pause is None:
            self._apply(jobs.ensure_a_job(self.state, self._wall), done)
        if not self.state.status.stopped:
            self._disk_and_checkpoints(done)
            self._apply(self.interval.after_pass(self.state.jobs, beats, self._wall), done)
        self._apply(
            upkeep.damage_reports(read_damage_reports(self.ckpt_dir), self.state.damage_reports_seen), done
        )
        return self._finish_pass(result)

    def _apply(self, actions: list[Action], done: list[str]) -> None:
        self.applier.apply(actions, self.state, done)
        self.interval.count_failures(actions)

    # Stage 2: operator requests ------------------------------------------------------------------
    def _requests(self, done: list[str]) -> bool:
        """Kill and resume requests. True when the pass should end here."""
        received = intake.read_requests(self.paths, self.cfg.operators, self.clock)
        self._apply([Record(event) for event in received.events], done)
        running = jobs.running_job(self.state)
        verdict = on_requests(
            self.state,
            received.requests,
            running_job_id=running.job_id if running else None,
            queued_job_ids=[j.job_id for j in jobs.queued_jobs(self.state)],
            unsettled_job_ids=[j.job_id for j in self.state.live_jobs() if j.ended_at is not None],
        )
        self._apply(verdict.actions, done)
        rollback = received.requests.get(ROLLBACK_REQUEST)
        if rollback is not None:
            self._apply(
                health_policy.on_rollback_request(
                    self.state,
                    rollback,
                    kill_pending=KILL_REQUEST in received.requests,
                    jobs=Jobs.of(self.state),
                    wall_now=self._wall,
                    directive_id=new_directive_id(),
                ),
                done,
            )
        return verdict.end_pass

    # Stage 3: the running job ---------------------------------------------------------------------
    def _supervise(self, running: JobRecord, beats: list[Heartbeat], result: PassResult) -> bool:
        """True when the pass should end here (a failure was handled)."""
        done, memory = result.actions, self.memory
        allocation = self.observer.allocation(running)
        self._apply(
            launches.relay_unhealthy(
                self.state, running, allocation, self.cfg.watchdog.max_excluded_per_incident
            ),
            done,
        )
        if (
            allocation is not None
            and allocation.waiting
            and not self.observer.decided(running, allocation.launch)
        ):
            actions, failure = launches.launch_failed(
                self.state,
                running,
                allocation,
                beats,
                wall_now=self._wall,
                silent_for=self.observer.silent_for(),
                rank_error=self.observer.rank_error(running.job_id, allocation.ended),
            )
            self._apply(actions, done)
            if failure is not None:
                self._recover(failure, done)
            return True
        assessment = self.observer.assess(running)
        view = self._job_view(running, beats, assessment)
        stalled = memory.prober.stalled_nodes(running.job_id)
        self._apply(memory.prober.on_pass(view, getattr(self.scheduler, "probe_node", None)), done)
        if assessment.dead and memory.prober.stalled_nodes(running.job_id) - stalled:
            # A node this pass found in a storage stall: ranks missing there are judged again with
            # it (a pass late for the probe, e.g. behind a slow slurmctld, must not fail them first).
            assessment = self.observer.assess(running)
            view = self._job_view(running, beats, assessment)
        result.assessment = assessment
        self._apply(upkeep.follow_recovery(self.state, assessment, self._wall), done)
        started = upkeep.training_started(assessment)
        if started is not None and started[0] not in memory.training_seen:
            memory.training_seen.add(started[0])
            self._apply([Record(started[1]), *map(Record, upkeep.dropped_copies(assessment))], done)
        self._apply(health_policy.rollback_applied(self.state, running.job_id, assessment.reference), done)
        self._apply(memory.stragglers.on_pass(view), done)
        self._apply(memory.stalls.on_pass(view, memory.prober.stalled_before_beating(running.job_id)), done)
        if assessment.findings:
            self._failures(view, done)
            return True
        memory.job_wide_since = None
        return False

    def _run_view(self) -> RunView:
        return RunView(
            wall=self._wall, mono=self._mono, state=self.state, jobs=Jobs.of(self.state), cfg=self.cfg
        )

    def _job_view(self, job: JobRecord, beats: list[Heartbeat], assessment: Assessment) -> JobView:
        return JobView(
            wall=self._wall,
            mono=self._mono,
            state=self.state,
            jobs=Jobs.of(self.state),
            cfg=self.cfg,
            job=job,
            beats=tuple(beats),
            assessment=assessment,
            excluded=frozenset(exclude_list.excluded_nodes(self.paths)),
            run_dir=str(self.paths.root),
            node_of_rank=lambda rank, host: self._node_of(rank, host, job),
        )

    def _failures(self, view: JobView, done: list[str]) -> None:
        memory, mono, assessment = self.memory, self._mono, view.assessment
        since = memory.job_wide_since
        memory.job_wide_since = (mono if since is None else since) if assessment.job_wide else None
        suspected = blame.HangSuspicions(self.state.hang_suspects)  # in state.json: survives a restart
        culprits = blame.culprit_nodes(assessment, view.node_of, suspected, self._wall)
        verdict = on_findings(
            view,
            job_wide_for=mono - memory.job_wide_since if memory.job_wide_since is not None else 0.0,
            culprit_nodes=culprits,
        )
        if verdict.failure is not None:
            memory.job_wide_since = None
            self._failed(verdict.actions, verdict.failure, done)
        else:
            self._apply(verdict.actions, done)

    # Stage 5: jobs that ended, and recovery -----------------------------------------------------------
    def _job_ended(self, record: JobRecord, beats: list[Heartbeat], done: list[str]) -> None:
        allocation = self.observer.allocation(record)
        # How its last launch ended, as its launcher read srun's report (earlier launches of a job
        # with spares were handled inside the job); None when the launcher never got that far.
        launch_end = allocation.ended if allocation is not None else None
        exit_code = record.exit_code
        if exit_code is None and launch_end is not None:
            exit_code = launch_end.exit_code
        if exit_code is None:
            exit_code = exit_code_from_beats(record.job_id, beats)
        job_beats = [b for b in beats if b.job_id == record.job_id]
        first_gone = stale_hosts(job_beats, margin=self.cfg.watchdog.dead_after_seconds)
        stale_nodes = sorted(
            {self._node_of(b.rank, b.host, record) for b in job_beats if b.host in first_gone}
        )
        outcome, actions, failure = on_job_end(
            self.state,
            record,
            exit_code,
            launch_end=launch_end,
            job_beats=job_beats,
            stale_nodes=stale_nodes,
            wall_now=self._wall,
            queued_job_ids=[j.job_id for j in jobs.queued_jobs(self.state)],
            unhealthy_nodes=tuple(allocation.unhealthy) if allocation is not None else (),
            rank_error=self.observer.rank_error(record.job_id, launch_end)
            if classify_end(record.state, exit_code) is Outcome.FAILED
            else None,
        )
        if failure is not None:
            self._failed([SetOutcome(record.job_id, outcome.value), *actions], failure, done)
        else:
            self._apply([SetOutcome(record.job_id, outcome.value), *actions], done)

    def _failed(self, actions: list[Action], failure: Incident, done: list[str]) -> None:
        """A failure: recovery, or, when the checkpoint disk cannot hold the next checkpoint, a
        pause whose one notification replaces the failure's (disk_pause.py)."""
        check = self._disk_check()[1]
        pause = disk_pause.pause_on_failure(
            self.state,
            job_id=failure.job_id,
            cause=failure.cause,
            job_running=failure.job_running,
            check=check,
            to_delete=[] if check.fits else self._to_delete(check),
            queued=jobs.queued_jobs(self.state),
            wall_now=self._wall,
        )
        if pause is None:
            self._apply(actions, done)
            self._recover(failure, done)
            return
        self._apply([a for a in actions if not isinstance(a, Notify)], done)
        self._apply(pause, done)
        done.append(f"paused: the checkpoint disk {check.mount} is full")

    def _recover(self, failure: Incident, done: list[str]) -> None:
        if failure.culprits:  # ask SLURM before blaming: a node it downs or drains is its problem
            slurm_nodes = self.observer.slurm_nodes()
            kept, actions = pool.leave_to_slurm(failure, slurm_nodes)
            cluster = self.cfg.cluster
            # The next job can start with `nodes` (it asks for the spares the pool has: pool.judge).
            kept, capped = blame.spare_the_pool(
                replace(failure, culprits=kept),
                slurm_nodes,
                exclude_list.read_exclusions(self.paths),
                needed=cluster.nodes,
                partition=cluster.partition,
            )
            actions += capped
            self._apply(actions, done)
            failure = replace(failure, culprits=kept)
        resume, skipped = resume_point(self.ckpt_dir)
        failed = self.state.job(failure.job_id)
        allocation = self.observer.allocation(failed) if failed is not None and failure.job_running else None
        queued = [j.job_id for j in jobs.queued_jobs(self.state)]
        self._apply(
            plan_restart(self.state, self.cfg.watchdog, failure, resume, skipped, queued, allocation), done
        )

    # Stage 4: training health ----------------------------------------------------------------------
    def _judge_health(self, done: list[str]) -> None:
        """Judge the metrics written since the last pass, while the run is supervised as usual (a
        pause or a rollback whose job is gone goes on in health_policy.settle, after the job ends)."""
        health, state = self.cfg.health, self.state
        if not (state.status.active and health.enabled):
            return
        follower = self.memory.metrics
        if follower is None:
            follower = self.memory.metrics = MetricsFollower(self.paths.metrics, history_length(health))
        new, actions = health_policy.to_judge(follower.poll(state.metrics_offset), state.new_history_by_step)
        if follower.offset != state.metrics_offset:
            actions.append(ChangeState(metrics_offset=follower.offset or 0))
        self._apply(actions, done)
        findings = assess(follower.history, health, since_step=min(r.step for r in new) - 1) if new else []
        if not findings:
            return
        wants_rollback = any(policy_for(f, health) == "rollback" for f in findings)
        self._apply(
            health_policy.on_findings(
                self._run_view(),
                findings,
                history=follower.history,
                checkpoints=rollback_candidates(self.ckpt_dir) if wants_rollback else [],
                directive_id=new_directive_id(),
                owner_uid=os.geteuid(),
            ),
            done,
        )

    # Stage 6: upkeep ------------------------------------------------------------------------------
    def _disk_check(self) -> tuple[list[CheckpointInfo], DiskCheck]:
        """The complete checkpoints and the disk check, looked at once per pass."""
        if self._pass_disk is None:
            memory = self.memory
            if memory.planned_bytes == NOT_ASKED:
                memory.planned_bytes = planned_checkpoint_bytes(self.cfg)
            complete = [c for c in list_checkpoints(self.ckpt_dir, memory.manifests_seen) if c.complete]
            last = complete[-1].size_bytes if complete else None
            self._pass_disk = complete, check_disk(self.ckpt_dir, last, memory.planned_bytes or None)
        return self._pass_disk

    def _to_delete(self, check: DiskCheck) -> list[dict[str, Any]]:
        shortfall = max(0, (check.needed_bytes or 0) - check.free_bytes)
        return what_to_delete(self.ckpt_dir, self.cfg.checkpoint.keep_last, shortfall)

    def _disk_and_checkpoints(self, done: list[str]) -> None:
        memory = self.memory
        complete, check = self._disk_check()
        self._apply(upkeep.completed_checkpoints(complete, memory.checkpoints_seen), done)
        memory.checkpoints_seen = {c.step for c in complete} | (memory.checkpoints_seen or set())
        self._apply(
            upkeep.disk_level(check, self.state.disk_level, paused=self.state.disk_pause is not None), done
        )

    def _pool(self, done: list[str]) -> None:
        """Probations that expired, then the pool against what the next job needs (pool.py). Not while
        slurmctld does not answer (scontrol would wait as long as squeue did)."""
        if self.state.status.stopped or self.memory.scheduler_down_since is not None:
            return
        self._apply(pool.expired(exclude_list.read_exclusions(self.paths), self._wall), done)
        c = self.cfg.cluster
        verdict = pool.judge(self.state, self.observer.slurm_nodes(), exclude_list.read_exclusions(self.paths),
                             nodes=c.nodes, spares=c.spare_nodes, partition=c.partition, now=self._wall,
                             policy=self.cfg.exclusions.on_pool_short, run_dir=str(self.paths.root))  # fmt: skip
        self._apply(verdict, done)

    def _spares_now(self) -> int:
        """The spares a submission asks for, the pool judged again first: the failure being
        recovered may have excluded a node in this very pass, and a job asking for the spares the
        pool had before it is one SLURM refuses (`Requested node configuration is not available`)."""
        self._pool([])
        return pool.spares_for_next_job(self.state, self.cfg.cluster.spare_nodes)

    def _finish_pass(self, result: PassResult) -> PassResult:
        self._pool(result.actions)
        self._apply(upkeep.status_after_pass(self.state), result.actions)
        self.state.last_pass = result.time
        result.status = self.state.status.value
        self.persistence.save_if_changed(self.state, result.time)
        self.persistence.beat(self.state, self._failing_passes, self.memory.node_beat_age)
        return result
