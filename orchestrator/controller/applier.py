"""The one place where the controller changes the world: `Applier.apply` carries out the deciding
modules' actions (actions.py), in order. Events and notifications, the scheduler (submit, cancel,
release, exclude), the exclude list, the requests published to the trainer, the decisions to a
job's launcher, the rollback directive, and every change to state.json's bookkeeping go
through here. An action without a
branch here is a bug, and raises."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator.contract import (
    NODES_CLEAR_REQUEST,
    Decision,
    JobState,
    Rollback,
    RunPaths,
    write_decision,
    write_rollback,
)
from orchestrator.contract import events as ev
from orchestrator.contract import exclude as exclude_list
from orchestrator.contract import failure_events as fev
from orchestrator.contract import pool_events as pev
from orchestrator.contract.interval import write_interval_directive
from orchestrator.contract.requests import publish_request, withdraw_request
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, JobRecord, Recovery, RunStatus
from orchestrator.errors import SchedulerError
from orchestrator.slurm.base import NodeConfigUnavailable, NodeInfo, Scheduler
from orchestrator.views.event_text import sentence

from . import requests as intake
from .actions import (
    Action,
    AdoptJob,
    Cancel,
    ChangeState,
    ClearExclusions,
    Consume,
    DumpStacks,
    Exclude,
    FollowRecovery,
    Hold,
    Notify,
    PublishDirective,
    PublishRequest,
    Record,
    Relaunch,
    Release,
    ReleaseExclusions,
    RestartRun,
    SetOutcome,
    SetStatus,
    Stop,
    Submit,
    UpdateJob,
    WithdrawRequest,
)
from .interval import PublishInterval
from .jobs import queued_jobs
from .memory import Memory
from .refusal import after_refusal
from .reporter import Reporter
from .stacks import collect_stacks
from .submission import Submitter, submit_once

log = logging.getLogger("runctl.controller")


class Applier:
    def __init__(
        self,
        *,
        paths: RunPaths,
        cfg: Any,
        scheduler: Scheduler,
        memory: Memory,
        reporter: Reporter,
        submitter: Callable[[], Submitter],
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        sleep: Callable[[float], None],
        stack_wait_seconds: float,
        judge_pool: Callable[[], None] = lambda: None,
    ):
        self.paths, self.cfg, self.scheduler, self.memory = paths, cfg, scheduler, memory
        self.reporter, self.submitter = reporter, submitter
        self.clock, self.monotonic, self.sleep = clock, monotonic, sleep
        self.stack_wait_seconds = stack_wait_seconds
        self.judge_pool = judge_pool  # before each sbatch: it may end probations SLURM would refuse it for

    def apply(self, actions: list[Action], state: ControllerState, done: list[str]) -> None:
        """Carry out `actions` in order; `done` collects what a person would want to know was done."""
        for action in actions:
            self._one(action, state, done)

    def _one(self, action: Action, state: ControllerState, done: list[str]) -> None:  # noqa: C901 - one branch per action
        if isinstance(action, Record):
            self.reporter.emit(action.event)
        elif isinstance(action, Notify):
            self.reporter.notify(action.kind, action.message, action.details)
        elif isinstance(action, Cancel):
            self._cancel(state, [j for j in state.jobs if j.job_id in action.job_ids], action.why)
        elif isinstance(action, Hold):
            self.scheduler.hold(list(action.job_ids))
        elif isinstance(action, Release):
            self.scheduler.release(list(action.job_ids))
            done.append(f"released job(s) {', '.join(action.job_ids)}")
        elif isinstance(action, DumpStacks):
            self._dump_stacks(action.job_id)
        elif isinstance(action, Exclude):
            self._exclude(action)
        elif isinstance(action, ClearExclusions):
            self._clear_exclusions(action, state)
        elif isinstance(action, ReleaseExclusions):
            self._release_exclusions(action, state)
        elif isinstance(action, Relaunch):  # before RestartRun: a Relaunch is one
            self._relaunch(state, action, done)
        elif isinstance(action, RestartRun):
            self._restart(state, action, done)
        elif isinstance(action, Submit):
            record = self._submit(state, action.reason)
            if record is not None:
                done.append(f"submitted ({action.reason}) as job {record.job_id}")
            else:
                done.append(f"not submitted ({action.reason}): SLURM refused it, exclusions returned")
        elif isinstance(action, Stop):
            state.move_to(action.status)
            state.recovering = None
            state.disk_pause = None  # a stopped run is not paused: `runctl resume` starts afresh
            self.reporter.emit(
                fev.RunStopped(status=action.status.value, message=action.message, by=action.by)
            )
            self.reporter.notify(
                action.notify_kind, action.message, {"status": action.status.value, "by": action.by}
            )
            done.append(f"stopped ({action.status.value})")
        elif isinstance(action, SetStatus):
            state.move_to(action.status)
        elif isinstance(action, PublishRequest):
            publish_request(self.paths, action.request)
            done.append(action.request.name)
        elif isinstance(action, WithdrawRequest):
            withdraw_request(self.paths, action.name)
            if action.consumed:
                intake.consume(self.paths, action.name)
        elif isinstance(action, Consume):
            intake.consume(self.paths, action.name)
        elif isinstance(action, PublishDirective):
            write_rollback(self.paths, action.directive)
            done.append(f"rollback directive {action.directive.id}")
        elif isinstance(action, PublishInterval):
            write_interval_directive(self.paths, action.directive)
            done.append(f"checkpoint interval {action.directive.interval_hours:.2f} h")
        else:
            self._bookkeeping(action, state)

    def _bookkeeping(self, action: Action, state: ControllerState) -> None:
        """state.json's own records."""
        if isinstance(action, ChangeState):
            for name, value in action.changes().items():
                setattr(state, name, value.to_dict() if isinstance(value, Rollback) else value)
        elif isinstance(action, AdoptJob):
            state.jobs.append(
                JobRecord(job_id=action.job_id, submitted_at=self.clock(), reason="runctl submit")
            )
            if action.clears_intent:
                state.pending_submit = None
        elif isinstance(action, UpdateJob):
            self._update_job(state, action)
        elif isinstance(action, SetOutcome):
            record = state.job(action.job_id)
            if record is not None:
                record.outcome = action.outcome
        elif isinstance(action, FollowRecovery):
            if action.recovery is None and state.recovering is not None:
                # the restarted job trains (the crash-loop rule)
                state.training_since = self.clock() - action.trained_seconds
            state.recovering = action.recovery
        else:  # pragma: no cover - a new action type without a branch here is a bug
            raise TypeError(f"unknown controller action {action!r}")

    def _update_job(self, state: ControllerState, update: UpdateJob) -> None:
        record = state.job(update.job_id)
        if record is None:
            return
        if update.requeued:
            # SLURM requeued the job under the same id: its old heartbeats mean nothing now.
            record.requeues += 1
            if record.job_id == self.memory.liveness.job_id:
                self.memory.liveness.expect_new_incarnation()
        record.state = update.state
        record.nodes = list(update.nodes)
        record.started_at = update.started_at
        record.ended_at = update.ended_at
        record.exit_code = update.exit_code
        record.slurm_start = update.slurm_start

    # -- the scheduler and the exclude list -----------------------------------------------------
    def _submit(self, state: ControllerState, reason: str, *, again: bool = True) -> JobRecord | None:
        """The job submitted. When SLURM refuses it for too few nodes, the controller returns some
        of its own exclusions (refusal.py) and submits once more at once (a job-level restart keeps
        its bookkeeping: the `restart` event, the crash-loop count); None when that is refused too:
        the next pass submits again."""
        from orchestrator.slurm.render import run_job_name  # noqa: PLC0415 - jinja2 only when submitting

        self.judge_pool()  # an exclusion of this very pass may leave SLURM too few nodes (refusal.py)
        excluded = exclude_list.excluded_nodes(self.paths)
        # The intent names the job as sbatch will (the run's singleton key): a controller that dies
        # after sbatch finds it by that name (submission.reconcile_intent).
        try:
            record = submit_once(
                self.paths,
                state,
                self.submitter(),
                job_name=run_job_name(self.cfg.name, self.paths.root),
                exclude=excluded,
                reason=reason,
                clock=self.clock,
            )
        except NodeConfigUnavailable as exc:
            if not self._return_after_refusal(excluded, str(exc)):
                raise
            state.pending_submit = None  # refused: no job exists, nothing to wait for or adopt
            return self._submit(state, reason, again=False) if again else None
        self.reporter.emit(ev.JobSubmitted(job_id=record.job_id, reason=reason, exclude=excluded))
        return record

    def _return_after_refusal(self, refused_exclude: list[str], error: str) -> bool:
        """End the probations refusal.after_refusal names; False when it names none."""
        ask = getattr(self.scheduler, "nodes", None)  # a test double may not implement it
        try:
            slurm_nodes: dict[str, NodeInfo] | None = (ask() or None) if ask is not None else None
        except SchedulerError:
            slurm_nodes = None  # not known: one node per refusal
        c = self.cfg.cluster
        back = after_refusal(exclude_list.read_exclusions(self.paths), refused_exclude, slurm_nodes,
                             needed=c.nodes, partition=c.partition)  # fmt: skip
        if back is None:
            return False
        try:
            exclude_list.clear_excluded(self.paths, list(back.nodes))
        except (OSError, exclude_list.ExcludeLockTimeout) as exc:
            self.reporter.emit(fev.ExcludeFailed(nodes=list(back.nodes), error=f"return: {exc}"[:500]))
            return False
        self.reporter.emit(
            pev.SubmissionRefused(
                exclude=refused_exclude, returned=list(back.nodes), why=back.why, error=error[-500:]
            )
        )
        return True

    def _cancel(self, state: ControllerState, records: list[JobRecord], outcome: str) -> None:
        if not records:
            return
        self.scheduler.cancel([r.job_id for r in records])
        for record in records:
            record.outcome = outcome
            record.ended_at = record.ended_at or self.clock()
            record.state = JobState.CANCELLED.value
        self.reporter.emit(ev.JobsCancelled(job_ids=[r.job_id for r in records], why=outcome))

    def _exclude(self, action: Exclude) -> None:
        now = self.clock()
        until = now + self.cfg.exclusions.probation_hours * 3600.0
        try:
            exclude_list.add_excluded(
                self.paths, list(action.nodes), reason=action.reason, by="controller", now=now,
                until=until, cause=action.cause, job_id=action.job_id,
            )  # fmt: skip
        except (OSError, exclude_list.ExcludeLockTimeout) as exc:
            # The restart that follows still goes out, with the list as it was.
            self.reporter.emit(fev.ExcludeFailed(nodes=list(action.nodes), error=str(exc)))
            return
        self.reporter.emit(
            fev.NodesExcluded(
                nodes=list(action.nodes),
                job_id=action.job_id,
                cause=action.cause,
                excluded=exclude_list.excluded_nodes(self.paths),
                until=until,
            )
        )

    def _release_exclusions(self, action: ReleaseExclusions, state: ControllerState) -> None:
        """Probations that ended (pool.py): off the list, and off the queued jobs' lists."""
        try:
            removed = exclude_list.clear_excluded(self.paths, list(action.nodes))
        except (OSError, exclude_list.ExcludeLockTimeout) as exc:
            self.reporter.emit(fev.ExcludeFailed(nodes=list(action.nodes), error=f"release: {exc}"[:500]))
            return
        excluded = self._requeue_exclusions(state)
        self.reporter.emit(pev.ProbationEnded(nodes=removed, why=action.why, excluded=excluded))

    def _requeue_exclusions(self, state: ControllerState) -> list[str]:
        """Give the queued jobs the list as it is now: a job pending on nodes that came back must
        be able to use them (else it pends for nothing, silently)."""
        excluded = exclude_list.excluded_nodes(self.paths)
        queued = [j for j in queued_jobs(state) if j.exclude != excluded]
        if queued:
            self.scheduler.update_exclude([j.job_id for j in queued], excluded)
            for job in queued:
                job.exclude = list(excluded)
        return excluded

    def _clear_exclusions(self, action: ClearExclusions, state: ControllerState) -> None:
        """Carry out a nodes-clear and consume its request; left in place when the list cannot be
        changed, so that the next pass tries again (it is audited once, by the intake)."""
        try:
            removed = exclude_list.clear_excluded(
                self.paths, None if action.nodes is None else list(action.nodes)
            )
        except (OSError, exclude_list.ExcludeLockTimeout) as exc:
            self.reporter.emit(ev.NodesClearFailed(by=action.by, error=str(exc)[:500]))
            return
        intake.consume(self.paths, NODES_CLEAR_REQUEST)
        self._requeue_exclusions(state)
        self.reporter.emit(
            ev.NodesCleared(
                by=action.by,
                reason=action.reason,
                asked=list(action.nodes or ()),
                all_nodes=action.nodes is None,
                removed=removed,
                excluded=exclude_list.excluded_nodes(self.paths),
            )
        )

    def _dump_stacks(self, job_id: str) -> None:
        """Ask the live ranks for their Python stacks before the job is cancelled (stacks.py)."""
        self.reporter.emit(
            collect_stacks(
                self.paths,
                job_id,
                expected=self.cfg.world_size,
                wait_seconds=self.stack_wait_seconds,
                now=self.clock(),
                monotonic=self.monotonic,
                sleep=self.sleep,
            )
        )

    # -- restarts -------------------------------------------------------------------------------
    def _restart(self, state: ControllerState, action: RestartRun, done: list[str]) -> None:
        """At job level: the queued successor with the new exclude list, or a new job."""
        excluded = exclude_list.excluded_nodes(self.paths)
        queued = queued_jobs(state)
        if queued:
            successor = queued[0]
            self.scheduler.update_exclude([successor.job_id], excluded)
            if successor.state == JobState.HELD.value:
                self.scheduler.release([successor.job_id])
            successor.exclude = excluded
            successor.reason = f"restart after {action.cause}"
            how = f"queued successor {successor.job_id} (exclude list updated)"
        else:
            successor = self._submit(state, f"restart after {action.cause}")
            # Refused twice for too few nodes: the next pass submits (jobs.ensure_a_job).
            if successor is None:
                done.append("restart: SLURM refused the job, exclusions returned; submitting again next pass")
                return
            how = f"resubmitted as job {successor.job_id}"
        self._begin_recovery(state, action, successor.job_id, how, in_allocation=False)
        done.append(f"restart: {how}")

    def _relaunch(self, state: ControllerState, action: Relaunch, done: list[str]) -> None:
        """Inside the job: tell its launcher to launch again (on spares for the nodes left out)."""
        decision = Decision(
            action.launch,
            "relaunch",
            action.leave_out,
            f"{action.cause}: relaunch from step {action.resume_step}",
        )
        write_decision(self.paths.launch_decision(action.failed_job_id, action.launch), decision)
        self.memory.liveness.expect_new_incarnation(after_launch=action.launch)
        left = f"leaving out {', '.join(action.leave_out)}" if action.leave_out else "on the same nodes"
        how = (
            f"inside job {action.failed_job_id}: launch {action.launch + 1} {left} "
            f"({action.spares_left} spare(s) left)"
        )
        self._begin_recovery(state, action, action.failed_job_id, how, in_allocation=True)
        done.append(f"relaunch: {how}")

    def _begin_recovery(
        self, state: ControllerState, action: RestartRun, job_id: str, how: str, *, in_allocation: bool
    ) -> None:
        """The bookkeeping of any restart: counters, the `restart` event, the recovery followed to
        its first step (`first_step_after_restart`), the notification."""
        state.restarts += 1
        state.restarts_without_progress = action.restarts_without_progress
        state.checkpoint_step_at_last_restart = action.resume_step
        state.training_since, state.last_failure_step = None, action.last_step
        now = self.clock()
        restart = fev.Restart(
            job_id=job_id,
            in_allocation=in_allocation,
            failed_job_id=action.failed_job_id,
            cause=action.cause,
            failure_time=action.failure_time,
            detection_time=now,
            restart_time=now,
            resume_step=action.resume_step,
            last_step=action.last_step,
            work_lost_steps=(action.last_step - action.resume_step) if action.last_step is not None else None,
            work_lost_seconds=action.work_lost_seconds,
            excluded=exclude_list.excluded_nodes(self.paths),
            how=how,
            restarts_without_progress=action.restarts_without_progress,
        )
        self.reporter.emit(restart)
        state.recovering = Recovery(job_id, action.failure_time, now, action.resume_step)
        state.move_to(RunStatus.RESTARTING)
        self.reporter.notify(Notice.RESTART, sentence(restart), restart.to_dict())
