"""The checkpoint-interval directive: the controller's re-fitted interval, for the trainer's next save.

    accepted/checkpoint_interval   written by the owner's controller only (accepted/ is owner-only)

With `checkpoint.adaptive_interval: apply` the controller re-fits the Young/Daly interval from the
failures the run has seen and its measured save stall (orchestrator/controller/interval.py) and
writes an `IntervalDirective`; rank 0 of the trainer reads it after each save (and at its start)
and saves next after that many hours. Read like the rollback directive (contract/directive.py): a
run directory is shared, so the file is hostile input until proven otherwise: never through a
symlink, a regular file of bounded size written by the run's owner, every field checked. The
trainer also keeps the value within the config's [min_interval_hours, max_interval_hours]: a
directive can move the interval, never switch checkpoints off.
Also the event the controller records with every fit that moves the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .directive import VERSION, DirectiveError, _float, _text, _version, read_owner_json
from .event_base import Event
from .files import atomic_write_json
from .paths import RunPaths

INTERVAL_DIRECTIVE = "checkpoint_interval"


@dataclass(frozen=True)
class IntervalDirective:
    interval_hours: float
    decided_at: float  # the controller's wall clock
    reason: str

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_hours) and self.interval_hours > 0):
            raise DirectiveError(
                f"checkpoint_interval.interval_hours: expected a positive finite number, got {self.interval_hours!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "interval_hours": self.interval_hours, "decided_at": self.decided_at,
                "reason": self.reason}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> IntervalDirective:
        what = "accepted/checkpoint_interval"
        data = _version(data, what)
        unknown = set(data) - {"version", "interval_hours", "decided_at", "reason"}
        if unknown:
            raise DirectiveError(
                f"{what}: unknown field(s) {sorted(unknown)[:5]}: written by a newer controller?"
            )
        return cls(
            _float(data, "interval_hours", what),
            _float(data, "decided_at", what),
            _text(data, "reason", what),
        )


def interval_directive_path(paths: RunPaths):
    return paths.accepted_request(INTERVAL_DIRECTIVE)


def read_interval_directive(paths: RunPaths, owner_uid: int | None = None) -> IntervalDirective | None:
    """None when absent; DirectiveError when it is not the owner's regular file or malformed."""
    data = read_owner_json(interval_directive_path(paths), "accepted/checkpoint_interval", owner_uid)
    return None if data is None else IntervalDirective.from_dict(data)


def write_interval_directive(paths: RunPaths, directive: IntervalDirective) -> None:
    """The controller's side: atomically, 0644, in the owner-only accepted/."""
    paths.accepted.mkdir(mode=0o755, exist_ok=True)
    atomic_write_json(interval_directive_path(paths), directive.to_dict(), mode=0o644)


def bounded_interval(directive_hours: float, low: float, high: float) -> float:
    """What the trainer uses: the directive's value inside the config's bounds."""
    return min(max(directive_hours, low), high)


@dataclass(frozen=True, kw_only=True)
class CheckpointIntervalFit(Event):
    """The controller re-fitted the checkpoint interval (Young/Daly) from the run's own failures."""

    KIND = "checkpoint_interval_fit"
    adaptive_mode: str  # suggest | apply
    interval_hours: float  # proposed (suggest) or applied (apply), within the config's bounds
    previous_hours: float
    young_daly_hours: float  # before the bounds
    failures: int
    exposure_hours: float  # training time the failures were counted over
    prior_job_mtbf_hours: float
    posterior_job_mtbf_hours: float
    save_stall_seconds: float
    evidence: str  # why the prior was left (or "prior": the fit at the prior's rate)
