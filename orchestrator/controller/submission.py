"""Submitting, finding and cancelling the run's jobs, without ever submitting twice.

Submit protocol (a controller may be killed at any line):
1. write the intent (a token, the time, the job name) to state.json;
2. sbatch;
3. record the job id in state.json and clear the intent.
A restarted controller that finds an intent without a job asks the scheduler for jobs of the
run's name submitted after the intent; it adopts them if there are any and submits only if not.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.protocol import RunPaths
from orchestrator.slurm.base import JobInfo, JobState, SubmitRequest

from .state import ControllerState, JobRecord, save_state

# (exclude, reason) -> job id. The default renders the run's sbatch script; tests pass their own.
Submitter = Callable[[list[str], str], str]


def default_submitter(paths: RunPaths, cfg: Any, scheduler: Any) -> Submitter:
    """Prefer the SLURM layer's own run-submission function (same script as `runctl submit`);
    fall back to rendering the script here with the same renderer."""

    def submit(exclude: list[str], reason: str) -> str:
        try:
            from orchestrator import runs  # noqa: PLC0415 - written by the SLURM layer
        except ImportError:
            runs = None
        hook = getattr(runs, "submit_job", None) if runs else None
        if hook is not None:
            return str(hook(paths.root, cfg, scheduler, exclude=exclude, reason=reason))
        from orchestrator.slurm.render import render_sbatch  # noqa: PLC0415

        paths.jobs.mkdir(parents=True, exist_ok=True)
        script = paths.jobs / f"pending-{secrets.token_hex(4)}.sbatch"
        script.write_text(render_sbatch(cfg, paths.root, exclude=exclude))
        request = SubmitRequest(
            script=script, job_name=cfg.name, dependency="singleton", exclude=list(exclude)
        )
        job_id = scheduler.submit(request)
        job_dir = paths.job_dir(job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(script), job_dir / "job.sbatch")
        return job_id

    return submit


def find_jobs_by_name(scheduler: Any, name: str) -> list[JobInfo] | None:
    """Jobs the scheduler knows under `name`, or None when this backend cannot list by name."""
    finder = getattr(scheduler, "jobs_by_name", None) or getattr(scheduler, "find_jobs", None)
    if finder is None:
        return None
    try:
        found = finder(name)
    except Exception:
        return None
    return list(found.values()) if isinstance(found, dict) else list(found)


def submit_once(
    paths: RunPaths,
    state: ControllerState,
    submitter: Submitter,
    *,
    job_name: str,
    exclude: list[str],
    reason: str,
    clock: Callable[[], float] = time.time,
) -> JobRecord:
    state.pending_submit = {
        "token": secrets.token_hex(8),
        "time": clock(),
        "reason": reason,
        "exclude": list(exclude),
        "job_name": job_name,
        "pid": os.getpid(),
    }
    save_state(paths, state)  # the intent is on disk before sbatch runs
    job_id = str(submitter(list(exclude), reason))
    record = JobRecord(job_id=job_id, submitted_at=clock(), reason=reason, exclude=list(exclude))
    state.jobs.append(record)
    state.pending_submit = None
    save_state(paths, state)
    return record


# slurmctld and the login node are different machines: a job submitted right after the intent may
# carry a submit time a little before it.
INTENT_CLOCK_SLACK_SECONDS = 5.0


def adoptable(info: JobInfo, intent: dict[str, Any], owner: str, known: set[str]) -> bool:
    """A job found under the run's name is ours to adopt only if it is not finished, was submitted
    by the run's owner (other users may use the same job name), and was submitted after the
    intent. A backend that does not report the user or the submit time is trusted on that point."""
    if info.job_id in known or info.state.is_terminal or info.state is JobState.UNKNOWN:
        return False
    if info.user and info.user != owner:
        return False
    if (
        info.submit_time is not None
        and info.submit_time < float(intent.get("time", 0)) - INTENT_CLOCK_SLACK_SECONDS
    ):
        return False
    return True


def reconcile_intent(state: ControllerState, scheduler: Any, owner: str | None = None) -> list[JobRecord]:
    """After a controller restart: adopt jobs submitted under an interrupted intent.

    Returns the adopted records. Clears the intent when it is settled (adopted, or the scheduler
    can list jobs by name and has none of ours: the sbatch never happened). When the backend
    cannot list by name the intent stays, and the caller must not submit blindly (it logs and
    waits for the job to show up in heartbeats or jobs/).
    """
    intent = state.pending_submit
    if not intent:
        return []
    found = find_jobs_by_name(scheduler, intent["job_name"])
    if found is None:
        return []
    owner = owner or current_user()
    known = {j.job_id for j in state.jobs}
    adopted = []
    for info in found:
        if not adoptable(info, intent, owner, known):
            continue
        record = JobRecord(
            job_id=info.job_id,
            submitted_at=intent["time"],
            reason=intent["reason"] + " (adopted)",
            exclude=list(intent.get("exclude", [])),
            state=info.state.value,
        )
        state.jobs.append(record)
        adopted.append(record)
    state.pending_submit = None
    return adopted


def current_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def discover_chain_jobs(paths: RunPaths) -> list[str]:
    """Job ids `runctl submit` recorded for this run (the initial job and its queued chain)."""
    try:
        from orchestrator import runs  # noqa: PLC0415
    except ImportError:
        runs = None
    table = (getattr(runs, "recorded_jobs", None) or getattr(runs, "job_table", None)) if runs else None
    ids: list[str] = []
    if table is not None:
        try:
            for row in table(paths.root):
                job_id = row.get("job_id") if isinstance(row, dict) else getattr(row, "job_id", None)
                if job_id:
                    ids.append(str(job_id))
        except Exception:  # bookkeeping of another layer must not stop supervision
            ids = []
    # jobs/<id>/ folders: made by the submitter (and by the job script when it starts).
    if paths.jobs.is_dir():
        for child in paths.jobs.iterdir():
            if child.is_dir() and child.name.isdigit() and child.name not in ids:
                ids.append(child.name)
    return sorted(ids, key=lambda j: int(j) if j.isdigit() else 0)


def last_seen_end(paths: RunPaths, job_id: str) -> tuple[str | None, int | None]:
    """The end state and exit code `runctl status` cached for a job SLURM has since forgotten
    (jobs/last_seen.json, written by orchestrator.runs; no accounting on the local cluster)."""
    from orchestrator.protocol import read_json  # noqa: PLC0415

    seen = (read_json(paths.last_seen) or {}).get(str(job_id)) or {}
    state = seen.get("state")
    if state in ("completed", "failed", "cancelled", "timeout", "node_fail"):
        return state, seen.get("exit_code")
    return None, None


def failed_task_host(job_output: Path) -> tuple[str | None, str | None]:
    """srun's own account of which task failed, from the job's output:
    `srun: error: node03: task 2: Killed`. Returns (host, what) or (None, None).

    A task that died of a signal is the culprit even when srun reports it after others: its
    peers see the broken connection and exit 1 on their own, sometimes before slurmstepd has
    reported the killed one. Without a signalled task, the first task srun reports."""
    try:
        text = job_output.read_text(errors="replace")
    except OSError:
        return None, None
    reported: list[tuple[str, str]] = []
    for line in text.splitlines():
        if "srun: error:" in line and ": task" in line:
            parts = [p.strip() for p in line.split("srun: error:", 1)[1].split(":")]
            if len(parts) >= 3:
                reported.append((parts[0], ":".join(parts[2:]).strip()))
    for host, what in reported:
        if "Killed" in what or "signal" in what.lower():
            return host, what
    return reported[0] if reported else (None, None)
