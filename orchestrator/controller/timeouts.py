"""Per-phase hang limits, learned per launch from the gaps between the ranks' progress marks.

A step is not atomic: each rank reports the finest units of work it finished (contract.Mark: a
micro-batch forward or backward, the reduce, the optimizer step, a chunk of a save or a load, an
eval micro-batch) and, per phase, the longest gap it saw between two of its own marks (waits for
its peers not counted). A rank that has made no mark for a few times that gap is stuck, however
long its step or its save takes: a slow step whose micro-batches move is not a hang, a save whose
bytes move is not one however long it takes, a save whose bytes stop is. So, per phase:

    limit(phase) = min(cap, max(floor[phase], factor x the longest gap any rank of this launch
                                              reported for the phase))

and, while no rank of the launch has reported a gap for the phase (its first seconds; a trainer
that does not mark), the phase's configured limit (`watchdog.<phase>_timeout_seconds`). The cap
keeps one outlier from switching hang detection off; every limit is finite. Learning is per launch:
a new job, a requeue or a relaunch on a spare starts again from nothing (the beats carry each
process's own longest gaps, so a restarted controller relearns them from its first pass).

A gap that is not a finite positive number, or reported for something that is not a phase, is
ignored. Cost: one dict lookup per reported phase per rank per pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import Phase
from orchestrator.plan.restart_paths import PROBE_AFTER_POLLS

from .liveness import RankView

# Exiting saves a final checkpoint when killed or at the time budget: the allowance of a save.
_PHASE_KEY = {
    Phase.INIT.value: "init",
    Phase.STEP.value: "step",
    Phase.CHECKPOINT.value: "checkpoint",
    Phase.EVAL.value: "eval",
    Phase.EXITING.value: "checkpoint",
}


@dataclass
class PhaseTimeouts:
    floors: dict[str, float]  # per phase: learned limits never go below
    unlearned: dict[str, float]  # per phase: the limit until a gap of that phase is reported
    factor: float
    cap: float
    longest_gap: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_watchdog(cls, watchdog: Any) -> PhaseTimeouts:
        floors = watchdog.progress_floor_seconds
        return cls(
            floors={phase: float(getattr(floors, key)) for phase, key in _PHASE_KEY.items()},
            unlearned={
                phase: float(getattr(watchdog, f"{key}_timeout_seconds")) for phase, key in _PHASE_KEY.items()
            },
            factor=float(watchdog.progress_factor),
            cap=float(watchdog.progress_cap_seconds),
        )

    def timeout(self, phase: str) -> float:
        if phase not in self.floors:
            phase = Phase.STEP.value
        gap = self.longest_gap.get(phase)
        if gap is None:
            return self.unlearned[phase]
        return min(self.cap, max(self.floors[phase], self.factor * gap))

    def observe(self, phase: Any, seconds: Any) -> bool:
        """One reported gap; True when it is the longest of its phase so far."""
        if phase not in self.floors or isinstance(seconds, bool):
            return False
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            return False
        if not math.isfinite(value) or value <= 0 or value <= self.longest_gap.get(phase, 0.0):
            return False
        self.longest_gap[phase] = value
        return True

    def learn(self, views: Iterable[RankView]) -> None:
        """Fold in the longest gaps the current launch's ranks report (all of them: a gap comes
        from work done, never from a rank that is stuck now). `views`: those whose reported gaps
        may have changed since the last pass (Liveness.gaps_changed) is enough."""
        longest = self.longest_gap
        for view in views:
            gaps = view.beat.mark_gaps
            if gaps:
                for phase, seconds in gaps.items():
                    if seconds > longest.get(phase, 0.0):
                        self.observe(phase, seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "longest_gap": dict(self.longest_gap),
            "timeouts": {phase: round(self.timeout(phase), 3) for phase in self.floors},
        }


def silent_after(watchdog: Any) -> float:
    """How long a beat may stay unchanged before the rank counts as silent: no hang verdict on it
    then (its progress cannot be seen; dead_after decides), and its progress timer starts again
    when its beats come back. Two beats and two passes: one late beat is not silence."""
    return min(watchdog.dead_after_seconds, 2 * (watchdog.heartbeat_seconds + watchdog.poll_seconds))


def probe_after(watchdog: Any) -> float:
    """How long a whole node may be quiet before the controller asks it (probing.py): a beat late by
    half a pass more than the pass that sees it (a beat's age, seen at pass resolution, stays under
    heartbeat + poll while it beats). Asked then, a frozen node is known within 30 s at BLOOM's
    10 s beats and 5 s passes (17.5 s, the next pass, the step), a lost one a probe timeout later;
    what it answers this early, unless "lost", is asked again at `silent_after`."""
    return min(silent_after(watchdog), watchdog.heartbeat_seconds + PROBE_AFTER_POLLS * watchdog.poll_seconds)
