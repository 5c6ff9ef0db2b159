"""Run directories and their job chains: what `runctl submit/status/cancel` and the controller share.

    paths = prepare_run_dir(cfg, run_dir)                  # folders + frozen run.yaml
    job_id = submit_job(run_dir, cfg, scheduler, exclude=[], reason="restart")   # one job
    result = submit_run(config, run_dir, scheduler, chain=3, dry_run=False)       # what `runctl submit` does
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

from orchestrator.contract import JobState, RunPaths, atomic_write_text, classify_end
from orchestrator.contract.filemodes import NotPrivateError, make_dirs, private_dir
from orchestrator.contract.ledger import (
    LastSeen,
    Submission,
    append_submission,
    read_last_seen,
    read_submissions,
    write_last_seen,
)
from orchestrator.contract.operators import SECRET_FILE_MODE, SECRET_SCRIPT_MODE, prepare_permissions
from orchestrator.contract.paths import JOB_SCRIPT_NAME
from orchestrator.contract.state import load_state
from orchestrator.errors import DoesNotFitError, UsageError
from orchestrator.plan.config import ConfigError, RunConfig, dump_config, load_config, parse_config
from orchestrator.plan.config.load import safe_load_unique
from orchestrator.slurm.base import JobInfo, SubmitRequest
from orchestrator.slurm.render import rank_command, render_sbatch, run_job_name, srun_preview

SCRIPT_NAME = JOB_SCRIPT_NAME
RUN_FOLDER_MODE = 0o750  # jobs/, heartbeats/, checkpoints/: the operators' group reads, only the owner writes


def prepare_run_dir(cfg: RunConfig, run_dir: str | os.PathLike[str]) -> RunPaths:
    """Create the run directory's folders and write the frozen run.yaml.

    A run directory that already holds a *different* run.yaml is refused (UsageError): a run's
    config is frozen; make a new run directory to change it.
    """
    paths = RunPaths.of(run_dir, cfg.checkpoint.dir)
    text = dump_config(cfg)
    refuse_another_config(cfg, paths.root)
    for folder in (paths.jobs, paths.heartbeats, paths.checkpoints, paths.metrics.parent):
        make_dirs(folder, RUN_FOLDER_MODE)  # made, then chmodded: the caller's umask plays no part
    if not paths.config.exists():
        atomic_write_text(paths.config, text, mode=SECRET_FILE_MODE)  # cluster.env, the notification URLs
    # control/, accepted/, the root and run.yaml get the modes of the threat model (docs/security.md);
    # the controller reports any warning (e.g. no operators' group) when it starts.
    prepare_permissions(paths, cfg.operators)
    return paths


def refuse_another_config(cfg: RunConfig, run_root: Path) -> None:
    """UsageError when `run_root` already holds a different run.yaml: a run's config is frozen."""
    config = run_root / "run.yaml"
    if not config.exists():
        return
    existing = config.read_text()
    if existing != dump_config(cfg):
        raise UsageError(
            f"{config} already holds another config (run name {_name_of(existing)!r}); a run's config is "
            "frozen: give a new --run-dir"
        )


def run_name(paths: RunPaths) -> str:
    """The run's name from its run.yaml, without validating the whole config (`runctl ls`)."""
    with open(paths.config, encoding="utf-8") as handle:
        return _name_of(handle.read(64 * 1024))


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
        script=script, job_name=run_job_name(cfg.name, paths.root), dependency=dependency, hold=hold,
        exclude=list(exclude or []),
    )  # fmt: skip
    try:
        job_id = str(scheduler.submit(request))
    except BaseException:
        script.unlink(missing_ok=True)
        raise
    job_dir = paths.job_dir(job_id)
    # Owner-only from the start, as the job script and the launcher make it: what the job and
    # the controller later write here is evidence nobody else may plant or replace.
    try:
        private_dir(job_dir)
    except NotPrivateError as exc:
        raise UsageError(
            f"job {job_id} is submitted, but its folder cannot be trusted: {exc} (the script is {script}); "
            f"`runctl cancel` the job if it must not run"
        ) from None
    shutil.move(str(script), job_dir / SCRIPT_NAME)
    append_submission(
        paths.submissions,
        Submission(
            job_id=job_id,
            time=time.time(),
            reason=reason,
            exclude=list(exclude or []),
            chain_index=chain_index,
            user=_user(),
            scheduler=getattr(scheduler, "name", "?"),
            script=str(job_dir / SCRIPT_NAME),
        ),
    )
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
    script: str  # the first job's script (a dry run writes none: see script_text)
    job_ids: list[str] = field(default_factory=list)
    dry_run: bool = False
    scheduler: str = ""
    job_name: str = ""  # the singleton key: every job of this run carries it
    chain: int = 1
    warnings: list[str] = field(default_factory=list)  # pre-flight warnings (the submission went on)
    script_text: str = ""  # what sbatch gets (a dry run's output)
    srun_lines: list[str] = field(default_factory=list)  # what the job's launcher will run
    probe: list[str] = field(default_factory=list)  # the probe job's verdicts (slurm/env_probe.py)


