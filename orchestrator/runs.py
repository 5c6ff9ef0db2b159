"""Run directories and their job chains: what `runctl submit/status/cancel` and the controller share.

    paths = prepare_run_dir(cfg, run_dir)                  # folders + frozen run.yaml
    job_id = submit_job(run_dir, cfg, scheduler, exclude=[], reason="restart")   # one job
    result = submit_run(cfg, run_dir, scheduler, chain=3, dry_run=False)          # what `runctl submit` does
    rows = job_table(run_dir, scheduler)                   # every job of the run, with its state
    cancelled = cancel_run(run_dir, scheduler)             # the whole chain

Bookkeeping: every submission appends one line to `<run_dir>/jobs/submissions.jsonl`
({"job_id", "time", "reason", "exclude", "chain_index", "user", "script"}) and keeps its script as
`jobs/<job_id>/job.sbatch`. That ledger is append-only and written only here, so it never races
with the controller's state.json (which this module only reads). The last states seen from the
scheduler are cached in `jobs/last_seen.json`, so `status` still shows a job's end after SLURM
has forgotten it (no accounting on the local cluster).
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import ConfigError, RunConfig, dump_config, load_config
from orchestrator.errors import DoesNotFitError, UsageError
from orchestrator.operators import SECRET_FILE_MODE, SECRET_SCRIPT_MODE, prepare_permissions
from orchestrator.protocol import (
    JobState,
    RunPaths,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    classify_end,
    read_json,
    read_jsonl,
)
from orchestrator.slurm.base import JobInfo, SubmitRequest
from orchestrator.slurm.render import render_sbatch

SCRIPT_NAME = "job.sbatch"


def prepare_run_dir(cfg: RunConfig, run_dir: str | os.PathLike[str]) -> RunPaths:
    """Create the run directory's folders and write the frozen run.yaml.

    A run directory that already holds a *different* run.yaml is refused (UsageError): a run's
    config is frozen; make a new run directory to change it.
    """
    paths = RunPaths.of(run_dir, cfg.checkpoint.dir)
    text = dump_config(cfg)
    if paths.config.exists():
        existing = paths.config.read_text()
        if existing != text:
            raise UsageError(
                f"{paths.config} already holds another config (run name "
                f"{_name_of(existing)!r}); a run's config is frozen: give a new --run-dir"
            )
    for folder in (paths.jobs, paths.heartbeats, paths.checkpoints, paths.metrics.parent):
        folder.mkdir(parents=True, exist_ok=True)
    if not paths.config.exists():
        atomic_write_text(paths.config, text, mode=SECRET_FILE_MODE)  # cluster.env, the webhook URL
    # control/, accepted/, the root and run.yaml get the modes of the threat model (docs/security.md);
    # the controller reports any warning (e.g. no operators' group) when it starts.
    prepare_permissions(paths, cfg.operators)
    return paths


def _name_of(yaml_text: str) -> str:
    for line in yaml_text.splitlines():
        if line.startswith("name:"):
            return line.split(":", 1)[1].strip()
    return "?"


def write_job_script(
    cfg: RunConfig,
    run_dir: str | os.PathLike[str],
    exclude: list[str] | None = None,
    command: list[str] | None = None,
) -> Path:
    """Render the job script to `jobs/pending-<token>.sbatch` (moved to jobs/<id>/ once submitted).
    command: what srun starts instead of the trainer (smoke tests of the cluster)."""
    paths = RunPaths.of(run_dir)
    text = render_sbatch(cfg, paths.root, exclude=list(exclude or []), command=command)
    script = paths.jobs / f"pending-{secrets.token_hex(4)}.sbatch"
    atomic_write_text(script, text, mode=SECRET_SCRIPT_MODE)
    return script


def submit_job(
    run_dir: str | os.PathLike[str],
    cfg: RunConfig,
    scheduler: Any,
    *,
    exclude: list[str] | None = None,
    reason: str = "submit",
    dependency: str | None = "singleton",
    hold: bool = False,
    chain_index: int = 0,
    command: list[str] | None = None,
) -> str:
    """Render, submit and record ONE job of the run; returns its id. Used by `runctl submit` and by
    the controller (restarts). Raises SchedulerError when the scheduler refuses (the pending
    script is removed then)."""
    paths = RunPaths.of(run_dir)
    script = write_job_script(cfg, paths.root, exclude, command)
    request = SubmitRequest(
        script=script, job_name=cfg.name, dependency=dependency, hold=hold, exclude=list(exclude or [])
    )
    try:
        job_id = str(scheduler.submit(request))
    except BaseException:
        script.unlink(missing_ok=True)
        raise
    job_dir = paths.job_dir(job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    shutil.move(str(script), job_dir / SCRIPT_NAME)
    append_jsonl(paths.submissions, {
        "job_id": job_id, "time": time.time(), "reason": reason, "exclude": list(exclude or []),
        "chain_index": chain_index, "user": _user(), "scheduler": getattr(scheduler, "name", "?"),
        "script": str(job_dir / SCRIPT_NAME),
    })  # fmt: skip
    return job_id


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


@dataclass
class SubmitResult:
    run_dir: str
    config: str
    script: str  # the rendered script (dry run: jobs/dry-run.sbatch; else the first job's)
    job_ids: list[str] = field(default_factory=list)
    dry_run: bool = False
    scheduler: str = ""
    plan_warnings: list[str] = field(default_factory=list)


def check_plan(cfg: RunConfig) -> list[str]:
    """The planner's problems for this config ([] = it fits)."""
    from orchestrator.planner import plan_run  # the planner is heavier; only submit needs it

    return list(plan_run(cfg).problems)


