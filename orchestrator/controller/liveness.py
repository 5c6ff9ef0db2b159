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

Cost: nothing for a heartbeat file that did not change since the last pass (the reader hands back
the same list), one dict lookup per rank of a file that changed, and eight field comparisons for a
rank whose beat is a new one (the reader hands back the same object for an entry that did not).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, compress

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
        self.first_beat_at: float | None = None  # monotonic: first pass that saw one of its ranks beat
        self.ranks: dict[int, RankView] = {}
        # Views whose beat is new in the last pass and reports gaps between marks that may be new
        # (a new rank, or its mark_gaps not the same object as before: the reader keeps the
        # object of a field that did not change): what PhaseTimeouts.learn needs to see.
        self.gaps_changed: list[RankView] = []
        self.last_pass: float = -math.inf  # monotonic: the pass before this one
        # The files folded into `ranks`, by identity (held, so that no new list reuses an id): a
        # file the reader hands back unchanged (the same list) is not looked at again.
        self._files: dict[int, Sequence[Heartbeat]] = {}

    def reset(self, job_id: str | None) -> None:
        self.job_id = job_id
        self.incarnation, self.min_incarnation = (-1, -1), (0, 0)
        self.job_seen_at = self.first_beat_at = None
        self.ranks, self._files = {}, {}

    def expect_new_incarnation(self, after_launch: int | None = None) -> None:
        """SLURM requeued the job (it went back to pending, or its start time changed), or the
        controller decided to relaunch the trainer inside it after launch `after_launch`: the
        beats on disk are the old incarnation's until the new ranks overwrite them."""
        restarts = max(self.incarnation[0], 0)
        after = (restarts, after_launch + 1) if after_launch is not None else (self.incarnation[0] + 1, 0)
        self.min_incarnation = max(self.min_incarnation, after)
        self.job_seen_at = self.first_beat_at = None
        self.ranks, self._files = {}, {}

    def observe(
        self, files: Iterable[Sequence[Heartbeat]], job_id: str | None, now: float
    ) -> dict[int, RankView]:
        """Fold one pass's beats in, by file (HeartbeatReader.read_files: a list of beats per
        heartbeat file, the same list while the file did not change); returns the views of the
        current incarnation's ranks. Only files that changed since the last pass are looked at:
        at 16,384 ranks half of the 2,048 node files change between two passes."""
        job_id = None if job_id is None else str(job_id)
        if job_id != self.job_id:
            self.reset(job_id)
        if job_id is None:
            return {}
        if self.job_seen_at is None:
            self.job_seen_at = now
        files = list(files)
        seen, self._files = self._files, {id(beats): beats for beats in files}
        mine = self._mine([beats for beats in files if id(beats) not in seen], job_id)
        newest = max(map(_INCARNATION, mine), default=(-1, -1))
        if newest > self.incarnation:
            # (Its beats are all in files that changed: a file that holds them and did not change
            # was seen holding them, and made this the incarnation then.)
            if self.ranks:  # a requeue we had not heard of from SLURM: start over
                self.ranks = {}
                self.job_seen_at, self.first_beat_at = now, None
            self.incarnation = newest
        restarts, launch = self.incarnation
        ranks, silent_after = self.ranks, self.silent_after
        # A rank not seen to change up to the last pass was silent when that pass saw it for
        # longer than silent_after (sparse passes alone are not silence: the last pass is when
        # its beat last changed, then).
        silent_before = self.last_pass - silent_after
        self.last_pass = now
        gaps_changed = self.gaps_changed = []
        for beat in mine:
            if beat.restart_count != restarts or beat.launch != launch:
                continue
            rank = beat.rank
            view = ranks.get(rank)
            if view is not None and view.beat is beat:  # the reader's same object: nothing changed
                continue
            if view is None:
                if self.first_beat_at is None:
                    self.first_beat_at = now
                view = ranks[rank] = RankView(rank, beat, now, now, now)
                gaps_changed.append(view)
                continue
            old, view.beat = view.beat, beat
            if beat.mark_gaps is not old.mark_gaps:
                gaps_changed.append(view)
            returned = False
            if beat_moved(beat, old):
                if view.beat_changed < silent_before:  # back from silence: its progress went unseen
                    view.progress_changed, returned = now, True
                view.beat_changed = now
            if progressed(beat, old):
                view.progress_changed = now
                if not returned:
                    view.progress_seen = now
        return self.ranks

    def _mine(self, files: list[Sequence[Heartbeat]], job_id: str) -> list[Heartbeat]:
        """The beats of these files that are this job's, of an incarnation not below the floor
        (sweeps in C: map, compress, attrgetter)."""
        beats = list(chain.from_iterable(files))
        mine = list(compress(beats, map(job_id.__eq__, map(_JOB_ID, beats))))
        floor = self.min_incarnation
        if floor != (0, 0):
            mine = list(compress(mine, map(floor.__le__, map(_INCARNATION, mine))))
        return mine
