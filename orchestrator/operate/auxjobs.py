"""Auxiliary jobs of a run, through submitit: `runctl preprocess | convert | export-hf | eval |
sdc-check`.

    job = submit_aux(run_dir, "eval", {"step": 8})             # a SLURM job, on the run's partition
    job = submit_aux(run_dir, "eval", {"step": 8}, local=True)  # a subprocess on this host
    outcome = wait_aux(job)                                     # AuxOutcome(ok, result | error)

The work is a function of trainer/aux_tasks.py, run inside the job; this side never imports it
(nor torch): what submitit pickles is a `TaskCall` naming the function, which imports
trainer.aux_tasks only when the job calls it. The job runs with the run's config: the partition,
account, qos, extra #SBATCH options, cpus per task, interpreter (`cluster.python`) and environment
(`cluster.env`) of the training job, as one task on one node, named `<run name>-<kind>` (not the
run's name: the training chain's `--dependency=singleton` must not wait for it, nor it for them).

Files, all under the run directory (the shared filesystem), owner-only (aux/ and each job's
folder 0700, every file 0600; orchestrator/operate/aux_files.py says why and what is checked):

    <run_dir>/aux/<kind>-<job_id>/<job_id>_submission.sh    the sbatch script submitit wrote
                                  <job_id>_submitted.pkl     the pickled TaskCall
                                  <job_id>_0_log.out/.err     the job's output
                                  <job_id>_0_result.json     {"status": "success", "result": ...} or
                                                             {"status": "error", "traceback": ...}
                                  <job_id>_0_result.pkl      submitit's own; never loaded here

The job runs `python -m orchestrator.operate.aux_files FOLDER` (not submitit's `submitit.core._submit`):
it checks the folder and the pickle before submitit unpickles anything.

Events (events.jsonl, through the controller's writer, with the user who asked):
`aux_submitted`, then `aux_finished` (with the task's result) or `aux_failed` (with the error and
the log to read), or `aux_detached` when the waiting command was interrupted (the job runs on).

Only the run's owner may run them: they write into the run directory and events.jsonl, which
only the owner's processes write (docs/security.md), and the job runs as whoever submits it.

What reaches the sbatch script submitit writes (docs/slurm.md, "Auxiliary jobs"): submitit puts
each option on an `#SBATCH --key=<shlex.quote(value)>` line, which does not stop a newline, and
takes `python` and `setup` lines as raw shell. So every value is checked here with the training
script's own filters (orchestrator.slurm.render) before submitit sees it, after the config
schema's checks: a config that could not render the training job cannot submit an aux job.
"""

from __future__ import annotations

import importlib
import os
import shlex
import socket
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract import JobState, RunPaths, UntrustedFileError
from orchestrator.contract import events as ev
from orchestrator.contract.events import write_event
from orchestrator.contract.filemodes import PRIVATE_UMASK, NotPrivateError, make_dirs
from orchestrator.errors import PermissionDeniedError, RunctlError, SchedulerError, UsageError
from orchestrator.operate.aux_files import (
    AuxResultError,
    read_result,
    result_json,
    tail_bytes,
    verify_folders,
)

KINDS = ("preprocess", "convert", "export-hf", "eval", "sdc-check")
TASK_MODULE = "trainer.aux_tasks"
AUX_DIR_NAME = "aux"
AUX_DIR_MODE = 0o700  # pickles that run code when loaded, and scripts that hold cluster.env
JOB_ENTRY = "orchestrator.operate.aux_files"  # what the job runs instead of submitit.core._submit
LOG_TAIL_BYTES = 64 * 1024
# After SLURM reports the job ended, how long to wait for its result file to show up on the
# shared filesystem (submitit waits 15 s for the same reason) before calling the job failed.
RESULT_GRACE_SECONDS = 20.0


@dataclass(frozen=True)
class TaskCall:
    """What submitit pickles (by reference to this class, so the job needs only this checkout):
    call trainer.aux_tasks.TASKS[kind](**kwargs) inside the job, importing the trainer there."""

    kind: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> dict[str, Any]:
        from submitit import JobEnvironment  # noqa: PLC0415

        from orchestrator.operate.aux_files import TRACE_MAX_CHARS, write_result  # noqa: PLC0415

        out = result_json(JobEnvironment().paths)
        try:
            result = importlib.import_module(TASK_MODULE).TASKS[self.kind](**self.kwargs)
        except Exception:
            write_result(out, "error", traceback=traceback.format_exc()[-TRACE_MAX_CHARS:])
            raise
        write_result(out, "success", result=result)
        return result


