"""The controller of one run: the loop (`run`) and one supervision pass (`tick`). What the policy
decides is carried out by `apply` (acting.py); jobs (jobs.py) and the launches inside a job with
spares (launches.py) are tracked by the other mixins.

Each pass gathers what the controller can see, asks the policy what to do, and applies it:
1. operator requests in control/, authenticated (requests.py) -> kill_resume.on_requests;
2. the scheduler's view of the run's jobs (a requeue is noticed here);
3. the running job's heartbeats, judged by change on this process's monotonic clock
   (liveness.py, detection.py) -> policy.on_findings -> recovery.plan_restart;
4. jobs that ended -> policy.on_job_end -> recovery.plan_restart;
5. a run that is not stopped always has a job; the disk check before the next checkpoint.
Everything it does goes to events.jsonl; state.json is saved when something changed.

Never ending: a pass that raises (squeue timing out, a full disk, a bug) is recorded, notified once
per kind of error, and retried with backoff. The run stays supervised; the controller only stops
when the run does.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.controller_heartbeat import write_beat
from orchestrator.errors import PermissionDeniedError
from orchestrator.notify import notify
from orchestrator.operators import check_trust, prepare_permissions
from orchestrator.protocol import (
    DAMAGED_LOG_NAME,
    JobState,
    RunPaths,
    checkpoints_dir,
    read_jsonl,
    step_of,
)

from . import requests as intake
from .acting import Acting
from .checkpoints import list_checkpoints, resume_point
from .detection import Assessment, assess, read_heartbeats, stale_hosts
from .disk import check_disk, planned_checkpoint_bytes
from .jobs import JobTracking
from .kill_resume import on_requests
from .launches import LaunchTracking
from .liveness import Liveness
from .lock import ControllerLock
from .policy import exit_code_from_beats, on_findings, on_job_end
from .recovery import Failure, plan_restart
from .state import ControllerState, JobRecord, RunStatus, load_state, record_event, save_state
from .stragglers import StragglerWatch
from .submission import (
    Submitter,
    default_submitter,
    failed_task_host,
    reconcile_intent,
)
from .timeouts import PhaseTimeouts, learn_from_beat

log = logging.getLogger("runctl.controller")
MAX_BACKOFF_SECONDS = 300.0


@dataclass
class PassResult:
    time: float
    status: str
    assessment: Assessment | None = None
    actions: list[str] = field(default_factory=list)
    error: str | None = None


def checkpoint_dir(paths: RunPaths, cfg: Any) -> Path:
    return checkpoints_dir(paths.root, cfg.checkpoint.dir)


class Controller(Acting, JobTracking, LaunchTracking):
    def __init__(
        self,
        run_dir: str | Path,
        cfg: Any,
        scheduler: Any,
        *,
        submitter: Submitter | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        stack_wait_seconds: float = 5.0,
    ):
        self.paths = RunPaths.of(run_dir)
        self.cfg = cfg
        self.scheduler = scheduler
        self.submitter = submitter or default_submitter(self.paths, cfg, scheduler)
        self.clock = clock  # wall clock of the login node: timestamps of events
        self.monotonic = monotonic  # durations and liveness (a simulation passes a virtual one)
        self.sleep = sleep
        self.stack_wait_seconds = stack_wait_seconds
        self.lock = ControllerLock(self.paths.root)
        self.state = ControllerState()
        self.timeouts = PhaseTimeouts.from_watchdog(cfg.watchdog)
        self.liveness = Liveness()
        self.stragglers = StragglerWatch(cfg.watchdog)
        self._node_beat_age: dict[str, float] = {}
        self._timeouts_job: str | None = None
        self._job_wide_since: float | None = None
        self._scheduler_down_since: float | None = None
        self._planned_bytes: int | None | bool = False  # False: not asked yet
        self._started = False
        self._saved_snapshot: dict[str, Any] | None = None
        self._saved_at = 0.0
        self._failing_passes = 0
        self._notified_errors: set[str] = set()
        self._passes = 0  # every pass, failed ones too: controller.json's counter (runctl doctor)
        self._started_wall = clock()
        self._training_seen: set[str] = set()  # jobs whose `job_training` event is written
        self._checkpoints_seen: set[int] | None = None  # None: not listed yet (no events for old ones)

    # Lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Take the run's lock and pick up where the last controller left off."""
        self.lock.acquire()
        self._started = True
        for warning in prepare_permissions(self.paths, self.cfg.operators):
            self._event("permissions_warning", message=warning)
        problems = check_trust(self.paths, self.cfg.operators, checkpoint_dir(self.paths, self.cfg))
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
        adopted = reconcile_intent(self.state, self.scheduler)
        for record in adopted:
            self._event(
                "job_adopted",
                job_id=record.job_id,
                why="submitted by a controller that died before recording it",
            )
        self._event(
            "controller_started",
            status=self.state.status.value,
            jobs=[j.job_id for j in self.state.live_jobs()],
        )
        self._save_state()

    def stop(self) -> None:
        if self._started:
            self._save_state()
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
                on_pass(result)
            if RunStatus(result.status).stopped and not stay and result.error is None:
                return result.status
            if max_seconds is not None and self.monotonic() - began > max_seconds:
                return result.status
            self.sleep(self._pause())

    def _pause(self) -> float:
        poll = self.cfg.watchdog.poll_seconds
        if not self._failing_passes:
            return poll
        return min(MAX_BACKOFF_SECONDS, poll * 2 ** min(self._failing_passes - 1, 10))

    def safe_tick(self) -> PassResult:
        """One pass; an exception becomes an event and a notification (once per kind), never a crash."""
        try:
            result = self.tick()
        except Exception as exc:  # noqa: BLE001 - the run must stay supervised whatever failed
            self._failing_passes += 1
            kind = f"{type(exc).__name__}: {str(exc)[:200]}"
            log.error("supervision pass failed (%d in a row): %s", self._failing_passes, kind)
            self._event(
                "pass_failed",
                error=kind,
                passes_failed_in_a_row=self._failing_passes,
                retry_in_seconds=self._pause(),
                where=traceback.format_exc(limit=3)[-800:],
            )
            if type(exc).__name__ not in self._notified_errors:
                self._notified_errors.add(type(exc).__name__)
                self._notify(
                    "failure",
                    f"controller pass failed: {kind}; retrying every {self._pause():.0f} s "
                    "(the run is still supervised)",
                    {"error": kind},
                )
            self._beat()
            return PassResult(time=self.clock(), status=self.state.status.value, error=kind)
        if self._failing_passes:
            self._event("pass_recovered", after_failed_passes=self._failing_passes)
            self._failing_passes = 0
        return result

    def _beat(self) -> None:
        """controller.json: the watcher's own heartbeat (orchestrator/controller_heartbeat.py)."""
        self._passes += 1
        try:
            write_beat(
                self.paths,
                passes=self._passes,
                failing_passes=self._failing_passes,
                status=self.state.status.value,
                poll_seconds=self.cfg.watchdog.poll_seconds,
                started_at=self._started_wall,
                now=self.clock(),
                node_beat_age=self._node_beat_age,
            )
        except OSError as exc:  # a full disk is reported by the pass itself; never stop supervising
            log.warning("cannot write %s: %s", self.paths.controller_heartbeat, exc)

    # One pass -------------------------------------------------------------------------------
    def tick(self) -> PassResult:
        now = self.clock()
        result = PassResult(time=now, status=self.state.status.value)
        self._adopt_chain_jobs()
        self._refresh_jobs()
        if self._handle_requests(result) or self.state.status.stopped:
            return self._finish_pass(result)
        running = self._running_job()
        beats = read_heartbeats(self.paths.heartbeats)
        if running is not None:
            allocation = self._allocation(running)  # None for a job without spares
            self._relay_unhealthy(running, allocation, result)
            if (
                allocation is not None
                and allocation.state == "waiting_decision"
                and not self._decided(running, allocation.launch)
            ):
                self._on_launch_failed(running, allocation, beats, result)
                return self._finish_pass(result)
            assessment = self._assess(running, beats)
            result.assessment = assessment
            self._learn(running, assessment)
            self._follow_recovery(assessment)
            self._note_training(assessment)
            self.apply(
                self.stragglers.on_pass(self.state, running, beats, self.monotonic(), self._node_of), result
            )
            if assessment.findings:
                self._on_findings(running, assessment, result)
                return self._finish_pass(result)
            self._job_wide_since = None
        for record in list(self.state.jobs):
            if record.outcome is None and record.ended_at is not None:
                self._on_job_end(record, beats, result)
                if self.state.status.stopped:
                    break
        if not self.state.status.stopped:
            self._ensure_a_job(result)
            self._check_disk()
        self._relay_damage_reports()
        return self._finish_pass(result)

    def _assess(self, running: JobRecord, beats: list[dict[str, Any]]) -> Assessment:
        mono = self.monotonic()
        views = self.liveness.observe(beats, running.job_id, mono)
        assessment = assess(
            views,
            job_id=running.job_id,
            job_seen_at=self.liveness.job_seen_at,
            world_size=self.cfg.world_size,
            now=mono,
            dead_after=self.cfg.watchdog.dead_after_seconds,
            timeouts=self.timeouts,
        )
        self._node_beat_age = assessment.host_beat_age
        return assessment

    def _finish_pass(self, result: PassResult) -> PassResult:
        self.state.last_pass = result.time
        self.state.observed_durations = dict(self.timeouts.observed_max)
        live = self.state.live_jobs()
        if not self.state.status.stopped and self.state.status != RunStatus.KILLING:
            if any(j.state == JobState.RUNNING.value for j in live):
                self.state.move_to(RunStatus.RUNNING)
            elif live:
                self.state.move_to(RunStatus.WAITING)
        result.status = self.state.status.value
        self._save_if_changed(result.time)
        self._beat()
        return result

    def _save_if_changed(self, now: float) -> None:
        """state.json is fsynced: write it when something changed, else every 30 s (so that its
        last_pass shows the controller is alive) rather than on every pass."""
        snapshot = self.state.to_dict()
        snapshot.pop("last_pass", None)
        snapshot.pop("controller", None)
        if snapshot != self._saved_snapshot or now - self._saved_at > 30:
            self._save_state()
            self._saved_snapshot, self._saved_at = snapshot, now

    def _save_state(self) -> None:
        """A full disk must not end supervision: the state stays in memory and is written again
        next pass; the failure is an event (if that can be written) and a notification, once."""
        try:
            save_state(self.paths, self.state)
        except OSError as exc:
            self._saved_snapshot = None
            self._event("state_not_saved", error=str(exc))
            if "state_not_saved" not in self._notified_errors:
                self._notified_errors.add("state_not_saved")
                self._notify(
                    "disk",
                    f"cannot write {self.paths.state}: {exc}. Free space on the run directory's "
                    "filesystem; the controller keeps supervising from memory",
                    {"error": str(exc)},
                )
        else:
            self._notified_errors.discard("state_not_saved")

    # Deciding ------------------------------------------------------------------------------
    def _handle_requests(self, result: PassResult) -> bool:
        """Kill and resume requests. True when the pass should end here."""
        received = intake.read_requests(self.paths, self.cfg.operators, self.clock)
        for event in received.events:
            fields = dict(event)
            fields.pop("time", None)  # the controller's clock stamps its events
            self._event(str(fields.pop("event", "request")), **fields)
        running = self._running_job()
        verdict = on_requests(
            self.state,
            received.requests,
            running_job_id=running.job_id if running else None,
            queued_job_ids=[j.job_id for j in self._queued_jobs()],
            unsettled_job_ids=[j.job_id for j in self.state.live_jobs() if j.ended_at is not None],
        )
        self.apply(verdict.actions, result)
        return verdict.end_pass

    def _on_findings(self, job: JobRecord, assessment: Assessment, result: PassResult) -> None:
        mono = self.monotonic()
        if assessment.job_wide:
            self._job_wide_since = self._job_wide_since if self._job_wide_since is not None else mono
        else:
            self._job_wide_since = None
        verdict = on_findings(
            self.state,
            job,
            assessment,
            wall_now=self.clock(),
            job_wide_for=mono - self._job_wide_since if self._job_wide_since is not None else 0.0,
            dead_after=self.cfg.watchdog.dead_after_seconds,
            culprit_nodes=[self._node_of(f.rank, f.host, job) for f in assessment.culprits()],
            queued_job_ids=[j.job_id for j in self._queued_jobs()],
        )
        self.apply(verdict.actions, result)
        if verdict.failure is not None:
            self._job_wide_since = None
            self._recover(verdict.failure, result)

    def _on_job_end(self, record: JobRecord, beats: list[dict[str, Any]], result: PassResult) -> None:
        exit_code = record.exit_code
        if exit_code is None:
            exit_code = exit_code_from_beats(record.job_id, beats)
        allocation = self._allocation(record)
        # With spares, the last launch's srun tells which task failed (earlier launches' failures
        # were handled inside the job); without, the job's output.
        srun_output = (
            self.paths.launch_stderr(record.job_id, allocation.launch)
            if allocation is not None
            else self.paths.jobs / f"slurm-{record.job_id}.out"
        )
        host, what = failed_task_host(srun_output)
        job_beats = [b for b in beats if str(b.get("job_id")) == record.job_id]
        first_gone = stale_hosts(job_beats, margin=self.cfg.watchdog.dead_after_seconds)
        stale_nodes = sorted(
            {
                self._node_of(b.get("rank", -1), str(b.get("host", "")), record)
                for b in job_beats
                if b.get("host") in first_gone
            }
        )
        outcome, actions, failure = on_job_end(
            self.state,
            record,
            exit_code,
            srun_host=host,
            srun_says=what,
            job_beats=job_beats,
            stale_nodes=stale_nodes,
            wall_now=self.clock(),
            queued_job_ids=[j.job_id for j in self._queued_jobs()],
            unhealthy_nodes=tuple(allocation.unhealthy) if allocation is not None else (),
        )
        record.outcome = outcome.value
        self.apply(actions, result)
        if failure is not None:
            self._recover(failure, result)

    def _recover(self, failure: Failure, result: PassResult) -> None:
        resume, skipped = resume_point(checkpoint_dir(self.paths, self.cfg))
        failed = self.state.job(failure.job_id)
        allocation = self._allocation(failed) if failed is not None and failure.job_running else None
        actions = plan_restart(
            self.state,
            self.cfg.watchdog,
            failure,
            resume,
            skipped,
            [j.job_id for j in self._queued_jobs()],
            allocation,
        )
        self.apply(actions, result)

    def _node_of(self, rank: int, host: str, job: JobRecord) -> str:
        """The SLURM node name of a rank. The heartbeat's host is the node name on a real cluster;
        where it is not one of the job's nodes (emulated nodes all share one hostname), SLURM's
        block distribution places rank r on the job's node r // tasks-per-node."""
        if not job.nodes or host in job.nodes:
            return host
        index = rank // self.cfg.cluster.gpus_per_node
        return job.nodes[index] if 0 <= index < len(job.nodes) else host

    def _follow_recovery(self, assessment: Assessment) -> None:
        """Record the first training step after a restart (the end of the outage)."""
        rec = self.state.recovering
        if not rec or assessment.job_id != rec["job_id"] or assessment.max_step is None:
            return
        reference = assessment.reference or {}
        if "resumed_from" not in rec:
            # The restart only predicted the resume step (a checkpoint damaged inside is found by
            # the ranks' hashes): rank 0 says where it really resumed from once it trains.
            if reference.get("phase") != "step":
                return
            extra = reference.get("extra") if isinstance(reference.get("extra"), dict) else {}
            told = extra.get("resumed_from")
            told_ok = isinstance(told, int) and not isinstance(told, bool)
            rec["resumed_from"] = told if told_ok else reference.get("step", rec["resume_step"])
        if assessment.max_step > rec["resumed_from"]:
            now = self.clock()
            self._event(
                "first_step_after_restart",
                job_id=rec["job_id"],
                step=assessment.max_step,
                resume_step=rec["resume_step"],
                resumed_from=rec["resumed_from"],
                seconds_since_failure=now - rec["failure_time"],
                seconds_since_restart=now - rec["restart_time"],
            )
            self.state.recovering = None

    def _note_training(self, assessment: Assessment) -> None:
        """`job_training` once per job, when rank 0 first beats in the step phase: the goodput
        accounting takes the checkpoint load time the trainer measured from it."""
        beat = assessment.reference or {}
        job_id = str(assessment.job_id)
        launch = beat.get("launch", 0)  # a job with spares trains again after each relaunch
        if f"{job_id}/{launch}" in self._training_seen or beat.get("phase") != "step":
            return
        self._training_seen.add(f"{job_id}/{launch}")
        extra = beat.get("extra") if isinstance(beat.get("extra"), dict) else {}
        durations = extra.get("durations") if isinstance(extra.get("durations"), dict) else {}
        self._event(
            "job_training",
            job_id=job_id,
            launch=launch,
            step=beat.get("step"),
            checkpoint_load_seconds=extra.get("checkpoint_load_seconds"),
            init_seconds=durations.get("init"),
        )

    # Learning, disk, bookkeeping -----------------------------------------------------------
    def _learn(self, running: JobRecord, assessment: Assessment) -> None:
        """Timeouts are learned per job, from per-step and per-phase durations only (timeouts.py);
        a controller restarted during a job picks up what the last one learned of that job."""
        if self._timeouts_job != running.job_id:
            carried = self.state.observed_durations if self.state.timeouts_job == running.job_id else {}
            self.timeouts = PhaseTimeouts.from_watchdog(self.cfg.watchdog, carried)
            self._timeouts_job = self.state.timeouts_job = running.job_id
        grown = learn_from_beat(self.timeouts, assessment.reference)
        if grown:
            log.debug("learned timeouts grew for %s: %s", grown, self.timeouts.as_dict())

    def _relay_damage_reports(self) -> None:
        """Checkpoints the ranks found damaged when they resumed (by hash): an event and a
        notification for each new report. The checkpoint is kept for inspection."""
        reports = read_jsonl(checkpoint_dir(self.paths, self.cfg) / DAMAGED_LOG_NAME)
        for report in reports[self.state.damage_reports_seen :]:
            name = str(report.get("checkpoint", ""))
            problems = report.get("problems") if isinstance(report.get("problems"), list) else []
            problem = "; ".join(str(p) for p in problems[:3]) or "damaged"
            self._event(
                "checkpoint_corrupt",
                step=step_of(name),
                path=name,
                problem=problem,
                reported_by_job=report.get("job_id"),
                action="skipped by the ranks (kept on disk for inspection)",
            )
            self._notify(
                "failure",
                f"checkpoint {name} is damaged ({problem}); the ranks resumed from an older one",
                {"checkpoint": name},
            )
        self.state.damage_reports_seen = max(self.state.damage_reports_seen, len(reports))

    def _check_disk(self) -> None:
        if self._planned_bytes is False:
            self._planned_bytes = planned_checkpoint_bytes(self.cfg)
        complete = [c for c in list_checkpoints(checkpoint_dir(self.paths, self.cfg)) if c.complete]
        self._note_checkpoints(complete)
        last = complete[-1].size_bytes if complete else None
        check = check_disk(checkpoint_dir(self.paths, self.cfg), last, self._planned_bytes or None)
        if check.level != self.state.disk_level and check.level != "unknown":
            self._event(
                "disk",
                level=check.level,
                free_bytes=check.free_bytes,
                expected_bytes=check.expected_bytes,
                message=check.message(),
            )
            if check.level in ("warning", "critical"):
                self._notify(
                    "disk", f"disk {check.level}: {check.message()}", {"free_bytes": check.free_bytes}
                )
            self.state.disk_level = check.level

    def _note_checkpoints(self, complete: list[Any]) -> None:
        """`checkpoint_complete` for each checkpoint that became complete while this controller
        watched: the save's end outlives keep-last cleanup (goodput's save-stall accounting)."""
        steps = {c.step for c in complete}
        if self._checkpoints_seen is not None:
            for info in complete:
                if info.step not in self._checkpoints_seen:
                    self._event(
                        "checkpoint_complete",
                        step=info.step,
                        saved_at=info.saved_at,
                        size_bytes=info.size_bytes,
                    )
            steps |= self._checkpoints_seen
        self._checkpoints_seen = steps

    def _notify(self, kind: str, message: str, details: dict[str, Any]) -> None:
        problems = notify(self.cfg.notifications, self.cfg.name, kind, message, details)
        for problem in problems:
            log.warning("notification failed: %s", problem)
            self._event("notification_failed", kind=kind, problem=problem)
        if (
            (self.cfg.notifications.webhook or self.cfg.notifications.email)
            and not problems
            and kind in self.cfg.notifications.events
        ):
            self._event("notified", kind=kind)

    def _event(self, event: str, **fields: Any) -> dict[str, Any] | None:
        """Append to events.jsonl; a full disk loses the line (logged), never the controller."""
        try:
            fields.setdefault("time", self.clock())
            record = record_event(self.paths, event, **fields)
        except OSError as exc:
            log.error(
                "cannot write events.jsonl (%s); lost event %s %s",
                exc,
                event,
                json.dumps(fields, default=str)[:300],
            )
            return None
        log.info("%s %s", event, json.dumps(fields, default=str)[:300])
        return record
