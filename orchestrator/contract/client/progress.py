"""Fine progress: the units of work this process finishes (orchestrator.contract.Mark), counted for
the heartbeat (Heartbeat.progress_count / progress_unit / mark_gaps).

A step is not atomic: a BLOOM stage does 128 micro-batches forward and backward per step, then a
reduce and an optimizer step. A rank that finished none of these for a few times the longest
honest gap between two of them is stuck, whatever its step time. Hooks call `mark()`:
trainer/engine.py (pipeline instructions), trainer/progress_io.py (checkpoint bytes written,
read and hashed), trainer/checkpoint_format.py (barriers), every collective (`waited`: the tensor-
parallel ones in trainer/parallel/, DeepSpeed's through trainer/engine.install_collective_waits);
the heartbeat thread reads `COUNTER`.

Cheap by construction (bench/progress_counting.py measures it): one `time.monotonic()` call, a
few attribute stores and `next()` on an itertools.count per mark, no lock. `next()` on a count is
atomic under the GIL, so the count never goes back when the async checkpoint writer marks from its
thread; the other fields are single stores a reader may see one mark late.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.contract import Mark, Phase


class ProgressCounter:
    """Marks done by this process, the last one's kind and time, and per phase the longest gap
    between two marks (a gap that began with a WAIT is the peers' time, not counted)."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)
        self.count = 0
        self.unit: Mark | None = None
        self.last_monotonic = time.monotonic()
        # Wall time = monotonic + this offset, fixed once: a stuck rank's last-mark time never
        # jitters between two reads (the controller judges by change).
        self._wall_offset = time.time() - self.last_monotonic
        self.phase = Phase.INIT.value
        self.gaps: dict[str, float] = {}

    def mark(self, unit: Mark) -> None:
        now = time.monotonic()
        if self.unit is not Mark.WAIT:
            gap = now - self.last_monotonic
            phase = self.phase
            if gap > self.gaps.get(phase, 0.0):
                self.gaps[phase] = gap
        self.last_monotonic = now
        self.unit = unit
        self.count = next(self._ticks)

    def begin_phase(self, phase: Phase) -> None:
        """The gap up to here belongs to the phase that ends; the ones after, to `phase`."""
        self.mark(Mark.PHASE)
        self.phase = Phase(phase).value

    def last_mark_time(self) -> float:
        """Wall-clock time of the last mark (derived: a mark takes one clock call)."""
        return self.last_monotonic + self._wall_offset

    @property
    def unit_name(self) -> str:
        unit = self.unit
        return unit.value if unit is not None else ""


COUNTER = ProgressCounter()  # one per process: hooks everywhere bump it, the heartbeat reads it
mark = COUNTER.mark


@contextmanager
def waiting() -> Iterator[None]:
    """Around a point where this rank waits for its peers (a barrier, a gather): the beat says
    `wait` meanwhile, and the unit it was working in comes back (as a mark) when the wait ends.
    A wait inside a wait (a DeepSpeed collective, trainer/engine.install_collective_waits, inside one
    of ours) is the same wait: no marks, so the outer one still says `wait` after the inner ends."""
    before = COUNTER.unit
    if before is Mark.WAIT:
        yield
        return
    COUNTER.mark(Mark.WAIT)
    try:
        yield
    finally:
        COUNTER.mark(before if before is not None else Mark.PHASE)


def waited(call, *args, **kwargs):
    """`call(*args, **kwargs)` as a wait for the peers: a collective (all-reduce, all-gather,
    reduce-scatter, broadcast, send/recv, barrier). A rank inside one waits for the rank that has not
    entered it yet, and must not look like a rank stuck in its own work. `waiting()` as a plain
    function: two marks and no generator frame, so that the ~20 collectives of a micro-batch's
    forward and backward cost well under 1% of the step (bench/progress_counting.py)."""
    counter = COUNTER
    before = counter.unit
    if before is Mark.WAIT:
        return call(*args, **kwargs)
    counter.mark(Mark.WAIT)
    try:
        return call(*args, **kwargs)
    finally:
        counter.mark(before if before is not None else Mark.PHASE)


def sha256_counted(path: Path, unit: Mark, chunk: int = 1 << 22) -> str:
    """The file's sha256 (what orchestrator.contract.sha256_file computes), a mark per chunk:
    hashing a checkpoint's files is part of its save (SAVE_BYTES) or its load (LOAD_BYTES)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
            mark(unit)
    return digest.hexdigest()
