"""Supervision: pure functions from what the controller saw of the ranks to findings.

Nothing here writes a file or calls the scheduler, so every rule is testable with plain data, and
one pass over 16,384 ranks stays well under a second (the benchmark in bench/ measures it).

Every duration below is measured on the controller's own monotonic clock, from when it saw a
rank's beat or progress *change* (liveness.py); no node's clock is ever compared with the login
node's. Rules, for the ranks of the current incarnation of the job that is running now:
- dead rank: its beat has not changed for `watchdog.dead_after_seconds` (crash, SIGSTOP, lost node);
- missing rank: the job has been seen running for longer than the init timeout and the rank never
  beat;
- hang: the rank beats but its progress has not changed for longer than the timeout of its phase
  (learned per phase, see timeouts.py), e.g. stuck in a collective waiting for a dead peer.
One incident is one incident: when at least half of the ranks are dead at once, the job, the
filesystem or the network is suspected, not N nodes (`Assessment.job_wide`), and the nodes blamed
by one incident are capped (`culprit_nodes`).
How a job ended is classified by the contract's `classify_end` (re-exported here).
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.protocol import Outcome, Phase, classify_end  # noqa: F401 - re-exported

from .liveness import RankView
from .timeouts import PhaseTimeouts

HEARTBEAT_MAX_BYTES = 1 << 16  # a beat is ~600 bytes; anything bigger is not one


class FindingKind(str, enum.Enum):
    DEAD_RANK = "dead_rank"
    MISSING_RANK = "missing_rank"
    HANG = "hang"


@dataclass
class Finding:
    kind: FindingKind
    rank: int
    host: str
    phase: str
    step: int
    age_seconds: float  # how long without a beat change (dead) or without progress (hang)
    limit_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "rank": self.rank,
            "host": self.host,
            "phase": self.phase,
            "step": self.step,
            "age_seconds": round(self.age_seconds, 3),
            "limit_seconds": round(self.limit_seconds, 3),
        }


@dataclass
class Assessment:
    """The result of one pass over the current job's ranks."""

    job_id: str | None
    ranks_seen: int
    world_size: int = 0
    findings: list[Finding] = field(default_factory=list)
    min_step: int | None = None
    max_step: int | None = None
    # The lowest rank's beat: its reported durations feed the learned timeouts.
    reference: dict[str, Any] | None = None
    # Per host: seconds since its stalest rank's beat changed (for the dashboard's grid).
    host_beat_age: dict[str, float] = field(default_factory=dict)

    @property
    def dead(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in (FindingKind.DEAD_RANK, FindingKind.MISSING_RANK)]

    @property
    def hung(self) -> list[Finding]:
        return [f for f in self.findings if f.kind is FindingKind.HANG]

    @property
    def job_wide(self) -> bool:
        """At least half of the ranks dead at once: a job, filesystem or network incident."""
        return bool(self.dead) and 2 * len(self.dead) >= max(1, self.world_size)

    def culprits(self) -> list[Finding]:
        """The ranks to blame. Dead ranks when there are any (the others hang because they wait
        for them), unless the stall is job-wide. In a pure hang, the ranks furthest behind are
        the suspects, but only when some ranks are ahead of them (otherwise nobody can be
        singled out)."""
        if self.dead:
            return [] if self.job_wide else self.dead
        hung = self.hung
        if not hung or self.min_step is None or self.min_step == self.max_step:
            return []
        return [f for f in hung if f.step == self.min_step]


def culprit_nodes(nodes: list[str], cap: int) -> tuple[list[str], str | None]:
    """The nodes one incident may exclude: all of them when they are at most `cap`, else none,
    with the reason (so many nodes failing at once points at something they share)."""
    unique = sorted({n for n in nodes if n})
    if len(unique) <= cap:
        return unique, None
    return [], (
        f"{len(unique)} nodes look bad in one incident, more than watchdog.max_excluded_per_incident={cap}: "
        "suspecting the job, the filesystem or the network instead; no node excluded"
    )


