"""The one place where the controller changes the world (a mixin of Controller): `apply` carries out
the policy's actions in order (actions.py), with the bookkeeping every restart shares.

Events, notifications, cancelling jobs, the exclude list, restarts at job level or inside the job
(launches.py), submissions, status changes and the requests published to the trainer all go
through here, so that the policy modules stay pure and the simulation drives the same code.
"""

from __future__ import annotations

from typing import Any

from orchestrator.protocol import JobState

from . import exclude as exclude_list
from . import requests as intake
from .actions import (
    Action,
    Cancel,
    DumpStacks,
    Exclude,
    Notify,
    PublishRequest,
    Record,
    Relaunch,
    ResetProgressCounter,
    Restart,
    SetStatus,
    Stop,
    Submit,
    WithdrawRequest,
)
from .stacks import collect_stacks
from .state import JobRecord, RunStatus


class Acting:
    """Needs from its host: paths, cfg, scheduler, state, clock, monotonic, sleep,
    stack_wait_seconds, _event(), _notify(), _submit(), _queued_jobs(), _relaunch()."""

    def apply(self, actions: list[Action], result: Any) -> None:
        """Carry out the policy's actions, in order: the only place that changes the world."""
        for action in actions:
            if isinstance(action, Record):
                self._event(action.event, **action.fields)
            elif isinstance(action, Notify):
                self._notify(action.kind, action.message, action.details)
            elif isinstance(action, Cancel):
                self._cancel([j for j in self.state.jobs if j.job_id in action.job_ids], action.why)
            elif isinstance(action, DumpStacks):
                self._dump_stacks(action.job_id)
            elif isinstance(action, Exclude):
                try:
                    exclude_list.add_excluded(
                        self.paths, list(action.nodes), reason=action.reason, by="controller"
                    )
                except OSError as exc:  # the restart still goes on; the job script gets no exclude
                    self._event("exclude_failed", nodes=list(action.nodes), error=str(exc))
                    continue
                self._event(
                    "nodes_excluded",
                    nodes=list(action.nodes),
                    job_id=action.job_id,
                    cause=action.cause,
                    excluded=exclude_list.excluded_nodes(self.paths),
                )
            elif isinstance(action, Relaunch):  # before Restart: a Relaunch is one
                self._relaunch(action, result)
            elif isinstance(action, Restart):
                self._restart(action, result)
            elif isinstance(action, Submit):
                record = self._submit(action.reason)
                result.actions.append(f"submitted ({action.reason}) as job {record.job_id}")
            elif isinstance(action, Stop):
                self.state.move_to(action.status)
                self.state.recovering = None
                self._event(
                    "run_stopped", status=action.status.value, message=action.message, **action.fields
                )
                self._notify(
                    action.notify_kind, action.message, {"status": action.status.value, **action.fields}
                )
                result.actions.append(f"stopped ({action.status.value})")
            elif isinstance(action, SetStatus):
                self.state.move_to(action.status)
            elif isinstance(action, ResetProgressCounter):
                self.state.restarts_without_progress = 0
            elif isinstance(action, PublishRequest):
                intake.publish(self.paths, action.request)
                result.actions.append(action.request.name)
            elif isinstance(action, WithdrawRequest):
                intake.withdraw(self.paths, action.name)
                if action.consumed:
                    intake.consume(self.paths, action.name)
            else:  # pragma: no cover - a new action type without a branch here is a bug
                raise TypeError(f"unknown controller action {action!r}")

    def _cancel(self, records: list[JobRecord], outcome: str) -> None:
        if not records:
            return
        self.scheduler.cancel([r.job_id for r in records])
        for record in records:
            record.outcome = outcome
            record.ended_at = record.ended_at or self.clock()
            record.state = JobState.CANCELLED.value
        self._event("jobs_cancelled", job_ids=[r.job_id for r in records], why=outcome)

    def _restart(self, action: Restart, result: Any) -> None:
        excluded = exclude_list.excluded_nodes(self.paths)
        queued = self._queued_jobs()
        cause = action.cause
        if queued:
            successor = queued[0]
            self.scheduler.update_exclude([successor.job_id], excluded)
            if successor.state == JobState.HELD.value:
                self.scheduler.release([successor.job_id])
            successor.exclude = excluded
            successor.reason = f"restart after {cause}"
            how = f"queued successor {successor.job_id} (exclude list updated)"
        else:
            successor = self._submit(f"restart after {cause}")
            how = f"resubmitted as job {successor.job_id}"
        self._begin_recovery(action, successor.job_id, how, in_allocation=False)
        result.actions.append(f"restart: {how}")

    def _begin_recovery(self, action: Restart, job_id: str, how: str, *, in_allocation: bool) -> None:
        """The bookkeeping of any restart: counters, the `restart` event, the recovery followed to
        its first step (`first_step_after_restart`), the notification."""
        self.state.restarts += 1
        self.state.restarts_without_progress = action.restarts_without_progress
        self.state.checkpoint_step_at_last_restart = action.resume_step
        excluded = exclude_list.excluded_nodes(self.paths)
        cause = action.cause
        now = self.clock()
        restart = {
            "job_id": job_id,
            "in_allocation": in_allocation,
            "failed_job_id": action.failed_job_id,
            "cause": cause,
            "failure_time": action.failure_time,
            "detection_time": now,
            "restart_time": now,
            "resume_step": action.resume_step,
            "last_step": action.last_step,
            "work_lost_steps": (action.last_step - action.resume_step)
            if action.last_step is not None
            else None,
            "work_lost_seconds": action.work_lost_seconds,
            "excluded": excluded,
            "how": how,
            "restarts_without_progress": action.restarts_without_progress,
        }
        self._event("restart", **restart)
        self.state.recovering = restart
        self.state.move_to(RunStatus.RESTARTING)
        self._notify(
            "restart",
            f"restarting from step {action.resume_step} after {cause} in job {action.failed_job_id}: {how}",
            restart,
        )

    def _dump_stacks(self, job_id: str) -> None:
        """Ask the live ranks for their Python stacks before the job is cancelled (stacks.py)."""
        event, fields = collect_stacks(
            self.paths,
            job_id,
            expected=self.cfg.world_size,
            wait_seconds=self.stack_wait_seconds,
            now=self.clock(),
            monotonic=self.monotonic,
            sleep=self.sleep,
        )
        self._event(event, **fields)
