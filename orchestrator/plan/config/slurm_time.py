"""SLURM's time values (`--time`), read and written in one place.

sbatch accepts six forms: `minutes`, `minutes:seconds`, `hours:minutes:seconds`, `days-hours`,
`days-hours:minutes` and `days-hours:minutes:seconds` (with a day part, two numbers are hours and
minutes, not minutes and seconds). The config takes any of them and keeps one canonical form,
`HH:MM:SS` with as many hours as it takes (`100:00:00`, as BLOOM's jobs asked; sbatch takes it),
so that everything downstream (the #SBATCH line, the planner, the simulation, the mocked SLURM)
reads one shape.
"""

from __future__ import annotations

import re

FORMS = "minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 90, 100:00:00, 4-04:00)"
_WITH_DAYS = re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?")
_CLOCK = re.compile(r"(\d+)(?::(\d+))?(?::(\d+))?")


class SlurmTimeError(ValueError):
    pass


def slurm_time_seconds(text: str) -> int:
    """Seconds of a SLURM time value in any of its forms; SlurmTimeError names the forms."""
    value = str(text).strip()
    days_match = _WITH_DAYS.fullmatch(value)
    if days_match:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in days_match.groups())
        return _checked(value, days * 86400 + hours * 3600 + minutes * 60 + seconds, minutes, seconds)
    clock = _CLOCK.fullmatch(value)
    if clock:
        parts = [int(g) for g in clock.groups() if g is not None]
        if len(parts) == 1:
            return _checked(value, parts[0] * 60)
        if len(parts) == 2:
            return _checked(value, parts[0] * 60 + parts[1], parts[1])
        return _checked(value, parts[0] * 3600 + parts[1] * 60 + parts[2], parts[1], parts[2])
    raise SlurmTimeError(f"{text!r} is not a SLURM time: use {FORMS}")


def _checked(text: str, total: int, *below_sixty: int) -> int:
    if any(part >= 60 for part in below_sixty):
        raise SlurmTimeError(f"{text!r}: minutes and seconds after the first field must be below 60")
    if total <= 0:
        raise SlurmTimeError(f"{text!r}: a time limit must be longer than zero")
    return total


def slurm_time(seconds: float) -> str:
    """Seconds as the canonical `HH:MM:SS` (hours unbounded), rounded up to the second."""
    total = int(-(-seconds // 1))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def normalise_slurm_time(text: str) -> str:
    return slurm_time(slurm_time_seconds(text))