def check_plan(cfg: RunConfig) -> list[str]:
    """The planner's problems for this config ([] = it fits), time budget included."""
    from orchestrator.plan.planner import plan_run  # the planner is heavier; only submit needs it

    return list(plan_run(cfg).problems)


def check_this_host(cfg: RunConfig, run_root: Path) -> list[str]:
    """The submit host's checks (orchestrator/plan/preflight.py): returns the warnings, raises
    UsageError listing every error (and the warnings beside them)."""
    from orchestrator.contract.operators import User  # noqa: PLC0415
    from orchestrator.plan.planner import checkpoint_bytes, count_parameters  # noqa: PLC0415
    from orchestrator.plan.preflight import host_checks  # noqa: PLC0415

    checkpoints = RunPaths.of(run_root, cfg.checkpoint.dir).checkpoints
    checks = host_checks(cfg, checkpoints, checkpoint_bytes(count_parameters(cfg)), User.current().groups)
    errors = [c.message for c in checks if c.level == "error"]
    warnings = [c.message for c in checks if c.level == "warning"]
    if errors:
        raise UsageError(
            "pre-flight on this host refused the run:\n"
            + "\n".join(f"  - {e}" for e in errors)
            + "".join(f"\n  (warning) {w}" for w in warnings)
            + "\nNothing was written or submitted. (--skip-host-checks: only to review a config away from its cluster)"
        )
    return warnings


def submit_run(
    config_path: str | os.PathLike[str],
    run_dir: str | os.PathLike[str] | None,
    scheduler: Any,
    *,
    chain: int = 1,
    dry_run: bool = False,
    command: list[str] | None = None,
    host_checks: bool = True,
    probe: bool = False,
    probe_timeout: float = 900.0,
    say: Any = None,
) -> SubmitResult:
    """What `runctl submit` does: validate, plan (fit and time budget), pre-flight on this host,
    the probe job (with `probe`: the nodes run the interpreter, import the trainer, see the GPUs
    and the data), prepare the run dir, render, submit `chain` jobs linked by --dependency=singleton.
    dry_run: the same path up to the first write: nothing is created, the script is returned.
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
    run_root = (Path(run_dir) if run_dir else Path("runs") / cfg.name).resolve()
    refuse_another_config(cfg, run_root)
    warnings = check_this_host(cfg, run_root) if host_checks else []
    # What the job will read is the frozen run.yaml: render exactly that (the dry run from the
    # same text, never written).
    frozen = parse_config(safe_load_unique(dump_config(cfg)), source=str(run_root / "run.yaml"))
    result = SubmitResult(run_dir=str(run_root), config=str(run_root / "run.yaml"), script="", dry_run=dry_run,
                          scheduler=getattr(scheduler, "name", "?"), job_name=run_job_name(cfg.name, run_root),
                          chain=chain, warnings=warnings)  # fmt: skip
    argv = command if command is not None else rank_command(frozen, str(run_root))
    result.srun_lines = srun_preview(frozen, str(run_root), argv)
    if dry_run:
        result.script_text = render_sbatch(frozen, run_root, command=command)
        if probe:
            result.probe = ["a probe job would run first on one node (--skip-probe skips it)"]
        return result
    if probe and not getattr(scheduler, "runs_job_scripts", True):
        result.warnings.append(f"no probe job: the {scheduler.name} scheduler runs no job script")
    elif probe:
        from orchestrator.slurm.env_probe import require_ok, run_probe  # noqa: PLC0415

        report = run_probe(frozen, scheduler, run_root.parent, timeout_seconds=probe_timeout,
                           say=say or (lambda _message: None))  # fmt: skip
        require_ok(report)
        result.probe = report.lines()
    paths = prepare_run_dir(cfg, run_root)
    frozen = load_config(paths.config)
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
    result.script_text = Path(result.script).read_text()
    return result


def recorded_jobs(run_dir: str | os.PathLike[str]) -> list[Submission]:
    """Every job ever submitted for the run, oldest first: the ledger, plus any job the
    controller's state.json knows that the ledger does not (e.g. submitted by an older tool)."""
    paths = RunPaths.of(run_dir)
    rows: dict[str, Submission] = {s.job_id: s for s in read_submissions(paths.submissions)}
    try:
        jobs = load_state(paths).jobs
    except ValueError:  # a malformed state.json: the ledger alone
        jobs = []
    for job in jobs:
        if job.job_id not in rows:
            rows[job.job_id] = Submission(
                job_id=job.job_id, time=job.submitted_at, reason=job.reason or "controller"
            )
    return sorted(rows.values(), key=lambda r: int(r.job_id) if r.job_id.isdigit() else 0)


