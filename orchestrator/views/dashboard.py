"""The run at a glance, from the run directory alone (any operator can read it, no controller
needed): one job table, training progress, checkpoints, heartbeat age per node, excluded nodes,
recent events, straggler scores and the warnings a person must see.

    view = status_data(run_dir, scheduler)   # a StatusView (views.status_view); view.to_json(): `--json`
    screen = render_status(view)             # orchestrator.views.status_screen: the same, for people

`status_data` is the only place the screen's facts are gathered, so that the JSON and the screen
never disagree; the screen only words and lays them out.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.contract import JobState, RunPaths, read_heartbeats, tail_metrics
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract import pool_events as pev
from orchestrator.contract.checkpoints import list_checkpoints
from orchestrator.contract.controller_beat import beat_file_age, read_beat
from orchestrator.contract.controller_lock import lock_holder
from orchestrator.contract.events import read_events
from orchestrator.contract.exclude import read_excluded
from orchestrator.contract.state import ControllerState, DiskPause, PoolStatus, RunStatus, load_state
from orchestrator.views.status_view import (
    CheckpointView,
    Dashboard,
    DiskView,
    Goodput,
    GoodputWindow,
    NextDue,
    NodeBeats,
    StatusView,
    StorageStall,
    Training,
)

if TYPE_CHECKING:  # operate.runs pulls in the config models: imported where the rows are made
    from orchestrator.operate.runs import JobRow

RECENT_EVENTS = 8


def _config(paths: RunPaths):
    try:
        from orchestrator.plan.config import load_config  # noqa: PLC0415

        return load_config(paths.config)
    except Exception:  # a dashboard shows what it can
        return None


def status_data(
    run_dir: str | os.PathLike[str],
    scheduler: Any | None = None,
    scheduler_problem: str | None = None,
    now: float | None = None,
) -> StatusView:
    """Everything `runctl status` shows. `scheduler`: asked for the jobs' states (None: the
    controller's records and the last states seen); `scheduler_problem`: why it was not asked."""
    from orchestrator.operate.runs import job_table  # noqa: PLC0415

    paths = RunPaths.of(run_dir)
    now = time.time() if now is None else now
    state = load_state(paths)
    dashboard = dashboard_data(paths.root, now=now, state=state)
    jobs = merge_controller_records(job_table(paths.root, scheduler), state)
    beating = dashboard.heartbeat_job
    if any(row.job_id == beating and row.state == JobState.RUNNING.value for row in jobs):
        # The scheduler's word, before the controller's.
        dashboard = replace(dashboard, heartbeat_job_running=True)
    data = StatusView(
        run_dir=str(paths.root),
        name=dashboard.run,
        now=now,
        jobs=tuple(jobs),
        dashboard=dashboard,
        stragglers=state.stragglers or {},
        pool=state.pool,
        scheduler_problem=scheduler_problem,
    )
    return replace(data, warnings=tuple(warnings(data, state.pool, state.disk_pause)))


def merge_controller_records(rows: list[JobRow], state: ControllerState) -> list[JobRow]:
    """The one job table: the scheduler's rows (runs.job_table) with, per job, why the controller
    submitted it; where the scheduler gave no fresh answer (a job it forgot, or not asked), the
    controller's own record of the job (it asks every pass) before the last state seen."""
    records = {j.job_id: j for j in state.jobs}
    merged = []
    for row in rows:
        record = records.get(row.job_id)
        row = replace(row, why=(record.reason if record and record.reason else row.submit_reason) or "-")
        unanswered = row.stale or row.state == JobState.UNKNOWN.value
        if record is not None and unanswered:
            row = replace(
                row,
                state=record.state,
                exit_code=record.exit_code,
                nodes=tuple(record.nodes) or row.nodes,
                started_at=record.started_at,
                ended_at=record.ended_at,
                stale=False,
                outcome=record.outcome or row.outcome,
            )
        merged.append(row)
    return merged


