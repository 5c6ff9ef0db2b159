"""metrics.jsonl, followed: each pass reads only the lines written since the last one (the file
grows for months and is never read whole), and keeps the recent history of the current lineage,
what the training-health rules need.

    follower = MetricsFollower(paths.metrics, keep)
    new = follower.poll(judged_offset)   # the steps written since the last poll
    follower.history                     # the lineage's last `keep` steps (these included)
    follower.offset                      # where the next poll starts (state.json keeps it)

First poll: from `judged_offset` (state.json's `metrics_offset`, where the last controller stopped
judging), else from the file's end (a controller new to a run judges what is written from then
on). The history before that point is read back once, in bounded chunks, so that the first steps
judged have their windows. A file replaced, truncated, or rewritten so that the offset no longer
falls at a line's start is followed again from its start.
Cost per pass: one open and fstat, and the bytes written since (at most MAX_READ_BYTES; more
waits for the next pass).
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.contract import StepMetrics
from orchestrator.contract.metrics import read_metrics_from
from orchestrator.contract.training_health import lineage

MAX_READ_BYTES = 4 << 20
PRIME_BYTES_PER_STEP = 512  # a metrics line is ~300 bytes (more with many DP replicas' losses)
MAX_PRIME_BYTES = 64 << 20


class MetricsFollower:
    def __init__(self, path: Path, keep: int):
        self.path, self.keep = Path(path), keep
        self.offset: int | None = None  # None: not started
        self.identity: tuple[int, int] | None = None
        self.history: list[StepMetrics] = []

    def poll(self, judged_offset: int | None) -> list[StepMetrics]:
        if self.offset is None:
            self._start(judged_offset)
        assert self.offset is not None
        chunk = read_metrics_from(self.path, self.offset, MAX_READ_BYTES)
        if chunk.identity is None:
            return []  # not written yet (or moved away): nothing new
        if chunk.identity != self.identity or chunk.size < self.offset or not chunk.aligned:
            self.identity, self.offset, self.history = chunk.identity, 0, []  # a new file
            chunk = read_metrics_from(self.path, 0, MAX_READ_BYTES)
        self.offset = chunk.end
        self._extend(chunk.records)
        return chunk.records

    def _start(self, judged_offset: int | None) -> None:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self.offset = 0
            return
        self.identity = (info.st_dev, info.st_ino)
        judged = judged_offset is not None and 0 <= judged_offset <= info.st_size
        end = judged_offset if judged else info.st_size
        span = PRIME_BYTES_PER_STEP * self.keep
        while True:
            start = max(0, end - span)
            chunk = read_metrics_from(self.path, start, end - start)
            if len(chunk.records) >= self.keep or start == 0 or span >= MAX_PRIME_BYTES:
                break
            span *= 4
        self._extend(chunk.records)
        self.offset = end if judged else chunk.end

    def _extend(self, records: list[StepMetrics]) -> None:
        lineage(records, self.history)
        if len(self.history) > self.keep + self.keep // 2:  # trimmed now and then, not every pass
            del self.history[: len(self.history) - self.keep]
