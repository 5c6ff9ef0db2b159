"""Liveness judged by change, on the controller's own monotonic clock.

Node clocks drift (BLOOM's 48 nodes are not one clock: a node 30 s behind must not look dead, one an
hour ahead must not hide a dead rank), and the login node's wall clock steps with NTP. So the
controller never compares a timestamp written by a node with its own clock. Instead it remembers,
per rank, the last beat it read and the time *on its own monotonic clock* at which
- the beat last changed (any field the background thread moves: seq, beat_time, pid): liveness;
- the progress fields last changed (step, progress_time, phase, phase_started): progress.
A rank is dead when its beat has not changed for `dead_after` seconds of that clock, hung when its
progress has not changed for its phase's timeout. The only price: a controller that starts (or
restarts) knows nothing yet, so its first verdicts come `dead_after` after it started, never early.

Incarnations: SLURM keeps the job id across a requeue, and a relaunch on a spare inside the job
(trainer.in_allocation) keeps it too; the old incarnation's heartbeat files stay until the new
ranks overwrite them. Every beat carries `restart_count` (SLURM_RESTART_COUNT) and `launch`
(RUNCTL_LAUNCH): only beats of the newest (restart_count, launch) seen for the job count; when a
newer one appears, every rank's memory is dropped and the "job seen running" time starts again, so
the old beats can neither look dead nor count as progress.

Cost: one dict lookup and two tuple comparisons per rank per pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RankView:
    rank: int
    beat: dict[str, Any]  # the last beat read (for host, phase, step, extra)
    beat_key: tuple
    progress_key: tuple
    beat_changed: float  # controller monotonic time of the last change of beat_key
    progress_changed: float  # ... of progress_key


def beat_key(beat: dict[str, Any]) -> tuple:
    return (beat.get("seq"), beat.get("beat_time"), beat.get("pid"), beat.get("process_started"))


def progress_key(beat: dict[str, Any]) -> tuple:
    return (beat.get("step"), beat.get("progress_time"), beat.get("phase"), beat.get("phase_started"))


def _count(beat: dict[str, Any], name: str) -> int:
    value = beat.get(name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _incarnation(beat: dict[str, Any]) -> tuple[int, int]:
    return (_count(beat, "restart_count"), _count(beat, "launch"))


class Liveness:
    """What the controller has seen of the ranks of the job it supervises now."""

    def __init__(self) -> None:
        self.job_id: str | None = None
        self.incarnation: tuple[int, int] = (-1, -1)
        self.min_incarnation: tuple[int, int] = (0, 0)
        self.job_seen_at: float | None = None  # monotonic: first pass that saw this incarnation running
        self.ranks: dict[int, RankView] = {}

    def reset(self, job_id: str | None) -> None:
        self.job_id = job_id
        self.incarnation, self.min_incarnation = (-1, -1), (0, 0)
        self.job_seen_at = None
        self.ranks = {}

    def expect_new_incarnation(self, after_launch: int | None = None) -> None:
        """SLURM requeued the job (it went back to pending, or its start time changed), or the
        controller decided to relaunch the trainer inside it after launch `after_launch`: the
        beats on disk are the old incarnation's until the new ranks overwrite them."""
        restarts = max(self.incarnation[0], 0)
        after = (restarts, after_launch + 1) if after_launch is not None else (self.incarnation[0] + 1, 0)
        self.min_incarnation = max(self.min_incarnation, after)
        self.job_seen_at = None
        self.ranks = {}

    def observe(self, beats: list[dict[str, Any]], job_id: str | None, now: float) -> dict[int, RankView]:
        """Fold one pass's beats in; returns the views of the current incarnation's ranks."""
        job_id = None if job_id is None else str(job_id)
        if job_id != self.job_id:
            self.reset(job_id)
        if job_id is None:
            return {}
        if self.job_seen_at is None:
            self.job_seen_at = now
        mine = [
            b
            for b in beats
            if isinstance(b, dict)
            and str(b.get("job_id")) == job_id
            and _incarnation(b) >= self.min_incarnation
        ]
        newest = max((_incarnation(b) for b in mine), default=(-1, -1))
        if newest > self.incarnation:
            if self.ranks:  # a requeue we had not heard of from SLURM: start over
                self.ranks = {}
                self.job_seen_at = now
            self.incarnation = newest
        for beat in mine:
            if _incarnation(beat) != self.incarnation:
                continue
            rank = beat.get("rank")
            if not isinstance(rank, int) or isinstance(rank, bool):
                continue
            b_key, p_key = beat_key(beat), progress_key(beat)
            view = self.ranks.get(rank)
            if view is None:
                self.ranks[rank] = RankView(rank, beat, b_key, p_key, now, now)
                continue
            view.beat = beat
            if b_key != view.beat_key:
                view.beat_key, view.beat_changed = b_key, now
            if p_key != view.progress_key:
                view.progress_key, view.progress_changed = p_key, now
        return self.ranks
