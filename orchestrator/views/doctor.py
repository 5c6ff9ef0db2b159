"""Who watches the watcher: `runctl doctor RUN_DIR`, run from cron on any login node.

Four checks, each a DoctorFinding (ok, or a problem that says what to do):
1. controller: it runs, and its heartbeat (controller.json) keeps moving while the run is not
   stopped. It runs when the pid in its heartbeat is alive (the doctor on the controller's own
   host), or when something holds the run's lock (elsewhere: flock is cluster-wide on GPFS and
   Lustre with `flock`; where it is not, the message says to run the doctor on that host). A
   recorded pid that exited is a dead controller, however fresh its last beat.
   Judged by the pass counter in the file against the doctor's own memory of it (a small JSON
   file per run under the user's state directory, with the time of the look by the doctor's
   clock): stale when `passes` has not moved for longer than `stale_after`. Two looks of the
   same machine never compare clocks. On the first look (no memory yet) the file's mtime is
   compared with this machine's clock instead: login nodes share one NTP and the threshold is
   minutes. A controller can only be judged between two doctor runs, which cron provides.
2. job: a run that is not stopped has a job pending or running in the scheduler; right after a
   job ends the controller needs a pass to resubmit, so only an absence longer than `grace`
   counts.
3. disk: the next checkpoint fits (orchestrator.contract.disk_space); critical is a problem.
5. pool: the controller's last look at SLURM's nodes left fewer usable than the job's nodes
   (exclusions, down, drained, reserved; spares not counted): the next job cannot start.
6. stop: the run stopped on its own (crash loop, config error, paused for training health:
   contract.severity.NEEDS_A_PERSON): nothing trains until a person looks. A kill or a finish
   is ok.
4. passes: a controller that runs but whose last FAILING_PASSES_PROBLEM passes or more all failed
   (controller.json's failing_passes) supervises nothing: a kill is not acted on, a failure not
   restarted. One failed pass is routine (squeue timing out); several in a row are a problem.

Problems are notified (orchestrator.controller.notify, kind "doctor": a page) when they change, not on every cron
run. Reading only: the doctor writes nothing in the run directory (it may not be the owner).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import JobState, RunPaths, atomic_write_json, read_json
from orchestrator.contract.controller_beat import ControllerBeat, beat_file_age, read_beat
from orchestrator.contract.severity import NEEDS_A_PERSON
from orchestrator.contract.state import ControllerState, RunStatus, load_state

STOPPED = tuple(status.value for status in RunStatus.STOPPED)
FAILING_PASSES_PROBLEM = 3  # in a row: with the controller's backoff, 7 poll intervals at least
LIVE_STATES = (JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.HELD)


@dataclass
class DoctorFinding:
    check: str  # "controller" | "job" | "disk" | "passes" | "pool" | "stop"
    ok: bool
    message: str


def memory_path(run_root: Path, state_dir: str | os.PathLike[str] | None = None) -> Path:
    """The doctor's own memory of one run (not in the run directory: any operator may run it)."""
    base = (
        Path(state_dir)
        if state_dir
        else Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "runctl"
    )
    digest = hashlib.sha256(str(run_root).encode()).hexdigest()[:16]
    return base / f"doctor-{digest}.json"