def stale_hosts(job_beats: list[dict[str, Any]], margin: float) -> list[str]:
    """Hosts whose newest beat is more than `margin` seconds older than the median host's newest:
    the node that went first when SLURM reports only that the job ended NODE_FAIL. This compares
    node clocks with each other (skewed by at most a minute or so, so margin must be well above
    that), never with the login node's."""
    newest: dict[str, float] = {}
    for beat in job_beats:
        stamp = beat.get("beat_time")
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
            host = str(beat.get("host", ""))
            newest[host] = max(newest.get(host, float("-inf")), float(stamp))
    if len(newest) < 2:
        return []
    ordered = sorted(newest.values())
    median = ordered[len(ordered) // 2]
    return sorted(host for host, stamp in newest.items() if median - stamp > margin)


def read_heartbeats(directory: Path) -> list[dict[str, Any]]:
    """Every rank's last beat as a dict. A file caught mid-replace, torn, too big, not a regular
    file or not a JSON object is skipped (beats are written atomically, so that only happens for a
    file being deleted, or for something that is not a beat)."""
    # os.open with dir_fd and one os.read: about twice as fast as open()/scandir for 16k files.
    beats: list[dict[str, Any]] = []
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return beats
    loads = json.loads
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        for name in os.listdir(dir_fd):
            if not name.startswith("rank-") or not name.endswith(".json"):
                continue
            try:
                fd = os.open(name, flags, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                data = loads(os.read(fd, HEARTBEAT_MAX_BYTES))
                if isinstance(data, dict):
                    beats.append(data)
            except (OSError, ValueError):
                pass
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return beats


def _integer(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def assess(
    views: dict[int, RankView],
    *,
    job_id: str | None,
    job_seen_at: float | None,
    world_size: int,
    now: float,
    dead_after: float,
    timeouts: PhaseTimeouts,
) -> Assessment:
    """One supervision pass over the current incarnation's ranks (a plain loop: ~1 us per rank).
    `now`, `job_seen_at` and every time in `views` are on the controller's monotonic clock."""
    result = Assessment(job_id=None if job_id is None else str(job_id), ranks_seen=0, world_size=world_size)
    if job_id is None:
        return result
    limits = {phase: timeouts.timeout(phase) for phase in timeouts.floors}
    step_limit = limits[Phase.STEP.value]
    host_age = result.host_beat_age
    findings = result.findings
    min_step = max_step = None
    reference: dict[str, Any] | None = None
    reference_rank = 1 << 62
    for rank, view in views.items():
        beat = view.beat
        host = str(beat.get("host", ""))
        beat_age = now - view.beat_changed
        if beat_age > host_age.get(host, -1.0):
            host_age[host] = beat_age
        phase = str(beat.get("phase", Phase.STEP.value))
        step = _integer(beat.get("step"))
        if min_step is None or step < min_step:
            min_step = step
        if max_step is None or step > max_step:
            max_step = step
        if rank < reference_rank:
            reference_rank, reference = rank, beat
        if phase == Phase.EXITING.value:
            # Leaving on purpose (its beat stops when it is gone): how it left is judged from
            # SLURM's end state and exit code, and peers stuck without it show up as a hang.
            continue
        if beat_age > dead_after:
            findings.append(Finding(FindingKind.DEAD_RANK, rank, host, phase, step, beat_age, dead_after))
            continue
        stalled = now - view.progress_changed
        limit = limits.get(phase, step_limit)
        if stalled > limit:
            findings.append(Finding(FindingKind.HANG, rank, host, phase, step, stalled, limit))
    result.ranks_seen = len(views)
    result.min_step, result.max_step, result.reference = min_step, max_step, reference
    init_limit = limits[Phase.INIT.value]
    if job_seen_at is not None and len(views) < world_size and now - job_seen_at > init_limit:
        for rank in range(world_size):
            if rank not in views:
                findings.append(
                    Finding(
                        FindingKind.MISSING_RANK, rank, "", Phase.INIT.value, 0, now - job_seen_at, init_limit
                    )
                )
    return result
