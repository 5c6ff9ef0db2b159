"""A robust local trend at the step after a window of a series, and the robust spread of the
window's noise.

The trend at step t, from the `window` values before it:
- level: the median of the newest max(5, window // 20) values, at their median step;
- slope: the line through the (median step, median value) points of the window's last two quarters
  (groups of max(min(10, window // 2), window // 4) values: Brown and Mood's two-group resistant
  line);
- trend(t) = level + slope x (t - the level's step).
Fewer than half the values of a group can be anything (a spike, bad batches) without moving it. The level is
taken close to t because a loss curve bends: a straight line fitted over the whole window and
extrapolated lies below a steep, flattening descent (the loss after warm-up) by about
f''/2 x (distance to its older anchor) x (distance to its newer anchor), several noise widths;
from the newest values, the bend costs f'' x ~6 steps x the distance between the slope's and the
level's centres. The price is noise: the level, a median of 5 values, carries about 0.55 of the
noise's standard deviation. A median ignores spiking steps that are fewer than half its values:
a spike of 4 steps must not tilt the slope of the windows after it (a tilted slope would put the
trend below the clean steps that follow).

The spread: the noise's standard deviation, estimated from the window's first differences:
1.4826 x MAD(differences) / sqrt(2) (for independent normal noise, a difference has sqrt(2) x its
standard deviation). A smooth trend shifts every difference by the same slope, which the median
removes; its bend barely moves them; a spike or a hard batch spoils two differences only.

The slope of the whole window (`TrendFit.window_slope`, what the divergence rule reads): the
resistant line through the medians of the window's two halves.

Cost: the groups' medians come from sorted groups kept as the window slides (`SlidingTrend`: a
bisect insert and delete per group a step, O(log W) compares and O(W) memmove in C); the spread is
O(W log W) and is computed only for a value already above the trend plus the caller's floor.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

NORMAL_MAD_SCALE = 1.4826  # sigma = 1.4826 x MAD for normal noise


@dataclass(frozen=True)
class TrendFit:
    """The trend line (through (level_step, level) with `slope` per step), the spread of the noise,
    and the slope of the whole window."""

    level_step: float
    level: float
    slope: float
    spread: float
    window_slope: float
    window_steps: tuple[int, int]  # the first and last step of the window it was fitted on

    def at(self, step: float) -> float:
        return self.level + self.slope * (step - self.level_step)

    def window_line_at(self, step: float) -> float:
        """The whole window's resistant line, through its middle (level, step) point."""
        first, last = self.window_steps
        return (
            self.level
            + self.slope * ((first + last) / 2.0 - self.level_step)
            + self.window_slope * (step - (first + last) / 2.0)
        )


def _median_of_sorted(values: Sequence[float]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2.0


def level_count(window: int) -> int:
    """Values of the level: a median of at least 5 ignores 2 spiking steps among them."""
    return max(5, window // 20)


def slope_group_count(window: int) -> int:
    """Values of each of the slope's two groups: a quarter of the window, and 10 where the window
    has room (a median of 10 ignores a spike of 4 steps; of 5, a window of 10's halves, 2 steps)."""
    return max(min(10, window // 2), window // 4)


class SlidingTrend:
    """The resistant trend of the `window` values before index i, for i = window, window + 1, ...

    `advance()` moves the window on by one value; `trend_at(step)` is the trend there (cheap);
    `fit()` adds the spread and the whole window's slope."""

    def __init__(self, steps: Sequence[int], values: Sequence[float], window: int) -> None:
        if window < 10:
            raise ValueError(
                f"a trend window needs at least 10 values (two groups of 5 for its slope), got {window}"
            )
        self.steps, self.values, self.window = steps, values, window
        slope_group = slope_group_count(window)
        # (lo, hi) of each group, relative to the window's start: the slope's older and newer group
        # (the window's quarters 3 and 4), the level's values
        self.groups = (
            (window - 2 * slope_group, window - slope_group),
            (window - slope_group, window),
            (window - level_count(window), window),
        )
        self.sorted = [sorted(values[lo:hi]) for lo, hi in self.groups]
        self.start = 0  # the window is values[start : start + window]

    def _point(self, group: int) -> tuple[float, float]:
        lo, hi = self.groups[group]
        first, count = self.start + lo, hi - lo
        middle = first + count // 2
        step = self.steps[middle] if count % 2 else (self.steps[middle - 1] + self.steps[middle]) / 2.0
        return step, _median_of_sorted(self.sorted[group])

    def _line(self) -> tuple[float, float, float]:
        (s3, v3), (s4, v4), (level_step, level) = self._point(0), self._point(1), self._point(2)
        return level_step, level, (v4 - v3) / (s4 - s3)

    def trend_at(self, step: float) -> float:
        level_step, level, slope = self._line()
        return level + slope * (step - level_step)

    def fit(self) -> TrendFit:
        first, last = self.start, self.start + self.window
        level_step, level, slope = self._line()
        values, steps = self.values[first:last], self.steps[first:last]
        differences = [b - a for a, b in pairwise(values)]
        center = median(differences)
        spread = NORMAL_MAD_SCALE * median(abs(d - center) for d in differences) / math.sqrt(2.0)
        half = self.window // 2
        older, newer = sorted(values[:half]), sorted(values[half:])
        old_step = median(steps[:half])
        new_step = median(steps[half:])
        window_slope = (_median_of_sorted(newer) - _median_of_sorted(older)) / (new_step - old_step)
        return TrendFit(level_step, level, slope, spread, window_slope, (steps[0], steps[-1]))

    def advance(self) -> None:
        """Slide by one: each group's oldest value leaves it, the next value enters it."""
        for (lo, hi), group in zip(self.groups, self.sorted, strict=True):
            del group[bisect.bisect_left(group, self.values[self.start + lo])]
            bisect.insort(group, self.values[self.start + hi])
        self.start += 1
