"""Checks of one JSON value another program wrote. Python's bool is an int (`isinstance(True, int)`)
and JSON has one number type, so a `true` must never pass for a count, a step or a time, and a
NaN or an infinity (which Python's json reads) never for a time."""

from __future__ import annotations

import math
from typing import Any

# A SLURM node name (or a bracketed host range): what the exclude list and `--exclude` accept.
SLURM_NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_\-]*(\[[0-9,\-]+\])?$"


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def int_or_none(value: Any) -> int | None:
    return value if is_int(value) else None


def number_or_none(value: Any) -> float | None:
    return float(value) if is_number(value) else None