def check_controller(
    paths: RunPaths, status: str, memory: dict[str, Any], now: float, stale_after: float
) -> DoctorFinding:
    if status in STOPPED:
        return DoctorFinding("controller", True, f"the run is {status}: no controller needed")
    beat = read_beat(paths)
    if beat is None:
        return DoctorFinding(
            "controller", False,
            f"no controller heartbeat ({paths.controller_heartbeat.name} missing): no controller has "
            f"supervised this run since it was submitted; start one: runctl watch {paths.root} --detach",
        )  # fmt: skip
    passes = beat.passes
    who = f"pid {beat.pid} on {beat.host}"
    gone = controller_gone(paths, beat)
    if gone:
        return DoctorFinding(
            "controller", False,
            f"no controller is running: {gone}. Start one: runctl watch {paths.root} --detach "
            "(or runctl doctor --restart-controller as the owner)",
        )  # fmt: skip
    seen = memory.get("controller") or {}
    if seen.get("passes") == passes and isinstance(seen.get("seen_at"), (int, float)):
        quiet = now - float(seen["seen_at"])
        how = f"its pass counter ({passes}) has not moved for {quiet:.0f} s (doctor's clock)"
    else:
        memory["controller"] = {"passes": passes, "seen_at": now}
        quiet = beat_file_age(paths, now) or 0.0
        how = f"{paths.controller_heartbeat.name} last changed {quiet:.0f} s ago"
        if seen:  # the counter moved since the last look: alive, whatever the mtime says
            quiet = 0.0
    if quiet > stale_after:
        return DoctorFinding(
            "controller", False,
            f"the controller ({who}) is stale: {how}, more than {stale_after:.0f} s. If it hangs, "
            f"kill it on {beat.host}; then start one: runctl watch {paths.root} --detach "
            "(or runctl doctor --restart-controller as the owner)",
        )  # fmt: skip
    failing = beat.failing_passes
    note = f"; its last {failing} pass(es) failed (see runctl events)" if failing else ""
    return DoctorFinding("controller", True, f"controller {who} alive: {passes} passes{note}")


def check_passes(paths: RunPaths, status: str) -> DoctorFinding:
    """A controller alive but failing every pass is not supervising (the `passes` check)."""
    beat = None if status in STOPPED else read_beat(paths)
    failing = beat.failing_passes if beat is not None else 0
    if failing >= FAILING_PASSES_PROBLEM:
        return DoctorFinding(
            "passes", False,
            f"the controller's last {failing} passes failed: it runs but supervises nothing (a kill or a "
            f"failure is not acted on). `runctl events {paths.root}` shows the error of each "
            "(pass_failed); fix its cause, the controller retries on its own",
        )  # fmt: skip
    return DoctorFinding(
        "passes", True, f"{failing} failed pass(es) in a row" if failing else "passes succeed"
    )


def check_pool(state: ControllerState, status: str) -> DoctorFinding:
    """The controller's last judgment of the node pool (controller/pool.py): too few nodes for the
    job means it pends until nodes return, a problem however healthy the rest is."""
    pool = state.pool
    if status in STOPPED or pool is None or not pool.short:
        usable = f"{pool.usable} usable of {pool.needed} needed" if pool else "not judged yet"
        return DoctorFinding("pool", True, f"node pool: {usable}")
    return DoctorFinding(
        "pool", False, f"node pool short: {pool.message or 'see runctl events (pool_short)'}"
    )


def check_stop(paths: RunPaths, state: ControllerState, status: str) -> DoctorFinding:
    """A run that stopped on its own needs a person, however quiet it looks."""
    if not status or state.status not in NEEDS_A_PERSON:
        return DoctorFinding("stop", True, f"the run is {status}" if status else "the run has not started")
    return DoctorFinding(
        "stop", False,
        f"the run stopped on its own ({status}): nothing trains until a person looks. "
        f"`runctl status {paths.root}` and `runctl events {paths.root}` say why; fix it, then "
        f"`runctl resume {paths.root}`",
    )  # fmt: skip


def controller_gone(paths: RunPaths, beat: ControllerBeat) -> str | None:
    """Why the controller of `beat` is not running, or None when it may be."""
    from orchestrator.contract.controller_lock import lock_holder  # noqa: PLC0415

    pid, host = beat.pid, beat.host
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"its pid {pid} on this host ({host}) has exited"
        except PermissionError:
            pass  # alive, another user's
        return None
    if lock_holder(paths.root) is None:
        return (
            f"nothing holds the run's lock (controller.lock), and the last controller was pid {pid} on {host}. "
            f"If this filesystem's flock is not cluster-wide (docs/security.md, Locks), run the doctor on {host}"
        )
    return None


