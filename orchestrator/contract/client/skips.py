"""Sample positions a run never trains on: the rollback's exact data skip (docs/data.md, section 6).

Positions are those of the GLOBAL sample order: the order the data index serves (position p is
`dataset[p]`, whatever shuffle_idx maps it to), the unit of `consumed_samples`. `SampleSkips` is a
sorted list of disjoint half-open ranges [start, end) of them; the kept positions, in their
original order, are the stream the sampler cuts into micro-batches. Two maps connect the two
numberings (k-th kept sample <-> its position), each a binary search over the ranges.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence


class SampleSkips:
    def __init__(self, ranges: Iterable[Sequence[int]] = ()) -> None:
        merged: list[list[int]] = []
        for start, end in sorted((int(a), int(b)) for a, b in ranges):
            if not 0 <= start < end:
                raise ValueError(f"skip range [{start}, {end}) must have 0 <= start < end")
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.ranges: tuple[tuple[int, int], ...] = tuple((a, b) for a, b in merged)
        self._starts = [a for a, _ in self.ranges]
        # _kept_at_start[i]: kept positions below ranges[i]'s start
        self._kept_at_start: list[int] = []
        self._skipped_through: list[int] = []  # skipped positions of ranges[0..i]
        skipped = 0
        for start, end in self.ranges:
            self._kept_at_start.append(start - skipped)
            skipped += end - start
            self._skipped_through.append(skipped)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __repr__(self) -> str:
        return f"SampleSkips({[list(r) for r in self.ranges]})"

    def skipped_below(self, position: int) -> int:
        """Skipped positions p < position."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index < 0:
            return 0
        start, end = self.ranges[index]
        return self._skipped_through[index] - (end - start) + min(end, position) - start

    def kept_below(self, position: int) -> int:
        """Kept positions p < position: the index, in the kept stream, of the first kept p >= position."""
        return position - self.skipped_below(position)

    def position_of(self, kept_index: int) -> int:
        """The position of the kept_index-th kept sample (0-based)."""
        if kept_index < 0:
            raise ValueError(f"kept index {kept_index} < 0")
        # Ranges 0..index start at or before this kept sample (the ranges are merged, so the
        # position right after one is kept): it lies after all of them.
        index = bisect.bisect_right(self._kept_at_start, kept_index) - 1
        return kept_index + (self._skipped_through[index] if index >= 0 else 0)

    def advance(self, position: int, count: int) -> int:
        """The data position after taking the next `count` kept samples from `position`: one past
        the last one taken (so the skipped ranges passed over count, those ahead do not)."""
        if count <= 0:
            return position
        return self.position_of(self.kept_below(position) + count - 1) + 1

    def kept_between(self, start: int, end: int) -> int:
        return max(0, self.kept_below(end) - self.kept_below(start))

    def from_position(self, position: int) -> SampleSkips:
        """The parts of these ranges at or after `position` (what can still be skipped there)."""
        return SampleSkips((max(a, position), b) for a, b in self.ranges if b > position)

    def union(self, other: SampleSkips | Iterable[Sequence[int]]) -> SampleSkips:
        theirs = other.ranges if isinstance(other, SampleSkips) else tuple(other)
        return SampleSkips([*self.ranges, *theirs])

    def as_lists(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]
