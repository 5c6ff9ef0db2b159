"""Liveness judged by change, on the controller's own monotonic clock.

Node clocks drift (BLOOM's 48 nodes are not one clock: a node 30 s behind must not look dead, one an
hour ahead must not hide a dead rank), and the login node's wall clock steps with NTP. So the
controller never compares a timestamp written by a node with its own clock. Instead it remembers,
per rank, the last beat it read and the time *on its own monotonic clock* at which
- the beat last changed (any field the background thread moves: seq, beat_time, pid): liveness;
- the progress fields last changed (progress_count: the marks done, step, phase, phase_started):
  progress.
A rank is dead when its beat has not changed for `dead_after` seconds of that clock, hung when its
progress has not changed for its phase's limit (timeouts.py). While a rank's beat is silent its
progress cannot be seen, so when its beats come back after a pass saw them unchanged for more than
`silent_after`, its progress timer starts again: a filesystem stall is not counted as time without progress. The only price: a
controller that starts (or restarts) knows nothing yet, so its first verdicts come `dead_after`
after it started, never early.

Incarnations: SLURM keeps the job id across a requeue, and a relaunch on a spare inside the job
(trainer.in_allocation) keeps it too; the old incarnation's heartbeat files stay until the new
ranks overwrite them. Every beat carries `restart_count` (SLURM_RESTART_COUNT) and `launch`
(RUNCTL_LAUNCH): only beats of the newest (restart_count, launch) seen for the job count; when a
newer one appears, every rank's memory is dropped and the "job seen running" time starts again, so
the old beats can neither look dead nor count as progress.

Cost: one dict lookup per rank per pass, and eight field comparisons for a rank whose beat is a new
one (the reader hands back the same object for a beat that did not change).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from itertools import compress

from orchestrator.contract import Heartbeat


@dataclass
class RankView:
    rank: int
    beat: Heartbeat  # the last beat read
    beat_changed: float  # controller monotonic time of the last change of its beat (beat_moved)
    # ... of its progress (progressed), and when it comes back from silence (the hang timer starts
    # again: what it did meanwhile could not be seen).
    progress_changed: float
    # ... of its progress seen as it happened: not when it comes back from silence, its marks moved
    # at some unknown time meanwhile (the stall rule's evidence that the peers of a silent node live).
    progress_seen: float
    silent: bool = False  # a pass saw its beat unchanged for longer than silent_after


_JOB_ID = operator.attrgetter("job_id")
_INCARNATION = operator.attrgetter("restart_count", "launch")


def beat_moved(new: Heartbeat, old: Heartbeat) -> bool:
    """Its beat changed: what the background thread moves (field by field: no tuple a rank a pass)."""
    return (
        new.seq != old.seq
        or new.beat_time != old.beat_time
        or new.pid != old.pid
        or new.process_started != old.process_started
    )


def progressed(new: Heartbeat, old: Heartbeat) -> bool:
    """Its progress changed: a mark made, a step done, a phase begun."""
    return (
        new.progress_count != old.progress_count
        or new.step != old.step
        or new.phase != old.phase
        or new.phase_started != old.phase_started
    )


class Liveness:
    """What the controller has seen of the ranks of the job it supervises now."""

    def __init__(self, silent_after: float = math.inf) -> None:
        self.silent_after = silent_after  # timeouts.silent_after(watchdog)
        self.job_id: str | None = None
        self.incarnation: tuple[int, int] = (-1, -1)
        self.min_incarnation: tuple[int, int] = (0, 0)
        self.job_seen_at: float | None = None  # monotonic: first pass that saw this incarnation running
        self.ranks: dict[int, RankView] = {}
        self.changed: list[RankView] = []  # views whose beat is a new one in the last pass

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

    def observe(self, beats: list[Heartbeat], job_id: str | None, now: float) -> dict[int, RankView]:
        """Fold one pass's beats in; returns the views of the current incarnation's ranks."""
        job_id = None if job_id is None else str(job_id)
        if job_id != self.job_id:
            self.reset(job_id)
        if job_id is None:
            return {}
        if self.job_seen_at is None:
            self.job_seen_at = now
        floor = self.min_incarnation
        # Sweeps in C (map, compress, max over attrgetter): this runs over every rank every pass.
        mine = list(compress(beats, map(job_id.__eq__, map(_JOB_ID, beats))))
        if floor != (0, 0):
            mine = list(compress(mine, map(floor.__le__, map(_INCARNATION, mine))))
        newest = max(map(_INCARNATION, mine), default=(-1, -1))
        if newest > self.incarnation:
            if self.ranks:  # a requeue we had not heard of from SLURM: start over
                self.ranks = {}
                self.job_seen_at = now
            self.incarnation = newest
        restarts, launch = self.incarnation
        ranks = self.ranks
        changed = self.changed = []
        for beat in mine:
            if beat.restart_count != restarts or beat.launch != launch:
                continue
            rank = beat.rank
            view = ranks.get(rank)
            if view is not None and view.beat is beat:  # the reader's same object: nothing changed
                if not view.silent and now - view.beat_changed > self.silent_after:
                    view.silent = True
                continue
            if view is None:
                view = ranks[rank] = RankView(rank, beat, now, now, now)
                changed.append(view)
                continue
            old, view.beat = view.beat, beat
            changed.append(view)
            returned = False
            if beat_moved(beat, old):
                if view.silent:  # back from silence: its progress could not be seen meanwhile
                    view.progress_changed, view.silent, returned = now, False, True
                view.beat_changed = now
            elif now - view.beat_changed > self.silent_after:
                view.silent = True  # seen silent by a pass (sparse passes alone are not silence)
            if progressed(beat, old):
                view.progress_changed = now
                if not returned:
                    view.progress_seen = now
        return self.ranks
