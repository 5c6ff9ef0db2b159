"""The words every event sentence uses: times, durations, host lists, sizes, outcomes, causes,
and the small phrase builders the sentence modules share (orchestrator/views/event_text/)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from orchestrator.contract.codes import ExitCode, Outcome

# A failure's cause (the `cause` of failure, restart and exclusion events), in words.
# What an ended job means for the run, in words (the job table and `job_ended`).
OUTCOME_WORDS = {
    Outcome.FINISHED.value: "finished training",
    Outcome.KILLED.value: "stopped by the kill switch",
    Outcome.TIME_BUDGET.value: "time budget reached, checkpoint saved",
    Outcome.CONFIG_ERROR.value: "config refused by the trainer",
    Outcome.FAILED.value: "failed",
    Outcome.CANCELLED.value: "cancelled",
}


def clock(stamp: float | None, now: float | None = None) -> str:
    """Local time of day, with the date when it is not `now`'s day."""
    if stamp is None:
        return "--:--"
    when = time.localtime(stamp)
    today = time.localtime(time.time() if now is None else now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M", when)
    return time.strftime("%m-%d %H:%M", when)


def duration(seconds: float | None) -> str:
    """212 s, 14 min, 3.0 h, 2.5 days."""
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 600:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def hosts(names: Iterable[str]) -> str:
    """node[01-03,17] (SLURM's compressed form), or "none"."""
    from orchestrator.slurm.hostlist import compress_hostlist  # noqa: PLC0415

    names = [str(n) for n in names]
    if not names:
        return "none"
    try:
        return compress_hostlist(names)
    except ValueError:  # a name no host list can hold ("[", ","): shown as it is
        return ", ".join(names)


def size(num_bytes: int | None) -> str:
    if num_bytes is None:
        return "?"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


def outcome_words(outcome: str | None, exit_code: int | None = None) -> str:
    """`failed` with exit 1 -> "failed (exit 1)"; a controller's own outcome text stays as it is."""
    if not outcome:
        return ""
    words = OUTCOME_WORDS.get(outcome, outcome)
    if outcome == Outcome.FAILED.value and exit_code is not None:
        words = ExitCode.describe(exit_code) if exit_code else "failed (exit 0)"
    return words


def _by(user: str | None) -> str:
    return f" by {user}" if user else ""


def _reason(reason: str | None) -> str:
    return f": {reason}" if reason else ""


def _n(value: object) -> str:
    return "?" if value is None else str(value)


def _step(step: int | None) -> str:
    return f"step {step}" if step is not None else "an unknown step"


def _g(value: float | None) -> str:
    return "?" if value is None else f"{value:.4g}"


def _ranges(ranges: list | None) -> str:
    """Sample ranges as start:end, the way `runctl rollback --skip-samples` takes them."""
    out = [f"{r[0]}:{r[1]}" if isinstance(r, (list, tuple)) and len(r) == 2 else str(r) for r in ranges or []]
    return ", ".join(out[:4]) + (f" (+{len(out) - 4} more)" if len(out) > 4 else "") or "none"


def _job(job_id: str | None) -> str:
    return f"job {job_id}" if job_id else "no running job"


def _nodes(nodes: list[str] | None) -> str:
    nodes = list(nodes or [])
    return ", ".join(nodes[:8]) + (f" (+{len(nodes) - 8} more)" if len(nodes) > 8 else "") or "none"
