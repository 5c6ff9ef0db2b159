"""What one pass of the controller saw, in one typed shape for every watcher and policy.

- `RunView`: the pass's two clocks (read once at its start), the run's state, its jobs and the
  config. The training-health policy judges with it.
- `JobView`: a RunView with the running job: its beats, the assessment of them, the nodes
  excluded and where each rank runs. Every watcher of the running job answers
  `on_pass(view) -> list[Action]` (stragglers.py, stalls.py; probing.py also takes the scheduler's
  probe step) and the incident policy judges its findings with it (policy.on_findings).

One shape means a new fault class reads what the pass saw from here, instead of growing its own
argument list through the supervisor (docs/architecture.md, "How to add a fault class"). The
views are built where they are used, so a view never shows jobs from before an action of the same
pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.contract import Heartbeat
from orchestrator.contract.state import ControllerState, JobRecord

from . import jobs as job_lists
from .detection import Assessment


@dataclass(frozen=True)
class Jobs:
    """The run's jobs as this pass sees them."""

    running: str | None = None
    queued: tuple[str, ...] = ()
    unsettled: tuple[str, ...] = ()  # ended, their end not handled yet

    @property
    def any_left(self) -> bool:
        return self.running is not None or bool(self.unsettled)

    @classmethod
    def of(cls, state: ControllerState) -> Jobs:
        running = job_lists.running_job(state)
        return cls(
            running=running.job_id if running else None,
            queued=tuple(j.job_id for j in job_lists.queued_jobs(state)),
            unsettled=tuple(j.job_id for j in state.live_jobs() if j.ended_at is not None),
        )


@dataclass(frozen=True)
class RunView:
    wall: float  # the controller's wall clock at the pass's start
    mono: float  # its monotonic clock, read at the same moment
    state: ControllerState
    jobs: Jobs
    cfg: Any  # the run's config (read-only)


@dataclass(frozen=True)
class JobView(RunView):
    job: JobRecord  # the running job
    beats: tuple[Heartbeat, ...]  # every rank's newest beat, of every job still beating
    assessment: Assessment
    excluded: frozenset[str]  # the exclude list as this pass read it
    run_dir: str
    node_of_rank: Callable[[int, str], str]  # (rank, host) -> the SLURM node it runs on, in this job

    def node_of(self, beat: Heartbeat) -> str:
        return self.node_of_rank(beat.rank, beat.host)
