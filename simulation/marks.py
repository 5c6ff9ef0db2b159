"""The progress marks of a simulated rank (contract.Mark), in closed form.

A stretch of work (a training step, a save, a load, an eval) makes its marks at known times, so
the count a beat reports at any instant is computed, never ticked: a simulated month of 384 ranks
making ~260 marks a step costs nothing per mark. What the trainer does, BLOOM's shape:
- a step of D seconds on a pipeline stage: a bubble until its first micro-batch (~2.6% of D),
  128 micro-batches forward and backward (256 marks, ~91% of D: 0.37 s apart at 105 s), then it
  waits for its peers in the gradient reduce (WAIT), the reduce ends (REDUCE, 3% of D, a wait: not
  a gap of its own), the optimizer step (OPTIMIZER, 3% of D), and the next step begins;
- a save of S seconds: its share of the checkpoint in SAVE_CHUNKS chunks (SAVE_BYTES each S/100),
  then the barrier (WAIT); a load likewise (LOAD_BYTES), inside the init phase;
- an eval of E seconds: one EVAL mark per eval micro-batch;
- a phase begins with a PHASE mark.
`mark_gaps` is what the trainer reports: per phase, the longest gap between two marks, a gap that
ends a wait not counted. A hang cuts a stretch short (`stop`): its marks end there. A rank blocked
in a collective that needs a hung peer (`block`): its marks end with a WAIT at the time it entered
the collective (every collective is a wait, orchestrator/contract/client/progress.waited).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from orchestrator.contract import Mark, Phase

MICRO_BATCHES = 128  # per pipeline stage per step (BLOOM: global batch 2048 / dp 8 / micro-batch 2)
SAVE_CHUNKS = 100  # a rank's 6.4 GB share of a 2.47 TB checkpoint in 64 MB chunks
LOAD_CHUNKS = 100
_STEP_UNITS = (Mark.FORWARD.value, Mark.BACKWARD.value)
_BEFORE = 1e-6  # the marks before a time: those strictly earlier


@dataclass(frozen=True)
class Stretch:
    """Marks from `start`: an optional PHASE mark at `start`, then after `lead` seconds `n` marks
    `every` seconds apart cycling through `units`, then `tail` marks (seconds after the previous
    mark, unit). It ends at `end` (the next stretch starts there); `stop` cuts it (a hang)."""

    phase: str
    start: float
    end: float
    lead: float
    every: float
    n: int
    units: tuple[str, ...]
    tail: tuple[tuple[float, str], ...] = ()
    opening: bool = False
    stop: float = math.inf
    blocked: float = math.inf  # entered a collective that never completes then: a WAIT, nothing after

    def _times(self) -> list[tuple[float, str]]:
        """The irregular marks (opening and tail) with their times; the regular ones are closed form."""
        marks = [(self.start, Mark.PHASE.value)] if self.opening else []
        t = self.start + self.lead + (self.n - 1) * self.every if self.n else self.start
        for offset, unit in self.tail:
            t += offset
            marks.append((t, unit))
        return marks

    def at(self, t: float) -> tuple[int, str, float]:
        """(marks made by time t, the last one's unit or "", its time or -inf)."""
        if self.blocked < t or self.blocked == t < math.inf:
            count, _, _ = self._at(self.blocked - _BEFORE)
            return count + 1, Mark.WAIT.value, self.blocked
        return self._at(t)

    def _at(self, t: float) -> tuple[int, str, float]:
        t = min(t, self.stop, self.end)
        count, unit, when = 0, "", -math.inf
        if self.opening and t >= self.start:
            count, unit, when = 1, Mark.PHASE.value, self.start
        first = self.start + self.lead
        if self.n and t >= first:
            done = min(self.n, int((t - first) / self.every) + 1)
            count += done
            unit, when = self.units[(done - 1) % len(self.units)], first + (done - 1) * self.every
        for mark_time, mark_unit in self._times()[1 if self.opening else 0 :]:
            if mark_time <= t:
                count, unit, when = count + 1, mark_unit, mark_time
        return count, unit, when

    def longest_gap(self, t: float) -> float:
        """The longest counted gap between two marks up to time t (a mark at `start` is assumed:
        this stretch's opening one or the previous stretch's last, never a wait). Includes the
        closing gap when t reaches `end`."""
        # Blocked: the work up to the collective is a gap, the wait in it is not.
        if self.blocked < t or self.blocked == t < math.inf:
            _, unit, when = self._at(self.blocked - _BEFORE)
            last = when if when > -math.inf else self.start
            work = 0.0 if unit == Mark.WAIT.value else self.blocked - last
            return max(self._longest_gap(self.blocked - _BEFORE), work)
        return self._longest_gap(t)

    def _longest_gap(self, t: float) -> float:
        t = min(t, self.stop, self.end)
        longest = 0.0
        last_time, last_wait = self.start, False
        first = self.start + self.lead
        if self.n and t >= first:
            longest = self.lead
            if self.n > 1 and t >= first + self.every:
                longest = max(longest, self.every)
            done = min(self.n, int((t - first) / self.every) + 1)
            last_time, last_wait = first + (done - 1) * self.every, False
        for mark_time, unit in self._times()[1 if self.opening else 0 :]:
            if mark_time > t:
                break
            if not last_wait:
                longest = max(longest, mark_time - last_time)
            last_time, last_wait = mark_time, unit == Mark.WAIT.value
        if t >= self.end and self.stop > self.end and not last_wait:
            longest = max(longest, self.end - last_time)  # closed by the next stretch's first mark
        return longest

    def cut(self, t: float) -> Stretch:
        return replace(self, stop=min(self.stop, t))

    def block(self, t: float) -> Stretch:
        """Blocked from t in a collective that never completes (its marks before t stand)."""
        return replace(self, stop=min(self.stop, t), blocked=min(self.blocked, t))

    def next_mark(self, t: float) -> float:
        """When its first mark after t falls (inf: none before its end)."""
        first = self.start + self.lead
        if self.n and t < first + (self.n - 1) * self.every:
            return first if t < first else first + (int((t - first) / self.every) + 1) * self.every
        return min((when for when, _ in self._times() if when > t), default=math.inf)

    def wait_time(self) -> float | None:
        """When its WAIT mark falls (a step's entry into the reduce), if it has one."""
        for mark_time, unit in self._times():
            if unit == Mark.WAIT.value:
                return mark_time
        return None


def step(start: float, seconds: float, first_of_phase: bool = False) -> Stretch:
    """One training step; the first after a phase change opens with its PHASE mark."""
    every = 0.914 * seconds / (2 * MICRO_BATCHES)
    tail = (
        (0.0, Mark.WAIT.value),
        (0.03 * seconds, Mark.REDUCE.value),
        (0.03 * seconds, Mark.OPTIMIZER.value),
    )
    lead = 0.026 * seconds + every
    return Stretch(
        Phase.STEP.value,
        start,
        start + seconds,
        lead,
        every,
        2 * MICRO_BATCHES,
        _STEP_UNITS,
        tail,
        first_of_phase,
    )


def chunks(phase: Phase, start: float, seconds: float, unit: Mark, n: int, lead: float = 0.0) -> Stretch:
    """A save (or a load after `lead` seconds of start-up) moving its bytes in n chunks, then the
    barrier; or n eval micro-batches (no barrier)."""
    every = seconds / n
    tail = () if unit is Mark.EVAL else ((0.0, Mark.WAIT.value),)
    return Stretch(
        phase.value, start, start + lead + seconds, lead + every, every, n, (unit.value,), tail, opening=True
    )


def opening(phase: Phase, start: float, end: float = math.inf) -> Stretch:
    """A phase that makes no mark but its first (init before the load, the exit)."""
    return Stretch(phase.value, start, end, 0.0, 1.0, 0, (), opening=True)
