"""Per-phase no-progress timeouts, learned from reported durations, with floors and caps.

A rank that beats but does not progress is hung only once it has been stalled longer than the
timeout of the phase it says it is in. A checkpoint save legitimately stalls progress for minutes,
a step for seconds: one timeout for both would either miss hangs or kill healthy saves. So each
phase has its own timeout:

    timeout(phase) = min(CAP_OVER_FLOOR x floor, max(floor, factor x longest duration observed))

Where the durations come from, and only from there:
- step: `extra.step_seconds` of a beat, the duration of the last step(s) between two progress
  updates with nothing else in between (trainer/heartbeat.py). Never the time between two phase
  changes: before a save comes a stretch of 100 steps, and counting it as one "step" (10,500 s at
  BLOOM's 105 s steps) once raised the step timeout to 14.6 h;
- init, checkpoint, eval: `extra.durations`, the longest completed one of each, per phase.
A duration that is not a finite positive number is ignored. The cap keeps one outlier (a step
slowed by a filesystem stall) from switching hang detection off: at most 4x the configured floor.
Learning is per job: the supervisor starts a new `PhaseTimeouts` for every job it supervises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.protocol import Phase

CAP_OVER_FLOOR = 4.0

# Exiting saves a final checkpoint when killed or at the time budget: same allowance as a save.
_FLOOR_FIELD = {
    Phase.INIT.value: "init_timeout_seconds",
    Phase.STEP.value: "step_timeout_seconds",
    Phase.CHECKPOINT.value: "checkpoint_timeout_seconds",
    Phase.EVAL.value: "eval_timeout_seconds",
    Phase.EXITING.value: "checkpoint_timeout_seconds",
}


@dataclass
class PhaseTimeouts:
    floors: dict[str, float]
    factor: float
    observed_max: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_watchdog(cls, watchdog: Any, observed: dict[str, float] | None = None) -> PhaseTimeouts:
        floors = {phase: float(getattr(watchdog, name)) for phase, name in _FLOOR_FIELD.items()}
        timeouts = cls(floors=floors, factor=float(watchdog.timeout_factor))
        for phase, seconds in (observed or {}).items():
            timeouts.observe(phase, seconds)
        return timeouts

    def timeout(self, phase: str) -> float:
        floor = self.floors.get(phase, self.floors[Phase.STEP.value])
        learned = self.factor * self.observed_max.get(phase, 0.0)
        return min(CAP_OVER_FLOOR * floor, max(floor, learned))

    def observe(self, phase: str, seconds: Any) -> bool:
        """Record one completed phase; True when it raised that phase's learned maximum."""
        if phase not in self.floors or isinstance(seconds, bool):
            return False
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            return False
        if not math.isfinite(value) or value <= 0:
            return False
        if value > self.observed_max.get(phase, 0.0):
            self.observed_max[phase] = value
            return True
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "observed_max": dict(self.observed_max),
            "timeouts": {phase: round(self.timeout(phase), 3) for phase in self.floors},
        }


def learn_from_beat(timeouts: PhaseTimeouts, beat: dict[str, Any] | None) -> list[str]:
    """Update the learned maxima from what one beat reports; returns the phases that grew."""
    if not beat:
        return []
    extra = beat.get("extra")
    if not isinstance(extra, dict):
        return []
    grown: list[str] = []
    if timeouts.observe(Phase.STEP.value, extra.get("step_seconds")):
        grown.append(Phase.STEP.value)
    durations = extra.get("durations")
    if isinstance(durations, dict):
        for phase, seconds in durations.items():
            if phase != Phase.STEP.value and timeouts.observe(str(phase), seconds):
                grown.append(str(phase))
    return grown
