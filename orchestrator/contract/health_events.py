"""events.jsonl records of training health (orchestrator/contract/training_health.py,
controller/health_policy.py): findings on metrics.jsonl, pauses and rollbacks. Same rules as
events.py (registered by kind on import; the contract package imports this module, so
`read_events` always knows them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .event_base import Event


@dataclass(frozen=True, kw_only=True)
class HealthFinding(Event):
    """A rule of training health held on metrics.jsonl: the numbers a person reads, and the
    policy the config gives that kind of finding."""

    KIND = "health_finding"
    finding: str  # loss_spike, grad_norm_explosion, skip_storm, divergence
    onset_step: int  # the first step of the episode (a rollback goes back before it)
    met_step: int  # the step at which the rule was met
    measured: float  # the loss, grad norm, skipped steps, or the divergence trend at its end
    baseline: float  # what it is compared with: the trend for the trend rules, else the rule's baseline
    limit: float  # the threshold it crossed
    message: str
    policy: str  # notify, pause, rollback
    numbers: dict[str, Any] = field(default_factory=dict)
    # What a trend rule (spike, explosion, divergence) judged: the trend at the onset, its slope per
    # step, the robust spread of the noise around it, the margin above the trend the value had to
    # pass (limit = trend + margin) and the value's distance above the trend in spreads (None:
    # a noiseless window). Log units for the grad-norm rule's slope, spread and margin.
    trend: float | None = None
    trend_slope: float | None = None
    residual_spread: float | None = None
    margin: float | None = None
    spreads: float | None = None


@dataclass(frozen=True, kw_only=True)
class HealthPauseRequested(Event):
    """The trainer is asked to save and stop (accepted/kill); the run then waits for a person."""

    KIND = "health_pause_requested"
    why: str
    job_id: str | None = None  # the job asked to stop (None: none was running)


@dataclass(frozen=True, kw_only=True)
class RollbackPlanned(Event):
    """A rollback was decided: the running job is asked to save and stop, then the directive is
    written to accepted/rollback and the run resubmitted (rollback_started)."""

    KIND = "rollback_planned"
    directive_id: str
    to_step: int
    skip_samples: list[list[int]]
    lr_scale: float
    lr_scale_steps: int
    reason: str
    by: str  # "controller" (the health policy) or the operator who asked
    automatic: bool
    rollbacks_in_window: int = 0  # automatic rollbacks in the budget's window before this one
    job_id: str | None = None  # the job asked to stop (None: none was running)


@dataclass(frozen=True, kw_only=True)
class RollbackRefused(Event):
    """No rollback: the budget is spent, no verified checkpoint is early enough, the run has
    finished, a kill is pending, or a planned one was abandoned (the run was killed meanwhile)."""

    KIND = "rollback_refused"
    why: str
    by: str
    rollbacks_in_window: int = 0


@dataclass(frozen=True, kw_only=True)
class RollbackStarted(Event):
    """The stopped run goes on with the directive in accepted/rollback (a job_submitted follows)."""

    KIND = "rollback_started"
    directive_id: str
    to_step: int


@dataclass(frozen=True, kw_only=True)
class RollbackApplied(Event):
    """Rank 0 of a job says it applied the directive: where it really resumed from."""

    KIND = "rollback_applied"
    directive_id: str
    job_id: str
    resumed_from: int | None = None