@dataclass
class AuxJob:
    """A submitted aux job and what is needed to follow it and record its end."""

    kind: str
    job: Any  # submitit's SlurmJob or LocalJob
    paths: RunPaths
    user: str
    where: str  # "slurm" | "local"
    submitted_at: float
    poll_seconds: float = 2.0

    @property
    def job_id(self) -> str:
        return str(self.job.job_id)

    @property
    def folder(self) -> Path:
        return Path(self.job.paths.folder)

    @property
    def log(self) -> Path:
        return Path(self.job.paths.stdout)

    @property
    def error_log(self) -> Path:
        return Path(self.job.paths.stderr)


@dataclass
class AuxOutcome:
    ok: bool
    kind: str
    job_id: str
    where: str
    seconds: float
    result: dict[str, Any] | None = None
    error: str | None = None  # the exception's last line, or why there is no result
    traceback: str | None = None  # the end of the job's traceback
    state: str = ""
    log: str = ""
    error_log: str = ""


class AuxJobFailed(RunctlError):
    """The job ran and failed (exit 1); its event is already in events.jsonl."""


# -- the executor ---------------------------------------------------------------------------------
def _checked_parameters(cfg, kind: str, folder: Path, time_minutes: int) -> tuple[dict[str, Any], list[str]]:
    """(submitit SlurmExecutor parameters, setup lines), every value through the training
    script's filters. Raises ConfigError naming the value that would not be safe in the script."""
    from orchestrator.plan.config.site_options import step_options  # noqa: PLC0415
    from orchestrator.slurm.render import env_name, sbatch_option_value, sbatch_value, shquote  # noqa: PLC0415

    c = cfg.cluster
    sbatch_value(folder)  # on the --output/--error lines and srun's arguments
    params: dict[str, Any] = {
        "job_name": sbatch_value(f"{cfg.name}-{kind}"),
        "time": int(time_minutes),
        "nodes": 1,
        "ntasks_per_node": 1,
        "cpus_per_task": int(c.cpus_per_task),
        "wckey": None,  # submitit's default bills every job to a wckey named "submitit"
    }
    for key in ("partition", "account", "qos"):
        value = getattr(c, key)
        if value:
            params[key] = sbatch_value(value)
    if kind == "eval" and c.accelerator == "cuda":
        params["gpus_per_node"] = 1
    if kind == "sdc-check" and c.accelerator == "cuda":  # the replay's ranks, one GPU each, on one node
        params["gpus_per_node"] = int(cfg.world_size)
    extra = {
        sbatch_value(key): True if value is True else sbatch_option_value(value)
        for key, value in sorted(c.extra_sbatch.items())
    }
    if extra:
        params["additional_parameters"] = extra
    # The container and the site's srun options: submitit runs the job's command through srun.
    srun_args = step_options(c.srun_args, cfg.container)
    if srun_args:
        params["srun_args"] = srun_args
    setup = [f"umask {PRIVATE_UMASK:03o}"]  # first: nothing the job writes is open to others
    setup += [f"export {env_name(name)}={shquote(value)}" for name, value in sorted(c.env.items())]
    return params, setup


def _guarded(executor_class: type) -> type:
    """`executor_class` whose job runs JOB_ENTRY (checks, then submitit) instead of submitit's
    own entry point, which unpickles without looking at who could write the pickle."""

    class Guarded(executor_class):
        @property
        def _submitit_command_str(self) -> str:
            return " ".join([self.python, "-u -m", JOB_ENTRY, shlex.quote(str(self.folder))])

    Guarded.__name__ = f"Guarded{executor_class.__name__}"
    return Guarded


def _executor(cfg, paths: RunPaths, kind: str, local: bool, time_minutes: int):
    import submitit  # noqa: PLC0415  (only the aux commands pay for it)

    from orchestrator.slurm.render import shquote  # noqa: PLC0415

    aux = paths.root / AUX_DIR_NAME
    if not make_dirs(aux, AUX_DIR_MODE):
        _tighten(aux)
    folder = aux / f"{kind}-%j"
    params, setup = _checked_parameters(cfg, kind, folder, time_minutes)
    python = shquote(cfg.cluster.python)  # submitit puts it on the command line as it is
    if local:
        executor = _guarded(submitit.LocalExecutor)(folder=folder, python=python)
        executor.update_parameters(timeout_min=params["time"], setup=setup)
        return executor
    try:
        executor = _guarded(submitit.SlurmExecutor)(folder=folder, python=python)
    except RuntimeError as exc:  # no srun on PATH
        raise SchedulerError(
            f"{exc}: load SLURM (`module load slurm`; the local cluster: `eval $(runctl cluster env)`), "
            f"or run it here with --local"
        ) from None
    executor.update_parameters(**params, setup=setup)
    return executor