def submit_run(
    config_path: str | os.PathLike[str],
    run_dir: str | os.PathLike[str] | None,
    scheduler: Any,
    *,
    chain: int = 1,
    dry_run: bool = False,
    command: list[str] | None = None,
) -> SubmitResult:
    """What `runctl submit` does: validate, plan, prepare the run dir, render, submit `chain` jobs
    linked by --dependency=singleton. dry_run: the same path, minus the sbatch calls.
    command: what srun starts instead of `python -m trainer RUN_DIR` (smoke tests only).

    Raises ConfigError (bad config), DoesNotFitError (planner), UsageError, SchedulerError.
    """
    if chain < 1:
        raise UsageError(f"--chain must be at least 1, got {chain}")
    cfg = load_config(config_path)
    problems = check_plan(cfg)
    if problems:
        raise DoesNotFitError(
            f"{config_path}: the planner says this run does not fit:\n"
            + "\n".join(f"  - {p}" for p in problems)
            + "\n`runctl plan "
            + str(config_path)
            + "` shows the details."
        )
    run_dir = Path(run_dir) if run_dir else Path("runs") / cfg.name
    paths = prepare_run_dir(cfg, run_dir.resolve())
    # The frozen run.yaml is what the job will read: submit exactly that.
    frozen = load_config(paths.config)
    result = SubmitResult(run_dir=str(paths.root), config=str(paths.config), script="", dry_run=dry_run,
                          scheduler=getattr(scheduler, "name", "?"))  # fmt: skip
    if dry_run:
        script = paths.jobs / "dry-run.sbatch"
        atomic_write_text(script, render_sbatch(frozen, paths.root, command=command), mode=SECRET_SCRIPT_MODE)
        result.script = str(script)
        return result
    for index in range(chain):
        job_id = submit_job(
            paths.root,
            frozen,
            scheduler,
            reason="submit" if index == 0 else "chain",
            chain_index=index,
            command=command,
        )
        result.job_ids.append(job_id)
    result.script = str(paths.job_dir(result.job_ids[0]) / SCRIPT_NAME)
    return result


