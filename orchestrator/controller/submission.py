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
import time
from collections.abc import Callable
from typing import Any

from orchestrator.contract import RunPaths
from orchestrator.contract.ledger import read_submissions
from orchestrator.contract.state import ControllerState, JobRecord, SubmitIntent, save_state
from orchestrator.errors import SchedulerError
from orchestrator.slurm.base import JobInfo, JobState, Scheduler

# (exclude, reason) -> job id. The default renders the run's sbatch script; tests pass their own.
Submitter = Callable[[list[str], str], str]


def default_submitter(
    paths: RunPaths, cfg: Any, scheduler: Scheduler, spares: Callable[[], int] | None = None
) -> Submitter:
    """The run's own submission (orchestrator.operate.runs.submit_job: the same script as `runctl submit`).
    `spares`: how many spare nodes the next job asks for (controller/pool.py lowers it while the
    pool lacks them, so that the job does not wait in the queue for spares that are not there)."""

    def submit(exclude: list[str], reason: str) -> str:
        from orchestrator.operate.runs import submit_job  # noqa: PLC0415 - the config models, loaded on first use

        return str(
            submit_job(paths.root, with_spares(cfg, spares), scheduler, exclude=exclude, reason=reason)
        )

    return submit


def with_spares(cfg: Any, spares: Callable[[], int] | None) -> Any:
    """The config with `cluster.spare_nodes` as the pool allows (the same config when it has them)."""
    wanted = cfg.cluster.spare_nodes if spares is None else spares()
    if wanted == cfg.cluster.spare_nodes:
        return cfg
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"spare_nodes": wanted})})


def find_jobs_by_name(scheduler: Scheduler, name: str) -> list[JobInfo] | None:
    """Jobs the scheduler knows under `name`, or None when it cannot tell (it did not answer)."""
    try:
        found = scheduler.jobs_by_name(name)
    except SchedulerError:
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
    state.pending_submit = SubmitIntent(
        token=secrets.token_hex(8),
        time=clock(),
        reason=reason,
        job_name=job_name,
        exclude=list(exclude),
        pid=os.getpid(),
    )
    try:
        save_state(paths, state)  # the intent is on disk before sbatch runs
    except OSError:
        # No intent on disk, no sbatch (a crash after it would submit twice): forgotten, so that
        # the next pass tries again instead of waiting for a job that was never submitted.
        state.pending_submit = None
        raise
    job_id = str(submitter(list(exclude), reason))
    record = JobRecord(job_id=job_id, submitted_at=clock(), reason=reason, exclude=list(exclude))
    state.jobs.append(record)
    state.pending_submit = None
    try:
        save_state(paths, state)
    except OSError:
        pass  # the job is submitted and known in memory; the end of the pass saves (or says it cannot)
    return record


# slurmctld and the login node are different machines: a job submitted right after the intent may
# carry a submit time a little before it.
INTENT_CLOCK_SLACK_SECONDS = 5.0


def adoptable(info: JobInfo, intent: SubmitIntent, owner: str, known: set[str]) -> bool:
    """A job found under the run's name is ours to adopt only if it is not finished, was submitted
    by the run's owner (other users may use the same job name), and was submitted after the
    intent. A backend that does not report the user or the submit time is trusted on that point."""
    if info.job_id in known or info.state.is_terminal or info.state is JobState.UNKNOWN:
        return False
    if info.user and info.user != owner:
        return False
    if info.submit_time is not None and info.submit_time < intent.time - INTENT_CLOCK_SLACK_SECONDS:
        return False
    return True


def reconcile_intent(
    state: ControllerState, scheduler: Scheduler, owner: str | None = None
) -> list[JobRecord]:
    """After a controller restart: adopt jobs submitted under an interrupted intent.

    Returns the adopted records. Clears the intent when it is settled (adopted, or the scheduler
    answered and has none of ours: the sbatch never happened). When the scheduler does not answer
    the intent stays, and the caller must not submit blindly (it waits for the job to show up in
    the ledger or jobs/, or for the intent to expire).
    """
    intent = state.pending_submit
    if not intent:
        return []
    found = find_jobs_by_name(scheduler, intent.job_name)
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
            submitted_at=intent.time,
            reason=intent.reason + " (adopted)",
            exclude=list(intent.exclude),
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
    """Job ids `runctl submit` recorded for this run (the initial job and its queued chain), and
    jobs/<id>/ folders (made by the submitter, and by the job script when it starts)."""
    ids = [s.job_id for s in read_submissions(paths.submissions)]
    if paths.jobs.is_dir():
        for child in paths.jobs.iterdir():
            if child.is_dir() and child.name.isdigit() and child.name not in ids:
                ids.append(child.name)
    return sorted(ids, key=lambda j: int(j) if j.isdigit() else 0)
