"""The controller of one run: one supervision pass (`tick`) and the loop around it (`run`).

Each pass: read the scheduler's view of the run's jobs and every heartbeat, then act:
- operator requests in control/ (kill, kill --now, resume);
- a dead or hung rank of the running job: dump stacks, cancel, exclude the culprit node(s),
  restart from the newest checkpoint that verifies;
- a job that ended: finished (stop), killed (stop), time budget (continue the chain), config
  error (stop), anything else (restart);
- a crash loop (K restarts without a new checkpoint): stop and notify;
- the disk check before the next checkpoint.
Everything it does goes to events.jsonl; state.json is saved after every pass.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.notify import notify
from orchestrator.operators import merge_inbox, prepare_permissions
from orchestrator.protocol import DUMP_STACKS_REQUEST, KILL_REQUEST, RunPaths, atomic_write_json, read_json

from . import exclude as exclude_list
from .checkpoints import list_checkpoints, newest_verified
from .detection import Assessment, Outcome, assess, classify_end, read_heartbeats
from .disk import check_disk, planned_checkpoint_bytes
from .lock import ControllerLock
from .state import ControllerState, JobRecord, RunStatus, load_state, record_event, save_state
from .submission import (
    Submitter,
    default_submitter,
    discover_chain_jobs,
    failed_task_host,
    last_seen_end,
    reconcile_intent,
    submit_once,
)
from .timeouts import PhaseSample, PhaseTimeouts, learn_from_reported, learn_from_transition

RESUME_REQUEST = "resume"
log = logging.getLogger("runctl.controller")


@dataclass
class PassResult:
    time: float
    status: str
    assessment: Assessment | None = None
    actions: list[str] = field(default_factory=list)


def checkpoint_dir(paths: RunPaths, cfg: Any) -> Path:
    configured = Path(cfg.checkpoint.dir)
    return configured if configured.is_absolute() else paths.root / configured


class Controller:
    def __init__(
        self,
        run_dir: str | Path,
        cfg: Any,
        scheduler: Any,
        *,
        submitter: Submitter | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        stack_wait_seconds: float = 5.0,
    ):
        self.paths = RunPaths.of(run_dir)
        self.cfg = cfg
        self.scheduler = scheduler
        self.submitter = submitter or default_submitter(self.paths, cfg, scheduler)
        self.clock = clock
        self.sleep = sleep
        self.stack_wait_seconds = stack_wait_seconds
        self.lock = ControllerLock(self.paths.root)
        self.state = ControllerState()
        self.timeouts = PhaseTimeouts.from_watchdog(cfg.watchdog)
        self._sample: PhaseSample | None = None
        self._planned_bytes: int | None | bool = False  # False: not asked yet
        self._started = False
        self._saved_snapshot: dict[str, Any] | None = None
        self._saved_at = 0.0

    # Lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Take the run's lock and pick up where the last controller left off."""
        self.lock.acquire()
        self._started = True
        for warning in prepare_permissions(self.paths, self.cfg.operators):
            self._event("permissions_warning", message=warning)
        self.state = load_state(self.paths)
        self.timeouts = PhaseTimeouts.from_watchdog(self.cfg.watchdog, self.state.observed_durations)
        adopted = reconcile_intent(self.state, self.scheduler)
        for record in adopted:
            self._event("job_adopted", job_id=record.job_id, why="submitted by a controller that died before recording it")
        self._event("controller_started", status=self.state.status, jobs=[j.job_id for j in self.state.live_jobs()])
        save_state(self.paths, self.state)

    def stop(self) -> None:
        if self._started:
            save_state(self.paths, self.state)
            self.lock.release()
            self._started = False

    def run(self, on_pass: Callable[[PassResult], None] | None = None, stay: bool = False,
            max_seconds: float | None = None) -> str:
        """Supervise until the run stops (finished, killed, crash loop), or forever with `stay`."""
        began = self.clock()
        while True:
            result = self.tick()
            if on_pass:
                on_pass(result)
            if result.status in RunStatus.STOPPED and not stay:
                return result.status
            if max_seconds is not None and self.clock() - began > max_seconds:
                return result.status
            self.sleep(self.cfg.watchdog.poll_seconds)

    # One pass -------------------------------------------------------------------------------
    def tick(self) -> PassResult:
        now = self.clock()
        result = PassResult(time=now, status=self.state.status)
        merge_inbox(self.paths)
        self._adopt_chain_jobs()
        self._refresh_jobs()
        if self._handle_requests(result):
            return self._finish_pass(result)
        if self.state.status in RunStatus.STOPPED:
            return self._finish_pass(result)
        running = self._running_job()
        beats = read_heartbeats(self.paths.heartbeats)
        if running is not None:
            assessment = assess(
                beats,
                job_id=running.job_id,
                job_started=running.started_at,
                world_size=self.cfg.world_size,
                now=now,
                dead_after=self.cfg.watchdog.dead_after_seconds,
                timeouts=self.timeouts,
            )
            result.assessment = assessment
            self._learn(assessment)
            self._follow_recovery(assessment)
            if assessment.findings:
                self._on_rank_failure(running, assessment, result)
                return self._finish_pass(result)
        for record in list(self.state.jobs):
            if record.outcome is None and record.ended_at is not None:
                self._on_job_end(record, beats, result)
                if self.state.status in RunStatus.STOPPED:
                    break
        if self.state.status not in RunStatus.STOPPED:
            self._ensure_a_job(result)
            self._check_disk()
        return self._finish_pass(result)

    def _finish_pass(self, result: PassResult) -> PassResult:
        self.state.last_pass = result.time
        self.state.observed_durations = dict(self.timeouts.observed_max)
        live = [j for j in self.state.live_jobs()]
        if self.state.status not in RunStatus.STOPPED and self.state.status != RunStatus.KILLING:
            if any(j.state == "running" for j in live):
                self.state.status = RunStatus.RUNNING
            elif live:
                self.state.status = RunStatus.WAITING
        result.status = self.state.status
        self._save_if_changed(result.time)
        return result

    def _save_if_changed(self, now: float) -> None:
        """state.json is fsynced: write it when something changed, else every 30 s (so that its
        last_pass shows the controller is alive) rather than on every pass."""
        snapshot = self.state.to_dict()
        snapshot.pop("last_pass", None)
        snapshot.pop("controller", None)
        if snapshot != self._saved_snapshot or now - self._saved_at > 30:
            save_state(self.paths, self.state)
            self._saved_snapshot, self._saved_at = snapshot, now

    # Jobs ----------------------------------------------------------------------------------
    def _adopt_chain_jobs(self) -> None:
        known = {j.job_id for j in self.state.jobs}
        for job_id in discover_chain_jobs(self.paths):
            if job_id not in known:
                self.state.jobs.append(JobRecord(job_id=job_id, submitted_at=self.clock(), reason="runctl submit"))
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
        infos = self.scheduler.jobs([j.job_id for j in live])
        for record in live:
            info = infos.get(record.job_id)
            if info is None:
                continue
            record.state = info.state.value
            if info.nodes:
                record.nodes = list(info.nodes)
            if info.start_time and not record.started_at:
                record.started_at = info.start_time
            if record.state == "running" and not record.started_at:
                record.started_at = self.clock()
            if info.exit_code is not None:
                record.exit_code = info.exit_code
            if info.state.value == "unknown":
                cached_state, cached_code = last_seen_end(self.paths, record.job_id)
                if cached_state:
                    record.state, record.exit_code = cached_state, cached_code
            if info.state.value == "unknown" and self.clock() - record.submitted_at < 60:
                continue  # just submitted: the scheduler may not list it yet; never call it lost
            if info.state.is_terminal or info.state.value == "unknown":
                if record.ended_at is None:
                    record.ended_at = info.end_time or self.clock()

    def _running_job(self) -> JobRecord | None:
        for record in self.state.live_jobs():
            if record.state in ("running", "completing") and record.ended_at is None:
                return record
        return None

    def _queued_jobs(self) -> list[JobRecord]:
        return [j for j in self.state.live_jobs() if j.state in ("pending", "held") and j.ended_at is None]

    def _cancel(self, records: list[JobRecord], outcome: str) -> None:
        if not records:
            return
        self.scheduler.cancel([r.job_id for r in records])
        for record in records:
            record.outcome = outcome
            record.ended_at = record.ended_at or self.clock()
            record.state = "cancelled"
        self._event("jobs_cancelled", job_ids=[r.job_id for r in records], why=outcome)

    def _submit(self, reason: str) -> JobRecord:
        excluded = exclude_list.excluded_nodes(self.paths)
        record = submit_once(self.paths, self.state, self.submitter, job_name=self.cfg.name,
                             exclude=excluded, reason=reason, clock=self.clock)
        self._event("job_submitted", job_id=record.job_id, reason=reason, exclude=excluded)
        return record

    def _ensure_a_job(self, result: PassResult) -> None:
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
        self._submit(reason)
        result.actions.append(f"submitted ({reason})")

    # Operator requests ---------------------------------------------------------------------
    def _handle_requests(self, result: PassResult) -> bool:
        """Kill and resume requests. True when the pass should end here."""
        resume_path = self.paths.control_request(RESUME_REQUEST)
        kill_path = self.paths.control_request(KILL_REQUEST)
        if resume_path.exists() and not kill_path.exists():
            request = read_json(resume_path) or {}
            resume_path.unlink(missing_ok=True)
            if self.state.status == RunStatus.FINISHED:
                self._event("resume_ignored", by=request.get("user"), why="the run has finished training")
            elif self.state.status in RunStatus.STOPPED:
                self._event("resumed", by=request.get("user"), reason=request.get("reason"), previous=self.state.status)
                self.state.status = RunStatus.WAITING
                self.state.restarts_without_progress = 0
                if not self.state.live_jobs():
                    record = self._submit("resume")
                    result.actions.append(f"resumed as job {record.job_id}")
                return True
        if not kill_path.exists() or self.state.status == RunStatus.KILLED:
            if self.state.status == RunStatus.KILLING and not kill_path.exists():
                self._event("kill_withdrawn")
                self.state.status = RunStatus.RUNNING
            return False
        request = read_json(kill_path) or {}
        running = self._running_job()
        if self.state.status != RunStatus.KILLING:
            self._event("kill_requested", by=request.get("user"), reason=request.get("reason"), now=bool(request.get("now")))
            self.state.status = RunStatus.KILLING
            self._cancel(self._queued_jobs(), "cancelled (kill switch)")
            if request.get("now") and running is not None:
                self._cancel([running], "killed (kill --now)")
                running = None
            result.actions.append("kill")
        unsettled = [j for j in self.state.live_jobs() if j.ended_at is not None]
        if running is None and not unsettled:
            self._stopped(RunStatus.KILLED, "kill", f"run stopped by the kill switch: {request.get('reason', '')}",
                          by=request.get("user"))
            return True
        return False  # the trainer is saving; its exit is handled as a job end below

    # Failures ------------------------------------------------------------------------------
    def _on_rank_failure(self, job: JobRecord, assessment: Assessment, result: PassResult) -> None:
        if self.state.status == RunStatus.KILLING:
            self._cancel([job], "killed (ranks stopped responding while saving)")
            self._stopped(RunStatus.KILLED, "kill", "run stopped by the kill switch (ranks hung while saving: cancelled)")
            return
        dead, hung = assessment.dead, assessment.hung
        cause = "hang" if hung and not dead else dead[0].kind.value
        findings = dead or hung
        failure_time = min(f.since for f in findings)
        self._event(
            "failure",
            job_id=job.job_id,
            cause=cause,
            failure_time=failure_time,
            detection_time=self.clock(),
            last_step=assessment.max_step,
            ranks=[f.as_dict() for f in findings[:16]],
            ranks_affected=len(findings),
        )
        notify_kind = "hang" if cause == "hang" else "failure"
        self._notify(notify_kind, f"job {job.job_id}: {cause} of {len(findings)} rank(s), "
                                  f"e.g. rank {findings[0].rank} on {findings[0].host or '?'}",
                     {"job_id": job.job_id, "ranks": [f.as_dict() for f in findings[:8]]})
        self._dump_stacks(job)
        self._cancel([job], f"failed ({cause})")
        culprits = sorted({self._node_of(f.rank, f.host, job) for f in assessment.culprits()} - {""})
        self._restart(job, failure_time, culprits, cause, last_step=assessment.max_step, result=result)

    def _on_job_end(self, record: JobRecord, beats: list[dict[str, Any]], result: PassResult) -> None:
        exit_code = record.exit_code
        if exit_code is None:
            exit_code = self._exit_code_from_beats(record.job_id, beats)
        outcome = classify_end(record.state, exit_code)
        record.outcome = outcome.value
        self._event("job_ended", job_id=record.job_id, state=record.state, exit_code=exit_code, outcome=outcome.value)
        if self.state.status == RunStatus.KILLING:
            self._cancel(self._queued_jobs(), "cancelled (kill switch)")
            self._stopped(RunStatus.KILLED, "kill", f"run stopped by the kill switch (job {record.job_id}: {outcome.value})")
        elif outcome is Outcome.FINISHED:
            self._cancel(self._queued_jobs(), "cancelled (run finished)")
            self._stopped(RunStatus.FINISHED, "finish", f"training finished (job {record.job_id})")
        elif outcome is Outcome.KILLED:
            self._cancel(self._queued_jobs(), "cancelled (kill switch)")
            self._stopped(RunStatus.KILLED, "kill", f"job {record.job_id} stopped by the kill switch")
        elif outcome is Outcome.CONFIG_ERROR:
            self._cancel(self._queued_jobs(), "cancelled (config error)")
            self._stopped(RunStatus.CONFIG_ERROR, "failure",
                          f"job {record.job_id}: the trainer refused the config; fix it and `runctl resume`")
        elif outcome is Outcome.TIME_BUDGET:
            self._event("continue", job_id=record.job_id, why="time budget reached with a checkpoint saved")
        else:
            host, what = failed_task_host(self.paths.jobs / f"slurm-{record.job_id}.out")
            culprits = [host] if host and what and ("Killed" in what or "signal" in what.lower()) else []
            if record.state == "node_fail":
                culprits = list(record.nodes)
            mine = [b for b in beats if str(b.get("job_id")) == record.job_id]
            last_step = max((b.get("step", 0) for b in mine), default=None)
            # The failure happened at most one beat interval after the earliest last beat of the
            # job's ranks (the crashed rank stopped beating first); SLURM's end time is later.
            failure_time = min([record.ended_at or self.clock(), *(b.get("beat_time", 0) for b in mine
                                                                   if b.get("phase") != "exiting")])
            self._event("failure", job_id=record.job_id, cause="job_failed", exit_code=exit_code,
                        failure_time=failure_time, detection_time=self.clock(), last_step=last_step,
                        srun_says=what, host=host)
            self._notify("failure", f"job {record.job_id} failed ({outcome.value}, exit {exit_code}; {what or 'no srun detail'})",
                         {"job_id": record.job_id, "exit_code": exit_code, "host": host})
            self._restart(record, failure_time, culprits, "job_failed", last_step, result)

    def _node_of(self, rank: int, host: str, job: JobRecord) -> str:
        """The SLURM node name of a rank. The heartbeat's host is the node name on a real cluster;
        where it is not one of the job's nodes (emulated nodes all share one hostname), SLURM's
        block distribution places rank r on the job's node r // tasks-per-node."""
        if not job.nodes or host in job.nodes:
            return host
        index = rank // self.cfg.cluster.gpus_per_node
        return job.nodes[index] if 0 <= index < len(job.nodes) else host

    @staticmethod
    def _exit_code_from_beats(job_id: str, beats: list[dict[str, Any]]) -> int | None:
        codes = [b.get("extra", {}).get("exit_code") for b in beats if str(b.get("job_id")) == job_id]
        codes = [c for c in codes if isinstance(c, int)]
        if not codes:
            return None
        failures = [c for c in codes if c not in (0, 17, 18, 19)]
        return failures[0] if failures else max(codes)

    def _dump_stacks(self, job: JobRecord) -> None:
        """Ask the live ranks for their Python stacks before the job is cancelled."""
        request = self.paths.control_request(DUMP_STACKS_REQUEST)
        asked = self.clock()
        atomic_write_json(request, {"time": asked, "job_id": job.job_id, "by": "controller"}, mode=0o664)
        deadline = time.monotonic() + self.stack_wait_seconds
        files: list[str] = []
        expected = self.cfg.world_size
        while time.monotonic() < deadline:
            files = self._fresh_stacks(asked)
            if len(files) >= expected:
                break
            self.sleep(min(0.5, max(0.05, self.stack_wait_seconds / 10)))
        files = self._fresh_stacks(asked)
        request.unlink(missing_ok=True)
        self._event("stacks_dumped", job_id=job.job_id, files=files[:64], ranks_answered=len(files),
                    ranks_expected=expected, directory=str(self.paths.stacks))

    def _fresh_stacks(self, since: float) -> list[str]:
        try:
            return sorted(p.name for p in self.paths.stacks.iterdir() if p.stat().st_mtime >= since - 1)
        except OSError:
            return []

    # Restart -------------------------------------------------------------------------------
    def _restart(self, failed: JobRecord, failure_time: float, culprits: list[str], cause: str,
                 last_step: int | None, result: PassResult) -> None:
        ckpt_dir = checkpoint_dir(self.paths, self.cfg)
        resume_from, skipped = newest_verified(ckpt_dir)
        for info, problem in skipped:
            self._event("checkpoint_corrupt", step=info.step, path=str(info.path), problem=problem,
                        action="skipped (kept on disk for inspection)")
        resume_step = resume_from.step if resume_from else 0
        if resume_step != self.state.checkpoint_step_at_last_restart:
            self.state.restarts_without_progress = 0
        limit = self.cfg.watchdog.max_restarts_without_progress
        if self.state.restarts_without_progress >= limit:
            self._cancel(self._queued_jobs(), "cancelled (crash loop)")
            self._stopped(
                RunStatus.CRASH_LOOP, "crash_loop",
                f"{self.state.restarts_without_progress} restarts without a new checkpoint (still at step {resume_step}): "
                f"stopped. Look at events.jsonl and jobs/, fix the cause, then `runctl resume`",
            )
            return
        if culprits:
            exclude_list.add_excluded(self.paths, culprits, reason=f"{cause} in job {failed.job_id}", by="controller")
            self._event("nodes_excluded", nodes=culprits, job_id=failed.job_id, cause=cause,
                        excluded=exclude_list.excluded_nodes(self.paths))
        excluded = exclude_list.excluded_nodes(self.paths)
        queued = self._queued_jobs()
        if queued:
            successor = queued[0]
            self.scheduler.update_exclude([successor.job_id], excluded)
            if successor.state == "held":
                self.scheduler.release([successor.job_id])
            successor.exclude = excluded
            successor.reason = f"restart after {cause}"
            how = f"queued successor {successor.job_id} (exclude list updated)"
        else:
            successor = self._submit(f"restart after {cause}")
            how = f"resubmitted as job {successor.job_id}"
        self.state.restarts += 1
        self.state.restarts_without_progress += 1
        self.state.checkpoint_step_at_last_restart = resume_step
        work_lost_seconds = None
        if resume_from is not None and resume_from.saved_at is not None:
            work_lost_seconds = max(0.0, failure_time - resume_from.saved_at)
        now = self.clock()
        restart = {
            "job_id": successor.job_id,
            "failed_job_id": failed.job_id,
            "cause": cause,
            "failure_time": failure_time,
            "detection_time": now,
            "restart_time": now,
            "resume_step": resume_step,
            "last_step": last_step,
            "work_lost_steps": (last_step - resume_step) if last_step is not None else None,
            "work_lost_seconds": work_lost_seconds,
            "excluded": excluded,
            "how": how,
            "restarts_without_progress": self.state.restarts_without_progress,
        }
        self._event("restart", **restart)
        self.state.recovering = restart
        self.state.status = RunStatus.RESTARTING
        result.actions.append(f"restart: {how}")
        self._notify("restart", f"restarting from step {resume_step} after {cause} in job {failed.job_id}: {how}", restart)

    def _follow_recovery(self, assessment: Assessment) -> None:
        """Record the first training step after a restart (the end of the outage)."""
        rec = self.state.recovering
        if not rec or assessment.job_id != rec["job_id"] or assessment.max_step is None:
            return
        if assessment.max_step > rec["resume_step"]:
            now = self.clock()
            self._event(
                "first_step_after_restart",
                job_id=rec["job_id"],
                step=assessment.max_step,
                resume_step=rec["resume_step"],
                seconds_since_failure=now - rec["failure_time"],
                seconds_since_restart=now - rec["restart_time"],
            )
            self.state.recovering = None

    # Learning, disk, bookkeeping -----------------------------------------------------------
    def _learn(self, assessment: Assessment) -> None:
        beat = assessment.reference
        if not beat:
            return
        sample = PhaseSample(beat.get("phase", "step"), beat.get("phase_started", 0.0), beat.get("step", 0),
                             beat.get("progress_time", 0.0))
        grown = learn_from_transition(self.timeouts, self._sample, sample)
        grown += learn_from_reported(self.timeouts, (beat.get("extra") or {}).get("durations"))
        self._sample = sample
        if grown:
            log.debug("learned timeouts grew for %s: %s", grown, self.timeouts.as_dict())

    def _check_disk(self) -> None:
        if self._planned_bytes is False:
            self._planned_bytes = planned_checkpoint_bytes(self.cfg)
        complete = [c for c in list_checkpoints(checkpoint_dir(self.paths, self.cfg)) if c.complete]
        last = complete[-1].size_bytes if complete else None
        check = check_disk(checkpoint_dir(self.paths, self.cfg), last, self._planned_bytes or None)
        if check.level != self.state.disk_level and check.level != "unknown":
            self._event("disk", level=check.level, free_bytes=check.free_bytes, expected_bytes=check.expected_bytes,
                        message=check.message())
            if check.level in ("warning", "critical"):
                self._notify("disk", f"disk {check.level}: {check.message()}", {"free_bytes": check.free_bytes})
            self.state.disk_level = check.level

    def _stopped(self, status: str, notify_kind: str, message: str, **fields: Any) -> None:
        self.state.status = status
        self.state.recovering = None
        self._event("run_stopped", status=status, message=message, **fields)
        self._notify(notify_kind, message, {"status": status, **fields})

    def _notify(self, kind: str, message: str, details: dict[str, Any]) -> None:
        problems = notify(self.cfg.notifications, self.cfg.name, kind, message, details)
        for problem in problems:
            log.warning("notification failed: %s", problem)
            self._event("notification_failed", kind=kind, problem=problem)
        if (self.cfg.notifications.webhook or self.cfg.notifications.email) and not problems \
                and kind in self.cfg.notifications.events:
            self._event("notified", kind=kind)

    def _event(self, event: str, **fields: Any) -> dict[str, Any]:
        record = record_event(self.paths, event, **fields)
        log.info("%s %s", event, json.dumps(fields, default=str)[:300])
        return record
