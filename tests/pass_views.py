"""The controller's pass views (orchestrator/controller/pass_view.py) for unit tests of its
watchers and policies: what one pass saw, everything not given left empty."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from orchestrator.contract import Heartbeat
from orchestrator.contract.state import ControllerState, JobRecord, RunStatus
from orchestrator.controller.detection import Assessment
from orchestrator.controller.pass_view import Jobs, JobView, RunView


def run_view(state: ControllerState | None = None, *, jobs: Jobs = Jobs(), wall: float = 0.0, mono: float = 0.0,
             cfg: Any = None) -> RunView:
    state = state if state is not None else ControllerState(status=RunStatus.RUNNING)
    return RunView(wall=wall, mono=mono, state=state, jobs=jobs, cfg=cfg)


def job_view(job: str | JobRecord = "7", *, state: ControllerState | None = None, beats: Iterable[Heartbeat] = (),
             assessment: Assessment | None = None, wall: float = 0.0, mono: float = 0.0,
             excluded: Iterable[str] = (), node_of: Callable[[int, str], str] = lambda rank, host: host,
             dead_after: float = 120.0, cfg: Any = None, run_dir: str = "/run", **assessment_fields) -> JobView:
    """`job`: its id (a running JobRecord is made) or the record; `assessment_fields` make the
    Assessment when none is given (host_beat_age, silent_hosts, findings, world_size, ...)."""
    record = JobRecord(job, 0.0, state="running") if isinstance(job, str) else job
    if assessment is None:
        assessment = Assessment(job_id=record.job_id, ranks_seen=0, **assessment_fields)
    cfg = cfg if cfg is not None else SimpleNamespace(watchdog=SimpleNamespace(dead_after_seconds=dead_after))
    view = run_view(state, jobs=Jobs(running=record.job_id), wall=wall, mono=mono, cfg=cfg)
    return JobView(**vars(view), job=record, beats=tuple(beats), assessment=assessment,
                   excluded=frozenset(excluded), run_dir=run_dir, node_of_rank=node_of)