def check_job(
    run_root: Path, status: str, scheduler: Any, state: ControllerState, now: float, grace: float
) -> DoctorFinding:
    if status in STOPPED:
        return DoctorFinding("job", True, f"the run is {status}: no job needed")
    if status == RunStatus.DISK_FULL.value:  # the disk finding says what to delete
        return DoctorFinding("job", True, "the run is paused on a full disk: no job until there is room")
    from orchestrator.errors import SchedulerError  # noqa: PLC0415
    from orchestrator.operate.runs import recorded_jobs  # noqa: PLC0415 - pulls in the config models

    ids = [r.job_id for r in recorded_jobs(run_root)]
    try:
        infos = scheduler.jobs(ids) if ids else {}
    except SchedulerError as exc:
        return DoctorFinding("job", True, f"cannot ask the scheduler ({exc}); job check skipped")
    live = [j for j, info in infos.items() if info.state in LIVE_STATES]
    if live:
        return DoctorFinding("job", True, f"job(s) {', '.join(sorted(live))} queued or running")
    ends = [info.end_time for info in infos.values() if info.end_time]
    ends += [j.ended_at for j in state.jobs if j.ended_at]
    last_end = max(ends) if ends else None
    if last_end is not None and now - last_end < grace:
        return DoctorFinding(
            "job", True, f"no job right now; the last ended {now - last_end:.0f} s ago (grace {grace:.0f} s)"
        )
    return DoctorFinding(
        "job", False,
        f"the run is {status or 'not started'} but no job of it is queued or running"
        + (f" (the last ended {now - last_end:.0f} s ago)" if last_end else "")
        + f": is its controller alive? `runctl status {run_root}`; `runctl resume` or `runctl watch --detach`",
    )  # fmt: skip


def check_disk_space(paths: RunPaths, cfg: Any) -> DoctorFinding:
    from orchestrator.contract.checkpoints import list_checkpoints  # noqa: PLC0415
    from orchestrator.contract.disk_space import check_disk  # noqa: PLC0415
    from orchestrator.plan.planner import planned_checkpoint_bytes  # noqa: PLC0415

    ckpt_dir = RunPaths.of(paths.root, cfg.checkpoint.dir).checkpoints
    complete = [c for c in list_checkpoints(ckpt_dir) if c.complete]
    check = check_disk(ckpt_dir, complete[-1].size_bytes if complete else None, planned_checkpoint_bytes(cfg))
    if check.level == "critical":
        return DoctorFinding(
            "disk", False, f"disk critical: {check.message()}: the next save will fail; free space now"
        )
    return DoctorFinding("disk", True, f"disk {check.level}: {check.message()}")


def diagnose(
    run_dir: str | os.PathLike[str],
    cfg: Any,
    scheduler: Any,
    *,
    stale_after: float,
    grace: float,
    state_dir: str | os.PathLike[str] | None = None,
    now: float | None = None,
) -> tuple[list[DoctorFinding], dict[str, Any], Path]:
    """The findings, the doctor's memory (updated, not yet saved) and where it lives."""
    paths = RunPaths.of(run_dir)
    now = now if now is not None else time.time()
    where = memory_path(paths.root, state_dir)
    try:
        memory = read_json(where) or {}
    except (OSError, ValueError):
        memory = {}
    try:
        state = load_state(paths)
    except ValueError:  # malformed or newer: judged as a run that has not started
        state = ControllerState()
    status = state.status.value if paths.state.exists() else ""
    findings = [
        check_controller(paths, status, memory, now, stale_after),
        check_job(paths.root, status, scheduler, state, now, grace),
        check_disk_space(paths, cfg),
        check_passes(paths, status),
        check_pool(state, status),
        check_stop(paths, state, status),
    ]
    return findings, memory, where


def should_notify(findings: list[DoctorFinding], memory: dict[str, Any]) -> bool:
    """Notify when the set of failing checks changed since the last run (cron must not page every
    five minutes about the same problem); remembers the new set."""
    failing = sorted(f.check for f in findings if not f.ok)
    changed = failing != memory.get("notified", [])
    memory["notified"] = failing
    return changed and bool(failing)


def save_memory(where: Path, memory: dict[str, Any]) -> None:
    atomic_write_json(where, memory, mode=0o600)


def as_json(findings: list[DoctorFinding]) -> list[dict[str, Any]]:
    return [asdict(f) for f in findings]
