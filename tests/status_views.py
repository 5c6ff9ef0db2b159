"""status_view(...): a StatusView for tests of the status screen's pieces, with a healthy run's
facts by default; keyword arguments replace fields of the view (`jobs`, `warnings`, ...) and of its
dashboard (`status`, `nodes`, `storage_stall`, ...); `run_dir` is both's."""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.operate.runs import JobRow
from orchestrator.views.status_view import (
    CheckpointView,
    Dashboard,
    DiskView,
    NextDue,
    NodeBeats,
    StatusView,
    Training,
)


def status_view(**changes: Any) -> StatusView:
    dashboard = Dashboard(
        run="r", run_dir="/runs/r", status="running", controller={"pid": 1}, controller_failing_passes=0,
        last_pass_age=None, restarts=0,
        training=Training(step=None, total_steps=None, loss=None, tokens_per_s=None, tflops_per_gpu=None,
                          eta_seconds=None, metrics_age=None),
        checkpoint=CheckpointView(dir="/runs/r/checkpoints", last_step=None, age_seconds=None, bytes=None,
                                  next_due=NextDue()),
        heartbeat_job=None, heartbeat_job_running=False, nodes={}, ranks_in_job=0, ranks_beating=0,
        dead_after=60.0, late_after=30.0, excluded={}, events=(), stop_message=None,
        disk=DiskView(level="ok", message=""), storage_stall=None, disk_pause=None, goodput=None,
    )  # fmt: skip
    names = {f.name for f in dataclasses.fields(Dashboard)}
    dashboard = dataclasses.replace(dashboard, **{k: v for k, v in changes.items() if k in names})
    view = StatusView(run_dir="/runs/r", name="r", now=0.0, jobs=(), dashboard=dashboard, stragglers={},
                      pool=None, scheduler_problem=None)  # fmt: skip
    own = {f.name for f in dataclasses.fields(StatusView)} - {"dashboard"}
    unknown = set(changes) - names - own
    assert not unknown, f"neither a StatusView nor a Dashboard field: {unknown}"
    return dataclasses.replace(view, **{k: v for k, v in changes.items() if k in own})


def job_row(**changes: Any) -> JobRow:
    row = JobRow(job_id="1", state="running", exit_code=None, outcome="", nodes=(), reason="", submitted_at=0.0,
                 started_at=None, ended_at=None, submit_reason="submit", stale=False)  # fmt: skip
    return dataclasses.replace(row, **changes)


def node_beats(ages: dict[str, float], rank_count: int = 8) -> dict[str, NodeBeats]:
    return {n: NodeBeats(age=a, rank_count=rank_count) for n, a in ages.items()}