def dashboard_data(
    run_dir: str | os.PathLike[str], now: float | None = None, state: ControllerState | None = None
) -> Dashboard:
    paths = RunPaths.of(run_dir)
    now = time.time() if now is None else now
    cfg = _config(paths)
    state = state or load_state(paths)
    metrics = tail_metrics(paths.metrics)
    last = metrics[-1] if metrics else None
    total_steps = None
    if cfg is not None:
        total_steps = -(-cfg.train_samples // cfg.parallel.global_batch_size)
    step_seconds = [m.step_seconds for m in metrics[-20:] if m.step_seconds]
    eta = None
    if total_steps and last is not None and step_seconds:
        eta = max(0, total_steps - last.step) * sum(step_seconds) / len(step_seconds)
    # Where the config puts them (checkpoint.dir), by the contract's one rule, as the trainer does.
    ckpt_dir = (RunPaths.of(paths.root, cfg.checkpoint.dir) if cfg is not None else paths).checkpoints
    complete = [c for c in list_checkpoints(ckpt_dir) if c.complete]
    last_ckpt = complete[-1] if complete else None
    next_due = NextDue()
    if cfg is not None and not state.status.stopped:  # a stopped run saves nothing more
        if cfg.checkpoint.interval_steps:
            base = last_ckpt.step if last_ckpt else 0
            next_due = replace(next_due, step=base + cfg.checkpoint.interval_steps)
        if cfg.checkpoint.interval_hours and last_ckpt and last_ckpt.saved_at:
            next_due = replace(
                next_due, in_seconds=last_ckpt.saved_at + cfg.checkpoint.interval_hours * 3600 - now
            )
    # The beats shown: the running job's, else those of the last job that ran.
    live_job = next((j for j in reversed(state.jobs) if j.state == JobState.RUNNING), None)
    ran = next((j for j in reversed(state.jobs) if j.started_at), state.jobs[-1] if state.jobs else None)
    job_id = (live_job or ran).job_id if (live_job or ran) else None
    if job_id is None:  # submitted, not seen by a controller yet: the ledger's newest job
        from orchestrator.operate.runs import recorded_jobs  # noqa: PLC0415

        recorded = recorded_jobs(paths.root)
        job_id = recorded[-1].job_id if recorded else None
    controller = lock_holder(paths.root)
    nodes, ranks_expected, ranks_seen = _nodes(paths, cfg, live_job, job_id, now, controller is not None)
    events = read_events(paths.events)
    stopped = next((e for e in reversed(events) if isinstance(e, fev.RunStopped)), None)
    disk = next((e for e in reversed(events) if isinstance(e, ev.Disk)), None)
    tolerance = cfg.watchdog.stall_tolerance_seconds if cfg else None
    stall = _storage_stall(events, live_job.job_id if live_job else None, now, tolerance)
    beat = read_beat(paths)
    return Dashboard(
        run=cfg.name if cfg else paths.root.name,
        run_dir=str(paths.root),
        status=state.status.value,
        controller=controller,
        controller_failing_passes=beat.failing_passes if beat and controller else 0,
        last_pass_age=(now - state.last_pass) if state.last_pass else None,
        restarts=state.restarts,
        training=Training(
            step=last.step if last else None,
            total_steps=total_steps,
            loss=last.loss if last else None,
            tokens_per_s=last.tokens_per_s if last else None,
            tflops_per_gpu=last.tflops_per_gpu if last else None,
            eta_seconds=None if state.status.stopped else eta,
            metrics_age=(now - last.time) if last and last.time else None,
        ),
        checkpoint=CheckpointView(
            dir=str(ckpt_dir),
            last_step=last_ckpt.step if last_ckpt else None,
            age_seconds=(now - last_ckpt.saved_at) if last_ckpt and last_ckpt.saved_at else None,
            bytes=last_ckpt.size_bytes if last_ckpt else None,
            next_due=next_due,
        ),
        heartbeat_job=job_id,
        heartbeat_job_running=live_job is not None,
        nodes=dict(sorted(nodes.items())),
        ranks_in_job=ranks_expected,
        ranks_beating=ranks_seen,
        dead_after=cfg.watchdog.dead_after_seconds if cfg else 60.0,
        late_after=_late_after(cfg),
        excluded=read_excluded(paths),
        events=tuple(events[-RECENT_EVENTS:]),
        stop_message=stopped.message if stopped and state.status.stopped else None,
        disk=DiskView(level=state.disk_level, message=disk.message if disk else ""),
        storage_stall=stall,
        disk_pause=state.disk_pause,
        goodput=_goodput(paths, now, ckpt_dir),
    )


def _late_after(cfg) -> float:
    """A beat older than this is shown as late (a few missed beats; half the way to dead)."""
    if cfg is None:
        return 30.0
    return max(3 * cfg.watchdog.heartbeat_seconds, cfg.watchdog.dead_after_seconds / 2)


def _nodes(paths: RunPaths, cfg, live_job, job_id, now: float, controller_runs: bool):
    """Per node of job `job_id`: its oldest rank beat's age, its rank count, phase and step; and
    the ranks the job has (world size) and those that beat."""
    nodes: dict[str, NodeBeats] = {}
    # While a controller runs, the beat ages are its own (seconds since it saw each node's beat
    # change, on its monotonic clock); without one, node clocks against this machine's.
    seen_by_controller = _controller_beat_ages(paths, now) if controller_runs else {}
    expected = 0
    for beat in read_heartbeats(paths.heartbeats):
        if job_id is not None and beat.job_id != str(job_id):
            continue
        expected = max(expected, beat.world_size)
        host = beat.host
        if live_job and live_job.nodes and host not in live_job.nodes and cfg is not None:
            index = beat.rank // cfg.cluster.gpus_per_node
            host = live_job.nodes[index] if index < len(live_job.nodes) else host
        entry = nodes.get(host) or NodeBeats(age=0.0, rank_count=0, phase=beat.phase.value, step=beat.step)
        age = seen_by_controller.get(beat.host, now - beat.beat_time)
        nodes[host] = replace(entry, age=max(entry.age, age), rank_count=entry.rank_count + 1)
    return nodes, expected, sum(n.rank_count for n in nodes.values())


def _controller_beat_ages(paths: RunPaths, now: float) -> dict[str, float]:
    beat = read_beat(paths)
    since = beat_file_age(paths, now)
    if beat is None or since is None:
        return {}
    return {host: age + since for host, age in beat.node_beat_age.items()}


def _goodput(paths: RunPaths, now: float, ckpt_dir: Path) -> Goodput | None:
    """Whole-run and 24 h goodput with their largest losses (orchestrator.views.goodput)."""
    from orchestrator.views.goodput import run_breakdown  # noqa: PLC0415

    try:
        breakdown = run_breakdown(paths.root, now=now, checkpoints_dir=ckpt_dir)
    except (OSError, ValueError, TypeError, KeyError):  # a dashboard shows what it can
        return None
    whole, day = (
        GoodputWindow(goodput=breakdown[w]["goodput"], fraction=breakdown[w]["fraction"])
        for w in ("whole_run", "last_24h")
    )
    return Goodput(whole_run=whole, last_24h=day)


def _storage_stall(
    events: list[ev.Event], job_id: str | None, now: float | None = None, tolerance: float | None = None
) -> StorageStall | None:
    """The running job's node that the controller's probe found in a storage stall (its ranks
    blocked on the filesystem), while nothing has happened to the job since and the node has not
    beaten again (a `node_stalled` event: the stall ended): the controller waits for it
    (watchdog.stall_tolerance_seconds) instead of declaring it lost. Its age counts from the
    incident's first stall answer (the node is asked early, then again once silent)."""
    if job_id is None:
        return None
    came_back: set[str] = set()
    found: fev.NodeProbed | None = None
    for event in reversed(events):
        if getattr(event, "job_id", None) != job_id:
            continue
        if isinstance(event, pev.NodeStalled):
            came_back.add(event.node)
        if isinstance(event, fev.NodeProbed):
            if found is None and (event.verdict != "stall" or event.node in came_back):
                return None
            if found is not None and (
                event.node != found.node or event.verdict != "stall" or event.node in came_back
            ):
                break
            found = event
            if event.early:
                break
            continue
        if isinstance(event, (fev.Failure, fev.Restart, ev.JobEnded)):
            break
    if found is None:
        return None
    age = max(0.0, now - found.time) if now is not None else 0.0
    return StorageStall(found.node, found.why, found.time, age, tolerance)


def warnings(
    data: StatusView, pool: PoolStatus | None = None, disk_pause: DiskPause | None = None
) -> list[str]:
    """What a person must act on or know before trusting the screen, in words (never cut)."""
    d = data.dashboard
    run = data.run_dir
    status = RunStatus(d.status)
    out = []
    if status.stopped and status is not RunStatus.FINISHED:
        out.append(
            f"the run is stopped ({status.value}): {d.stop_message or 'see runctl events'}; nothing "
            f"restarts it until `runctl resume {run}`"
        )
    if not status.stopped and not d.controller:
        out.append(
            "no controller is watching this run: a failure or a hang is neither noticed nor restarted. "
            f"The owner starts one with `runctl watch {run} --detach`"
        )
    if d.controller_failing_passes:
        out.append(
            f"the controller's last {d.controller_failing_passes} pass(es) failed: it supervises "
            f"nothing until one works (`runctl events {run} --type pass_failed`)"
        )
    if disk_pause is not None and status is RunStatus.DISK_FULL:
        from orchestrator.views.event_text.disk_words import pause_message  # noqa: PLC0415

        out.append(pause_message(disk_pause))
    elif d.disk.level != "ok" and status is not RunStatus.FINISHED:
        out.append(f"checkpoint disk {d.disk.level}: {d.disk.message or 'see runctl events'}")
    stall = d.storage_stall
    if stall and not status.stopped:
        upto = f" up to {stall.tolerance_seconds:.0f} s" if stall.tolerance_seconds is not None else ""
        out.append(
            f"{stall.node} is in a storage stall ({stall.why}), found {stall.age_seconds:.0f} s ago: its "
            f"ranks wait on the filesystem, so the controller waits too{upto} "
            "(watchdog.stall_tolerance_seconds) before declaring the node lost; look at the filesystem "
            "the run writes to"
        )
    if pool is not None and pool.short and not status.stopped:
        out.append(f"CRITICAL, the node pool is short: {pool.message or 'see runctl events'}")
    elif pool is not None and pool.message and not status.stopped:  # fewer spares: it still trains
        out.append(pool.message)
    if data.scheduler_problem:
        out.append(
            f"the scheduler was not asked ({data.scheduler_problem}): job states are the controller's "
            "records or the last seen"
        )
    stale = [r.job_id for r in data.jobs if r.stale]
    if stale:
        out.append(
            f"the scheduler no longer reports job(s) {', '.join(stale)}: their state is the last one seen "
            "(marked ?)"
        )
    return out
