"""Per-phase no-progress timeouts, learned from observed durations with floors from the config.

A rank that beats but does not progress is hung only once it has been stalled longer than the
timeout of the phase it says it is in. A checkpoint save legitimately stalls progress for minutes,
a step for seconds: one timeout for both would either miss hangs or kill healthy saves. So each
phase has its own timeout: `max(floor from config, factor x longest duration observed so far)`.

Durations come from two sources, whichever the trainer offers:
- `heartbeat.extra["durations"]`: {phase: seconds of the last completed one} (exact);
- phase transitions seen between two supervision passes (a lower bound of the real duration,
  which is the safe direction only because the floor still applies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.protocol import Phase

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
        return cls(floors=floors, factor=float(watchdog.timeout_factor), observed_max=dict(observed or {}))

    def timeout(self, phase: str) -> float:
        floor = self.floors.get(phase, self.floors[Phase.STEP.value])
        learned = self.factor * self.observed_max.get(phase, 0.0)
        return max(floor, learned)

    def observe(self, phase: str, seconds: float) -> bool:
        """Record one completed phase; True when it raised that phase's learned maximum."""
        if seconds <= 0 or phase not in self.floors:
            return False
        if seconds > self.observed_max.get(phase, 0.0):
            self.observed_max[phase] = float(seconds)
            return True
        return False

    def as_dict(self) -> dict[str, Any]:
        return {
            "observed_max": dict(self.observed_max),
            "timeouts": {phase: round(self.timeout(phase), 3) for phase in self.floors},
        }


@dataclass
class PhaseSample:
    """What one reference rank said at one pass: enough to measure durations between passes."""

    phase: str
    phase_started: float
    step: int
    progress_time: float


def learn_from_transition(timeouts: PhaseTimeouts, before: PhaseSample | None, after: PhaseSample) -> list[str]:
    """Update learned maxima from two samples of the same rank; returns the phases that grew."""
    grown: list[str] = []
    if before is None:
        return grown
    if after.phase != before.phase and after.phase_started > before.phase_started:
        # A new phase began since the last pass: the old one lasted at least this long.
        if timeouts.observe(before.phase, after.phase_started - before.phase_started):
            grown.append(before.phase)
    if (
        before.phase == after.phase == Phase.STEP.value
        and after.phase_started <= before.phase_started  # the same stretch of steps, no save between
        and after.step > before.step
        and after.progress_time > before.progress_time
    ):
        per_step = (after.progress_time - before.progress_time) / (after.step - before.step)
        if timeouts.observe(Phase.STEP.value, per_step):
            grown.append(Phase.STEP.value)
    return grown


def learn_from_reported(timeouts: PhaseTimeouts, durations: dict[str, Any] | None) -> list[str]:
    grown: list[str] = []
    for phase, seconds in (durations or {}).items():
        try:
            if timeouts.observe(str(phase), float(seconds)):
                grown.append(str(phase))
        except (TypeError, ValueError):
            continue
    return grown
