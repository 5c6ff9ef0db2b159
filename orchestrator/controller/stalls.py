"""Node stalls: a node whose beats stopped and came back while its job lived.

A storage hiccup or a paging storm freezes every rank of one node for a while; the node is not
broken, so one stall excludes nothing. Rules, on the controller's monotonic clock (the ages are
liveness.py's, per host: seconds since its stalest rank's beat changed):
- a node is silent once its age reaches `stall_seconds` (default 3 beats) while most of the job
  still beats (a job-wide stall is the filesystem's or the job's, not the node's);
- a node the probe found in a storage stall before any of its ranks beat in a launch
  (`stalled_before_beating`, probing.py) is silent from when the launch's others began to beat;
- it stalled when it beats again in the same job: a `node_stalled` event with how long;
- the `stall_limit`-th stall within `stall_window_hours` (wall clock of the controller) puts it
  on probation (an Exclude, cause repeated_stalls): the next job does without it.
The history is the controller's memory (a restarted controller starts counting again).
Cost: one dict lookup per node per pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.contract import pool_events as pev
from orchestrator.contract.causes import Cause

from .actions import Action, Exclude, Record
from .pass_view import JobView


class StallWatch:
    def __init__(self, exclusions: Any, heartbeat_seconds: float):
        self.threshold = exclusions.stall_seconds or 3 * heartbeat_seconds
        self.limit = exclusions.stall_limit
        self.window = exclusions.stall_window_hours * 3600.0
        self.silent: dict[str, tuple[str, float]] = {}  # node -> (job, monotonic when it went quiet)
        self.history: dict[str, list[float]] = {}  # node -> wall times of its stalls

    def on_pass(
        self, view: JobView, stalled_before_beating: Mapping[str, float] | None = None
    ) -> list[Action]:
        job_id, beat_ages, job_wide = view.job.job_id, view.assessment.host_beat_age, view.assessment.job_wide
        mono, wall, excluded = view.mono, view.wall, view.excluded
        actions: list[Action] = []
        for node in [n for n, (job, _) in self.silent.items() if job != job_id]:
            del self.silent[node]  # its job ended: not a stall that came back
        for node, since in (stalled_before_beating or {}).items():
            self.silent.setdefault(node, (job_id, since))
        quiet = sum(1 for age in beat_ages.values() if age >= self.threshold)
        if job_wide or 2 * quiet >= max(1, len(beat_ages)):
            return actions  # most of the job is quiet: not one node's stall
        for node, age in beat_ages.items():
            if age >= self.threshold:
                self.silent.setdefault(node, (job_id, mono - age))
                continue
            went_quiet = self.silent.pop(node, None)
            if went_quiet is None:
                continue
            seconds = max(0.0, mono - age - went_quiet[1])
            times = [t for t in self.history.get(node, []) if wall - t <= self.window] + [wall]
            self.history[node] = times
            exclude = len(times) >= self.limit and node not in excluded
            actions.append(
                Record(
                    pev.NodeStalled(
                        node=node,
                        job_id=job_id,
                        seconds=round(seconds, 1),
                        stalls_in_window=len(times),
                        window_hours=self.window / 3600.0,
                        excluded=exclude,
                    )
                )
            )
            if exclude:
                why = f"{len(times)} stalls within {self.window / 3600:g} h"
                actions.append(
                    Exclude((node,), f"repeated_stalls in job {job_id}: {why}", job_id, Cause.REPEATED_STALLS)
                )
        return actions