def recorded_jobs(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every job ever submitted for the run, oldest first: the ledger, plus any job the
    controller's state.json knows that the ledger does not (e.g. submitted by an older tool)."""
    paths = RunPaths.of(run_dir)
    rows: dict[str, dict[str, Any]] = {}
    for entry in read_jsonl(paths.submissions):
        rows[str(entry["job_id"])] = dict(entry)
    state = read_json(paths.state) or {}
    for job in state.get("jobs", []) if isinstance(state, dict) else []:
        if isinstance(job, dict) and job.get("job_id") and str(job["job_id"]) not in rows:
            rows[str(job["job_id"])] = {"job_id": str(job["job_id"]), "time": job.get("submitted_at"),
                                        "reason": job.get("reason", "controller")}  # fmt: skip
    return sorted(rows.values(), key=lambda r: int(r["job_id"]) if str(r["job_id"]).isdigit() else 0)


def job_table(run_dir: str | os.PathLike[str], scheduler: Any | None = None) -> list[dict[str, Any]]:
    """One dict per job of the run, oldest first:
    {"job_id", "state" (JobState value), "exit_code", "outcome" (ExitCode meaning), "nodes",
     "reason", "submitted_at", "started_at", "ended_at", "submit_reason", "stale"}.

    With a scheduler, states are asked for (one call for all jobs) and cached in
    jobs/last_seen.json; a job the scheduler no longer knows keeps its last seen state with
    "stale": true. Without one, the cached states are shown.
    """
    paths = RunPaths.of(run_dir)
    recorded = recorded_jobs(paths.root)
    cache_path = paths.last_seen
    cache: dict[str, dict[str, Any]] = read_json(cache_path) or {}
    live: dict[str, JobInfo] = {}
    if scheduler is not None and recorded:
        live = scheduler.jobs([r["job_id"] for r in recorded])
    rows = []
    changed = False
    for entry in recorded:
        job_id = str(entry["job_id"])
        info = live.get(job_id)
        seen = cache.get(job_id, {})
        stale = False
        if info is not None and info.state is not JobState.UNKNOWN:
            seen = {
                "state": info.state.value, "exit_code": info.exit_code, "nodes": info.nodes, "reason": info.reason,
                "started_at": info.start_time, "ended_at": info.end_time, "seen_at": time.time(),
            }  # fmt: skip
            cache[job_id] = seen
            changed = True
        elif seen:
            stale = True
        state = seen.get("state", JobState.UNKNOWN.value)
        exit_code = seen.get("exit_code")
        rows.append({
            "job_id": job_id, "state": state, "exit_code": exit_code,
            "outcome": _outcome(state, exit_code),
            "nodes": seen.get("nodes", []), "reason": seen.get("reason", ""),
            "submitted_at": entry.get("time"), "started_at": seen.get("started_at"), "ended_at": seen.get("ended_at"),
            "submit_reason": entry.get("reason", ""), "stale": stale,
        })  # fmt: skip
    if changed:
        atomic_write_json(cache_path, cache)
    return rows


def _outcome(state: str, exit_code: int | None) -> str:
    """What an ended job means for the run, as the controller classifies it (classify_end: a
    SLURM TIMEOUT is the time budget, for both); "" while the job has not ended."""
    if not JobState.parse(state).is_terminal:
        return ""
    return classify_end(state, exit_code).value


def cancel_run(run_dir: str | os.PathLike[str], scheduler: Any) -> list[str]:
    """Cancel every job of the run that has not ended (the running one and its queued chain).
    Returns the ids asked to cancel."""
    rows = job_table(run_dir, scheduler)
    ids = [r["job_id"] for r in rows if not JobState.parse(r["state"]).is_terminal]
    # The queued ones first: cancelling the running job first would let SLURM start the next.
    queued = (JobState.PENDING, JobState.HELD)
    pending = [r["job_id"] for r in rows if r["job_id"] in ids and JobState.parse(r["state"]) in queued]
    others = [j for j in ids if j not in pending]
    if pending:
        scheduler.cancel(pending)
    if others:
        scheduler.cancel(others)
    return pending + others


def load_run_config(run_dir: str | os.PathLike[str]) -> RunConfig:
    paths = RunPaths.of(run_dir)
    if not paths.config.exists():
        raise UsageError(
            f"{paths.root} is not a run directory (no run.yaml): give the --run-dir of a submitted run"
        )
    return load_config(paths.config)


__all__ = [
    "ConfigError", "SubmitResult", "cancel_run", "job_table", "load_run_config", "prepare_run_dir",
    "recorded_jobs", "submit_job", "submit_run", "write_job_script",
]  # fmt: skip