@dataclass(frozen=True)
class JobRow:
    """One job of the run as `runctl status` lists it: the scheduler's answer (or the last one
    seen, `stale`), what its end meant (`outcome`, an ExitCode meaning) and why it was submitted.
    `why` is the controller's reason where it recorded one (views.dashboard fills it in)."""

    job_id: str
    state: str  # a JobState value
    exit_code: int | None
    outcome: str
    nodes: tuple[str, ...]
    reason: str  # SLURM's reason (why it waits)
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    submit_reason: str
    stale: bool  # the scheduler no longer reports it: the state is the last one seen
    why: str | None = None


def job_table(run_dir: str | os.PathLike[str], scheduler: Any | None = None) -> list[JobRow]:
    """One JobRow per job of the run, oldest first.

    With a scheduler, states are asked for (one call for all jobs) and cached in
    jobs/last_seen.json; a job the scheduler no longer knows keeps its last seen state with
    `stale` set. Without one, the cached states are shown. Only the run's owner updates the
    cache: anyone else (`runctl status` by an operator) reads it.
    """
    paths = RunPaths.of(run_dir)
    recorded = recorded_jobs(paths.root)
    decided = controller_outcomes(paths)
    cache = read_last_seen(paths.last_seen)
    live: dict[str, JobInfo] = {}
    if scheduler is not None and recorded:
        live = scheduler.jobs([r.job_id for r in recorded])
    rows = []
    changed = False
    for entry in recorded:
        info = live.get(entry.job_id)
        seen = cache.get(entry.job_id)
        stale = False
        if info is not None and info.state is not JobState.UNKNOWN:
            seen = LastSeen(
                state=info.state.value, exit_code=info.exit_code, nodes=list(info.nodes), reason=info.reason,
                started_at=info.start_time, ended_at=info.end_time,
            )  # fmt: skip
            cache[entry.job_id] = seen
            changed = True
        elif seen is not None:
            stale = True
        seen = seen or LastSeen(state=JobState.UNKNOWN.value, seen_at=0.0)
        rows.append(JobRow(
            job_id=entry.job_id, state=seen.state, exit_code=seen.exit_code,
            outcome=decided.get(entry.job_id) or _outcome(seen.state, seen.exit_code),
            nodes=tuple(seen.nodes), reason=seen.reason,
            submitted_at=entry.time, started_at=seen.started_at, ended_at=seen.ended_at,
            submit_reason=entry.reason, stale=stale,
        ))  # fmt: skip
    if changed and os.geteuid() == paths.root.stat().st_uid:  # only the owner writes the run's files
        write_last_seen(paths.last_seen, cache)
    return rows


def controller_outcomes(paths: RunPaths) -> dict[str, str]:
    """What the controller recorded a job's end as, where it did: e.g. "cancelled (kill switch)"
    for the queued jobs of a chain a kill cancelled (SLURM says CANCELLED with exit 0 for those)."""
    try:
        jobs = load_state(paths).jobs
    except ValueError:  # malformed or newer: the scheduler's view alone
        return {}
    return {j.job_id: j.outcome for j in jobs if j.outcome}


def _outcome(state: str, exit_code: int | None) -> str:
    """What an ended job means for the run, as the controller classifies it (classify_end: a
    SLURM TIMEOUT is the time budget, for both); "" while the job has not ended. A job cancelled
    before it ran (exit 0 or none: `runctl cancel`, a kill's queued jobs) is "cancelled", not a
    failure."""
    parsed = JobState.parse(state)
    if not parsed.is_terminal:
        return ""
    if parsed is JobState.CANCELLED and not exit_code:
        return "cancelled"
    return classify_end(state, exit_code).value


def cancel_run(run_dir: str | os.PathLike[str], scheduler: Any) -> list[str]:
    """Cancel every job of the run that has not ended (the running one and its queued chain).
    Returns the ids asked to cancel."""
    rows = job_table(run_dir, scheduler)
    ids = [r.job_id for r in rows if not JobState.parse(r.state).is_terminal]
    # The queued ones first: cancelling the running job first would let SLURM start the next.
    queued = (JobState.PENDING, JobState.HELD)
    pending = [r.job_id for r in rows if r.job_id in ids and JobState.parse(r.state) in queued]
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
    "ConfigError", "JobRow", "SubmitResult", "cancel_run", "job_table", "load_run_config", "prepare_run_dir",
    "recorded_jobs", "submit_job", "submit_run", "write_job_script",
]  # fmt: skip