def _tighten(aux: Path) -> None:
    """aux/ of an older run (0750, or 2775 under umask 002): 0700 when it is this user's own
    folder; anything else in its place is refused. A job folder planted in it meanwhile is
    refused by the job's own check (aux_files.verify_job_folder)."""
    try:
        fd = os.open(aux, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise PermissionDeniedError(
            f"{aux} must be a folder of yours ({exc.strerror}): move it away"
        ) from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise PermissionDeniedError(
                f"{aux} belongs to another user: move it away and run the command again"
            )
        os.fchmod(fd, AUX_DIR_MODE)
    finally:
        os.close(fd)


def require_owner(paths: RunPaths, kind: str) -> str:
    """The current user's name when they own the run; PermissionDeniedError otherwise."""
    from orchestrator.contract.operators import User, run_owner  # noqa: PLC0415

    user = User.current()
    if user.uid != paths.root.stat().st_uid:
        raise PermissionDeniedError(
            f"only the owner of {paths.root} ({run_owner(paths)}) may run `runctl {kind}` on it: the job writes "
            f"into the run directory and events.jsonl, and runs as whoever submits it; you are {user.name}. "
            f"Ask the owner to run it."
        )
    return user.name


def submit_aux(
    run_dir: str | os.PathLike[str],
    kind: str,
    kwargs: dict[str, Any],
    *,
    local: bool = False,
    time_minutes: int = 60,
    reason: str = "",
) -> AuxJob:
    """Submit `kind` with `kwargs` (plain values) for the run in `run_dir`; records aux_submitted."""
    from orchestrator.contract.operators import User, audit  # noqa: PLC0415
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415

    if kind not in KINDS:
        raise UsageError(f"unknown aux job {kind!r}: one of {', '.join(KINDS)}")
    if time_minutes < 1:
        raise UsageError(f"--time-min must be at least 1, got {time_minutes}")
    paths = RunPaths.of(run_dir)
    if not paths.root.is_dir():
        raise UsageError(f"{paths.root} is not a run directory: give the directory `runctl submit` made")
    user = require_owner(paths, kind)  # before reading anything: an operator gets this, not a traceback
    cfg = load_run_config(paths.root)
    from submitit.core.utils import FailedJobError  # noqa: PLC0415

    # Owner-only from the first byte: the pickle, the script, the job folder, and (sbatch passes
    # the umask on as SLURM_UMASK) the job's logs.
    umask = os.umask(PRIVATE_UMASK)
    try:
        executor = _executor(cfg, paths, kind, local, time_minutes)
        job = executor.submit(TaskCall(kind, dict(kwargs)))
    except FailedJobError as exc:  # sbatch refused
        raise SchedulerError(f"sbatch refused the {kind} job: {str(exc).strip() or exc!r}") from None
    finally:
        os.umask(umask)
    where = "local" if local else "slurm"
    aux = AuxJob(kind, job, paths, user, where, time.time(), min(cfg.watchdog.poll_seconds, 5.0))
    write_event(
        paths.events,
        ev.AuxSubmitted(
            kind=kind,
            job_id=aux.job_id,
            where=where,
            user=user,
            host=socket.gethostname(),
            args=dict(kwargs),
            log=str(aux.log),
            reason=reason,
        ),
    )
    audit(
        paths, User.current(), kind, reason or f"runctl {kind}", allowed=True, job_id=aux.job_id, where=where
    )
    return aux


# -- waiting for the end --------------------------------------------------------------------------
def _scheduler_state(aux: AuxJob, scheduler) -> JobState:
    if aux.where == "local":  # LocalJob: RUNNING while the process lives; without a result it failed
        return JobState.RUNNING if aux.job.state == "RUNNING" else JobState.FAILED
    try:
        info = scheduler.jobs([aux.job_id]).get(aux.job_id)
    except SchedulerError:
        return JobState.RUNNING  # squeue did not answer this time: ask again at the next poll
    return info.state if info is not None else JobState.UNKNOWN


def _tail(aux: AuxJob, path: Path, lines: int = 20) -> str:
    """The last lines of a log in the job's (owner-only, checked) folder."""
    try:
        verify_folders(aux.job.paths)
        data = tail_bytes(path, LOG_TAIL_BYTES)
    except (OSError, NotPrivateError, UntrustedFileError):
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def wait_aux(aux: AuxJob, scheduler=None, timeout: float | None = None) -> AuxOutcome:
    """Wait for the job's end and record aux_finished or aux_failed. The end is its result file
    (written by the job), or SLURM saying the job ended without one (killed, timed out, could
    not start). SLURM is asked with squeue (orchestrator.slurm.real), not with submitit's own
    watcher, which needs sacct (accounting) to ever see a job end. KeyboardInterrupt records
    aux_detached and propagates: the job runs on. The result is the job's JSON file, read through
    the bounded reader from its owner-only folder (aux_files.read_result): a folder or file that
    fails the check ends the wait as a failure, and nothing is unpickled here."""
    if scheduler is None and aux.where == "slurm":
        from orchestrator.slurm.real import SlurmScheduler  # noqa: PLC0415

        scheduler = SlurmScheduler()
    started, ended_at = time.monotonic(), None
    state = JobState.PENDING
    try:
        while True:
            result, refused = _poll_result(aux)
            if result is not None or refused is not None:
                break
            if timeout is not None and time.monotonic() - started > timeout:
                raise SchedulerError(
                    f"{aux.kind} job {aux.job_id} did not end within {timeout:.0f} s; it runs on"
                )
            state = _scheduler_state(aux, scheduler)
            if state.is_terminal or state is JobState.UNKNOWN:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > (RESULT_GRACE_SECONDS if aux.where == "slurm" else 1.0):
                    break
            time.sleep(aux.poll_seconds if ended_at is None else 1.0)
    except KeyboardInterrupt:
        _record(
            aux, ev.AuxDetached, note=f"the waiting command was interrupted; the job runs on: read {aux.log}"
        )
        raise
    outcome = AuxOutcome(
        ok=False,
        kind=aux.kind,
        job_id=aux.job_id,
        where=aux.where,
        seconds=0.0,
        state=state.value,
        log=str(aux.log),
        error_log=str(aux.error_log),
    )
    if refused is not None:
        outcome.error = refused
    elif result is not None:
        outcome.ok = result["status"] == "success"
        if outcome.ok:
            outcome.result, outcome.state = result.get("result"), JobState.COMPLETED.value
        else:
            trace = str(result.get("traceback", ""))
            outcome.error, outcome.state = _last_lines(trace, 1), JobState.FAILED.value
            outcome.traceback = _last_lines(trace)
    else:
        outcome.error = (
            f"the job ended ({state.value}) without a result: it did not start, was killed, or refused "
            f"its folder; last lines of {aux.error_log}:\n{_tail(aux, aux.error_log)}"
        )
    outcome.seconds = round(time.time() - aux.submitted_at, 3)
    if aux.where == "local":  # submitit's local runner makes the folder before replacing %j: drop it
        try:
            (aux.folder.parent / f"{aux.kind}-%j").rmdir()
        except OSError:
            pass
    _record(
        aux,
        ev.AuxFinished if outcome.ok else ev.AuxFailed,
        result=outcome.result,
        error=outcome.error,
        traceback=outcome.traceback,
        state=outcome.state,
        seconds=outcome.seconds,
        error_log=outcome.error_log,
    )
    return outcome


def _poll_result(aux: AuxJob) -> tuple[dict[str, Any] | None, str | None]:
    """(the job's result or None while there is none, why it was refused or None)."""
    try:
        return read_result(aux.job.paths), None
    except AuxResultError as exc:
        return None, str(exc)


def _last_lines(trace: str, lines: int = 6) -> str:
    return "\n".join(trace.strip().splitlines()[-lines:])


def _record(aux: AuxJob, event: type[ev.AuxEnded], **fields: Any) -> None:
    fields = {k: v for k, v in fields.items() if v is not None}
    write_event(
        aux.paths.events,
        event(kind=aux.kind, job_id=aux.job_id, where=aux.where, user=aux.user, log=str(aux.log), **fields),
    )


def run_aux(
    run_dir: str | os.PathLike[str],
    kind: str,
    kwargs: dict[str, Any],
    *,
    local: bool = False,
    time_minutes: int = 60,
    reason: str = "",
    on_submitted=None,
) -> AuxOutcome:
    """Submit, wait, record: what each `runctl <kind>` does. Raises AuxJobFailed (exit 1) when
    the job failed, after its aux_failed event is written."""
    aux = submit_aux(run_dir, kind, kwargs, local=local, time_minutes=time_minutes, reason=reason)
    if on_submitted is not None:
        on_submitted(aux)
    outcome = wait_aux(aux)
    if not outcome.ok:
        raise AuxJobFailed(
            f"{kind} job {outcome.job_id} failed ({outcome.state}): {outcome.error}\n"
            f"log: {outcome.log}\n     {outcome.error_log}"
        )
    return outcome
