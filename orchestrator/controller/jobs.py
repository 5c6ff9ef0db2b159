"""The controller's view of the run's jobs, kept in step with the scheduler (a mixin of Controller).

- Adopt the jobs `runctl submit` queued (its ledger, jobs/<id>/).
- Refresh every live job from the scheduler each pass; slurmctld not answering is an event, not
  an error (the heartbeats of the job known to run are still judged).
- A job SLURM requeued under the same id (it went back to pending, or its SLURM start time
  changed) resets the liveness view: its old heartbeats mean nothing now.
- A run that is not stopped always has a job running or queued; submissions go through the
  intent protocol of submission.py (never twice).
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SchedulerError
from orchestrator.protocol import JobState

from . import exclude as exclude_list
from .actions import Submit
from .state import JobRecord
from .submission import discover_chain_jobs, last_seen_end, submit_once

QUEUED_STATES = (JobState.PENDING.value, JobState.HELD.value)
RUNNING_STATES = (JobState.RUNNING.value, JobState.COMPLETING.value)


class JobTracking:
    """Needs from its host: paths, cfg, scheduler, state, liveness, submitter, clock, monotonic,
    _scheduler_down_since, _event(), apply()."""

    def _adopt_chain_jobs(self) -> None:
        known = {j.job_id for j in self.state.jobs}
        for job_id in discover_chain_jobs(self.paths):
            if job_id not in known:
                self.state.jobs.append(
                    JobRecord(job_id=job_id, submitted_at=self.clock(), reason="runctl submit")
                )
                why = "submitted by runctl submit"
                if self.state.pending_submit:
                    # A controller died between sbatch and recording the id; the ledger has it.
                    why = "submitted by a controller that died before recording it"
                    self.state.pending_submit = None
                self._event("job_adopted", job_id=job_id, why=why)

    def _refresh_jobs(self) -> None:
        live = self.state.live_jobs()
        if not live:
            return
        try:
            infos = self.scheduler.jobs([j.job_id for j in live])
        except SchedulerError as exc:
            # slurmctld timing out for a while is normal on a busy cluster: keep judging the
            # heartbeats of the job we know is running; job ends wait until it answers again.
            if self._scheduler_down_since is None:
                self._scheduler_down_since = self.monotonic()
                self._event("scheduler_unreachable", error=str(exc)[:300])
            return
        if self._scheduler_down_since is not None:
            self._event(
                "scheduler_reachable", after_seconds=round(self.monotonic() - self._scheduler_down_since, 1)
            )
            self._scheduler_down_since = None
        for record in live:
            info = infos.get(record.job_id)
            if info is not None:
                self._update_record(record, info)

    def _update_record(self, record: JobRecord, info: Any) -> None:
        previous_state, previous_start = record.state, record.slurm_start
        state = info.state.value
        requeued = previous_state in RUNNING_STATES and state in QUEUED_STATES
        # Both from SLURM: a new start time under the same id is a requeue we did not see pending.
        restarted = bool(info.start_time and previous_start and info.start_time != previous_start)
        if info.start_time and state in RUNNING_STATES:
            record.slurm_start = info.start_time
        if requeued or (restarted and state in RUNNING_STATES):
            # SLURM requeued the job under the same id: its old heartbeats mean nothing now.
            record.requeues += 1
            record.started_at = None
            if record.job_id == self.liveness.job_id:
                self.liveness.expect_new_incarnation()
            self._event("job_requeued", job_id=record.job_id, state=state, requeues=record.requeues)
        record.state = state
        if info.nodes:
            record.nodes = list(info.nodes)
        if info.start_time and state in RUNNING_STATES:
            record.started_at = info.start_time
        if record.state == JobState.RUNNING.value and not record.started_at:
            record.started_at = self.clock()
        if info.exit_code is not None:
            record.exit_code = info.exit_code
        if state == JobState.UNKNOWN.value:
            cached_state, cached_code = last_seen_end(self.paths, record.job_id)
            if cached_state:
                record.state, record.exit_code = cached_state, cached_code
            elif self.clock() - record.submitted_at < 60:
                return  # just submitted: the scheduler may not list it yet; never call it lost
        if info.state.is_terminal or state == JobState.UNKNOWN.value:
            if record.ended_at is None:
                record.ended_at = info.end_time or self.clock()

    def _running_job(self) -> JobRecord | None:
        for record in self.state.live_jobs():
            if record.state in RUNNING_STATES and record.ended_at is None:
                return record
        return None

    def _queued_jobs(self) -> list[JobRecord]:
        return [j for j in self.state.live_jobs() if j.state in QUEUED_STATES and j.ended_at is None]

    def _submit(self, reason: str) -> JobRecord:
        excluded = exclude_list.excluded_nodes(self.paths)
        record = submit_once(
            self.paths,
            self.state,
            self.submitter,
            job_name=self.cfg.name,
            exclude=excluded,
            reason=reason,
            clock=self.clock,
        )
        self._event("job_submitted", job_id=record.job_id, reason=reason, exclude=excluded)
        return record

    def _ensure_a_job(self, result: Any) -> None:
        """A run that is not stopped always has a job running or queued."""
        if self.state.live_jobs():
            return
        if self.state.pending_submit:
            # A predecessor died mid-submit and this backend cannot list jobs by name: wait until
            # the job shows up (heartbeats, jobs/) rather than risk a duplicate.
            if self.clock() - self.state.pending_submit.get("time", 0) < 600:
                return
            self._event("intent_expired", intent=self.state.pending_submit)
        reason = "initial" if not self.state.jobs else "continue"
        self.apply([Submit(reason)], result)
