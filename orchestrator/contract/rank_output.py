"""The ranks' own lines in a job's output, and the error a failing rank printed.

Every rank writes into the one job output, jobs/slurm-<job_id>.out, through srun --label: the task
number before each line, right-aligned to the width of the largest (` 7: loss 2.31` among 16
tasks). Lines without a label (the batch script's, srun's own) belong to no rank.

When a launch fails, srun says only `task 3: Exited with exit code 1`; the reason is in the rank's
own last lines (its traceback). `find_rank_error` takes the failing task srun named (or, when it
named none, the first rank whose lines hold a traceback) and returns its error line and the lines
before it. A rank that printed no error at all gives none: its last line is only where it was. The output is the job's: it is read through the no-follow reader, its tail only, and
every line is made inert (control characters escaped, bounded length) before it reaches an event,
a screen or a notification.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .files import UntrustedFileError, read_untrusted_tail

LABEL = re.compile(r"^ *(\d+): ?(.*)$")
TRACEBACK = "Traceback (most recent call last):"
# A Python exception's last line: `ValueError: ...`, `torch.OutOfMemoryError: ...`, `KeyboardInterrupt`.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b.*")
# A line that says something failed, from a rank that printed no traceback (a C++ abort, a CUDA
# or NCCL error, a segfault): anything else a rank printed last is only where it was.
FAILURE_LINE = re.compile(
    r"error|fatal|abort|segmentation fault|core dumped|out of memory|terminate called", re.IGNORECASE
)
TAIL_BYTES = 256 * 1024
MAX_LINES = 20
MAX_LINE_CHARS = 300
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class RankError:
    rank: int
    headline: str  # the exception's line, or the rank's last line when it printed none
    lines: tuple[str, ...]  # the traceback (or the last lines), at most MAX_LINES

    def describe(self) -> str:
        return f"rank {self.rank}: {self.headline}"


def labelled_lines(text: str) -> Iterator[tuple[int, str]]:
    """(rank, line without its label) for each labelled line, in order."""
    for line in text.splitlines():
        match = LABEL.match(line)
        if match:
            yield int(match.group(1)), match.group(2)


def rank_lines(text: str, rank: int) -> list[str]:
    """The lines labelled `rank`, without the label."""
    return [line for label, line in labelled_lines(text) if label == rank]


def _inert(line: str) -> str:
    line = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line.rstrip())
    return line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..."


def _error_of(rank: int, lines: list[str]) -> RankError | None:
    """The rank's exception (its last traceback's exception line), else its last line that says
    something failed; None when it printed neither (a rank killed mid-step: its last line is only
    where it was, and would mislead)."""
    lines = [line for line in lines if line.strip()]
    start = max((i for i, line in enumerate(lines) if line.strip() == TRACEBACK), default=None)
    block = (lines[start:] if start is not None else lines)[-MAX_LINES:]
    exceptions = [line for line in block if EXCEPTION_LINE.match(line)]
    failures = [line for line in block if FAILURE_LINE.search(line)]
    headline = exceptions[-1] if exceptions else failures[-1] if failures else None
    if headline is None:
        return None
    return RankError(rank, _inert(headline), tuple(_inert(line) for line in block))


def find_rank_error(text: str, failed_task: str | None) -> RankError | None:
    """The error of the task srun named when it is one task; else of the first rank that printed a
    traceback; None when no rank printed anything useful."""
    by_rank: dict[int, list[str]] = {}
    first_traceback: list[int] = []
    for rank, line in labelled_lines(text):
        by_rank.setdefault(rank, []).append(line)
        if line.strip() == TRACEBACK and rank not in first_traceback:
            first_traceback.append(rank)
    if failed_task is not None and failed_task.isdigit() and int(failed_task) in by_rank:
        found = _error_of(int(failed_task), by_rank[int(failed_task)])
        if found is not None and (found.rank in first_traceback or not first_traceback):
            return found
    for rank in first_traceback:
        return _error_of(rank, by_rank[rank])
    return None


def read_rank_error(output: Path, failed_task: str | None) -> RankError | None:
    """`find_rank_error` over the tail of a job's output; None when it is missing or unreadable."""
    try:
        data, _ = read_untrusted_tail(output, TAIL_BYTES)
    except (FileNotFoundError, UntrustedFileError):
        return None
    return find_rank_error(data.decode("utf-8", errors="replace"), failed_task)
