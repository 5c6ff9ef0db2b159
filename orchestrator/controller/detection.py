"""Supervision: pure functions from what the controller saw of the ranks to findings.

Nothing here writes a file or calls the scheduler, so every rule is testable with plain data, and
one pass over 16,384 ranks stays well under a second (the benchmark in bench/ measures it).

Every duration below is measured on the controller's own monotonic clock, from when it saw a
rank's beat or progress *change* (liveness.py); no node's clock is ever compared with the login
node's. Rules, for the ranks of the current incarnation of the job that is running now:
- dead rank: its beat has not changed for `watchdog.dead_after_seconds` (crash, SIGSTOP, lost node);
- missing rank: the job has been seen running for longer than the init timeout and the rank never
  beat;
- hang: the rank beats, is not waiting for its peers (its last mark is not Mark.WAIT: the time
  there is theirs), and its progress (the marks it has done, its step, its phase) has not changed
  for longer than the limit of its phase (learned per launch from the gaps between marks, see
  timeouts.py), e.g. stuck in a collective or in a save whose bytes stopped;
- everyone stuck: when no rank is found hung or dead by the rules above, but no rank's progress
  has changed for longer than the largest of their limits, waiting ones included (all of them in
  a collective that never completes, or waiting for a peer that stopped without a trace): every
  one of them is hung;
- no hang verdict while a rank's beat is silent (unchanged for `silent_after`): it cannot be seen
  to progress, and its peers' stall is likely its doing; it is dead after `dead_after` (then it is
  the one to blame), and its progress timer restarts if it comes back;
- a stall is not a death (`stall_tolerance`, watchdog.stall_tolerance_seconds): a silent rank
  whose whole node is silent is not dead, up to that long, when the node cannot be lost: every node
  of the job is silent at once (the filesystem stalls; lost nodes end the job NODE_FAIL in SLURM),
  or its peers still progress `silent_after` after its node went quiet (the ranks of a lost node
  hold up the next collective within seconds; a node whose writes stall computes on), or every
  rank that beats is still in init (no marks there: time is the only evidence; a node lost in init
  ends its step or job in SLURM), or it went quiet in a save (storage is what stalls, and peers done
  with theirs wait for it; a node lost there ends its job NODE_FAIL in SLURM). A rank alone
  silent on a node that still beats is dead at `dead_after` (frozen, SIGSTOP);
- a silent node that was asked (`probed`, controller/probe.py) is judged by its answer instead:
  unreachable, dead now (lost); a rank stopped or running without beats, dead at `dead_after`;
  a rank in D or its filesystem not answering, a stall up to `stall_tolerance`; undecided, the
  rules above. `Assessment.quiet_hosts` lists the nodes to ask (`ask_after`), `silent_hosts` those
  whose early answer is to be confirmed, `unseen_ranks` the ranks that never beat in a launch whose
  others have beaten for `ask_after` (their node is asked: a stall that began at the launch);
- a missing rank on a node found in a storage stall (`stalled_ranks`) is missing only once the
  stall tolerance has passed too: it cannot write its first beat while the stall lasts.
One incident is one incident: when at least half of the ranks are dead at once, the job, the
filesystem or the network is suspected, not N nodes (`Assessment.job_wide`), and the nodes blamed
by one incident are capped (`culprit_nodes`).
Blame in a hang (`behind`): every collective the trainer calls is a wait (its last mark is
Mark.WAIT while it is inside one), so a rank blocked in a TP all-reduce, a pipeline receive or
ZeRO's reduce-scatter is waiting, and the culprit is the rank that never entered it: the one still
in its own work while the others wait. Only that is sure enough to exclude a node on marks alone
(`Assessment.suspects_sure`); a rank named only for being behind while it waits too (every stuck
rank waiting: a fault below what marks can see) is a suspect, and the job is restarted without an
exclusion unless other evidence names its node (blame.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract import Heartbeat, Mark, Phase
from orchestrator.contract.causes import Cause

from .liveness import RankView
from .probe import Verdict
from .timeouts import PhaseTimeouts


@dataclass
class Finding:
    kind: Cause
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
    # The lowest rank's beat (where training resumed from, for the recovery follow-up).
    reference: Heartbeat | None = None
    # Per host: seconds since its stalest rank's beat changed (for the dashboard's grid).
    host_beat_age: dict[str, float] = field(default_factory=dict)
    # In a hang: the ranks behind the others (`behind`), and why they, or nobody, are named.
    suspects: list[Finding] = field(default_factory=list)
    suspects_why: str = ""
    # The marks alone name the suspects: they were in their own work while the others waited.
    suspects_sure: bool = False
    # Nodes none of whose ranks beat for `ask_after` (asked: probing.py), and those of them silent
    # for `silent_after` (an early answer is asked again then).
    quiet_hosts: list[str] = field(default_factory=list)
    silent_hosts: list[str] = field(default_factory=list)
    # Ranks that have not beaten while the launch's others have beaten for `ask_after` (since
    # `unseen_since`): a node none of whose ranks ever beat may be in a storage stall that began
    # at the launch, and is asked too (probing.py).
    unseen_ranks: list[int] = field(default_factory=list)
    unseen_since: float | None = None

    @property
    def dead(self) -> list[Finding]:
        return [f for f in self.findings if f.kind in (Cause.DEAD_RANK, Cause.MISSING_RANK)]

    @property
    def hung(self) -> list[Finding]:
        return [f for f in self.findings if f.kind is Cause.HANG]

    @property
    def job_wide(self) -> bool:
        """At least half of the ranks dead at once: a job, filesystem or network incident."""
        return bool(self.dead) and 2 * len(self.dead) >= max(1, self.world_size)

    def culprits(self) -> list[Finding]:
        """The ranks to blame. Dead ranks when there are any (the others hang because they wait
        for them), unless the stall is job-wide. In a pure hang, the suspects only when the marks
        are sure of them (`behind`: in their own work while the others wait); suspects that wait
        like everyone else are blamed only on other evidence (blame.py), never here."""
        if self.dead:
            return [] if self.job_wide else self.dead
        return self.suspects if self.hung and self.suspects_sure else []


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


def stale_hosts(job_beats: list[Heartbeat], margin: float) -> list[str]:
    """Hosts whose newest beat is more than `margin` seconds older than the median host's newest:
    the node that went first when SLURM reports only that the job ended NODE_FAIL. This compares
    node clocks with each other (skewed by at most a minute or so, so margin must be well above
    that), never with the login node's."""
    newest: dict[str, float] = {}
    for beat in job_beats:
        newest[beat.host] = max(newest.get(beat.host, float("-inf")), beat.beat_time)
    if len(newest) < 2:
        return []
    ordered = sorted(newest.values())
    median = ordered[len(ordered) // 2]
    return sorted(host for host, stamp in newest.items() if median - stamp > margin)


def assess(
    views: dict[int, RankView],
    *,
    job_id: str | None,
    job_seen_at: float | None,
    world_size: int,
    now: float,
    dead_after: float,
    silent_after: float,
    timeouts: PhaseTimeouts,
    stall_tolerance: float = 0.0,
    probed: dict[str, Verdict] | None = None,
    ask_after: float | None = None,
    stalled_ranks: frozenset[int] = frozenset(),
    first_beat_at: float | None = None,
) -> Assessment:
    """One supervision pass over the current incarnation's ranks (a plain loop: ~1 us per rank).
    `now`, `job_seen_at` and every time in `views` are on the controller's monotonic clock."""
    result = Assessment(job_id=None if job_id is None else str(job_id), ranks_seen=0, world_size=world_size)
    if job_id is None:
        return result
    limits = {
        Phase(phase): timeouts.timeout(phase) for phase in timeouts.floors
    }  # by member: no .value a rank
    step_limit = limits[Phase.STEP]
    exiting, wait = Phase.EXITING, Mark.WAIT.value
    host_age = result.host_beat_age
    findings = result.findings
    min_step, max_step = 1 << 62, -1
    reference: Heartbeat | None = None
    reference_rank = 1 << 62
    # Ranks judged on their progress (beating, not leaving): the newest progress among them and
    # the largest limit, for the everyone-stuck rule.
    judged: list[RankView] = []
    newest_progress, widest_limit = float("-inf"), 0.0
    newest_seen = float("-inf")  # the newest progress seen as it happened (RankView.progress_seen)
    silent = False
    in_init, past_init = Phase.INIT, False  # past_init: some rank that beats has left init
    over: list[tuple[RankView, float]] = []  # beats older than dead_after: dead, unless a stall
    freshest: dict[str, float] = {}  # per host: its freshest rank's beat age
    probed = probed or {}
    for rank, view in views.items():
        beat = view.beat
        host = beat.host
        beat_age = now - view.beat_changed
        if beat_age > host_age.get(host, -1.0):
            host_age[host] = beat_age
        if beat_age < freshest.get(host, float("inf")):
            freshest[host] = beat_age
        step = beat.step
        if step < min_step:
            min_step = step
        if step > max_step:
            max_step = step
        if rank < reference_rank:
            reference_rank, reference = rank, beat
        phase = beat.phase
        if phase is exiting:
            # Leaving on purpose (its beat stops when it is gone): how it left is judged from
            # SLURM's end state and exit code, and peers stuck without it show up as a hang.
            continue
        if beat_age > dead_after or (beat_age > silent_after and probed.get(host) is Verdict.LOST):
            over.append((view, beat_age))
            continue
        if beat_age > silent_after:
            silent = True
            continue
        changed = view.progress_changed
        limit = limits.get(phase, step_limit)
        judged.append(view)
        if phase is not in_init:
            past_init = True
        if changed > newest_progress:
            newest_progress = changed
        if view.progress_seen > newest_seen:
            newest_seen = view.progress_seen
        if limit > widest_limit:
            widest_limit = limit
        if now - changed > limit and beat.progress_unit != wait:
            findings.append(Finding(Cause.HANG, rank, host, phase.value, step, now - changed, limit))
    ask_after = silent_after if ask_after is None else min(ask_after, silent_after)
    result.quiet_hosts = sorted(host for host, age in freshest.items() if age > ask_after)
    result.silent_hosts = sorted(host for host, age in freshest.items() if age > silent_after)
    if first_beat_at is not None and 0 < len(views) < world_size and now - first_beat_at > ask_after:
        result.unseen_ranks = [rank for rank in range(world_size) if rank not in views]
        result.unseen_since = first_beat_at
    if over:
        silent = (
            _judge_silence(
                over,
                findings,
                freshest,
                now,
                newest_seen,
                dead_after,
                silent_after,
                stall_tolerance,
                all_in_init=bool(judged) and not past_init,
                probed=probed,
            )
            or silent
        )
    if silent:
        # A silent rank (a node going down?) is the likely cause of its peers' stall: blame waits
        # until dead_after says it is dead, or it comes back.
        findings[:] = [f for f in findings if f.kind is not Cause.HANG]
    elif judged and not findings and now - newest_progress > widest_limit:
        for view in judged:
            beat = view.beat
            stalled = now - view.progress_changed
            findings.append(
                Finding(Cause.HANG, view.rank, beat.host, beat.phase.value, beat.step, stalled, widest_limit)
            )
    if findings and not silent and all(f.kind is Cause.HANG for f in findings):
        stuck = [(v, limits.get(v.beat.phase, step_limit)) for v in judged]
        stuck = [(v, limit) for v, limit in stuck if now - v.progress_changed > min(limit, widest_limit)]
        result.suspects, result.suspects_why, result.suspects_sure = behind(
            stuck, now, furthest=max(v.beat.step for v in judged)
        )
    if max_step < 0:
        min_step = max_step = None
    result.ranks_seen = len(views)
    result.min_step, result.max_step, result.reference = min_step, max_step, reference
    init_limit = limits[Phase.INIT]
    # A rank on a node found in a storage stall cannot write its first beat while the stall lasts:
    # missing only once the stall tolerance has passed too.
    stalled_limit = max(init_limit, stall_tolerance)
    if job_seen_at is not None and len(views) < world_size and now - job_seen_at > init_limit:
        for rank in range(world_size):
            limit = stalled_limit if rank in stalled_ranks else init_limit
            if rank not in views and now - job_seen_at > limit:
                findings.append(
                    Finding(Cause.MISSING_RANK, rank, "", Phase.INIT.value, 0, now - job_seen_at, limit)
                )
    return result


def behind(
    stuck: list[tuple[RankView, float]], now: float, furthest: int | None = None
) -> tuple[list[Finding], str, bool]:
    """Of the ranks stuck in a hang (progress unchanged past their limit, `(view, limit)`, waiting
    ones included), those that hold the others up, why, and whether the marks are sure of them
    (every one named is in its own work, not in a wait: a rank waiting in a collective is held up
    by another, so naming it on marks alone blames a peer); nobody when none stands out.
    `furthest`: the highest step of every rank judged, stuck or not yet (peers that went on to the
    next step and wait there cross their own limit later than the rank they wait for). In order:
    - ranks at a lower step than the others: they did not finish the step the rest finished;
    - ranks not waiting while others wait (their last mark is not Mark.WAIT): the waiters wait
      for someone, and these stopped in their own work;
    - every one waiting at the same step: those with fewer marks (progress_count) than the rest
      stopped earlier in the step (ranks of one job do the same work per step, as many micro-
      batches forward and backward on every stage);
    - all at the same step, all waiting, at the same count: nobody (a collective that never
      completes, the network, the job: not one rank's doing)."""
    if not stuck:
        return [], "", False
    wait = Mark.WAIT.value
    low = min(v.beat.step for v, _ in stuck)
    if any(v.beat.step != low for v, _ in stuck) or (furthest is not None and furthest > low):
        named = [(v, limit) for v, limit in stuck if v.beat.step == low]
        why = f"behind the others at step {low}"
    else:
        working = [(v, limit) for v, limit in stuck if v.beat.progress_unit != wait]
        fewest = min(v.beat.progress_count for v, _ in stuck)
        if working and len(working) < len(stuck):
            named, why = working, "stopped in its own work while the others wait for their peers"
        elif any(v.beat.progress_count != fewest for v, _ in stuck):
            named = [(v, limit) for v, limit in stuck if v.beat.progress_count == fewest]
            why = f"fewest marks of the step ({fewest}): stopped before the others"
        else:
            return (
                [],
                (
                    f"nobody named: all {len(stuck)} stuck ranks are at step {low} with the same marks "
                    f"({fewest}){', all waiting' if not working else ''}: a job-wide hang"
                ),
                False,
            )
    # Fewest marks alone is never sure (every stuck rank works or every one waits: nobody is seen
    # holding up the others); behind or working while the others wait is, when the named work.
    sure = not why.startswith("fewest") and all(v.beat.progress_unit != wait for v, _ in named)
    if not sure:
        why += "; the marks alone cannot tell it from the peers it waits with: not enough to exclude a node"
    return (
        [
            Finding(
                Cause.HANG,
                v.rank,
                v.beat.host,
                v.beat.phase.value,
                v.beat.step,
                now - v.progress_changed,
                limit,
            )
            for v, limit in named
        ],
        why,
        sure,
    )


def _judge_silence(
    over: list[tuple[RankView, float]],
    findings: list[Finding],
    node_quiet: dict[str, float],
    now: float,
    live_progress: float,
    dead_after: float,
    silent_after: float,
    stall_tolerance: float,
    all_in_init: bool = False,
    probed: dict[str, Verdict] | None = None,
) -> bool:
    """Ranks silent for more than dead_after: dead, or (the module docstring's stall rule) a stall
    to wait out. `live_progress` is the newest progress of the ranks that beat. True when some
    rank is left silent (no hang verdict this pass)."""
    every_node_quiet = all(age > silent_after for age in node_quiet.values())
    stalled = False
    for view, beat_age in over:
        beat = view.beat
        quiet = node_quiet[beat.host]
        whole_node = quiet > silent_after  # no rank of its node beats (one that does: frozen alone)
        answer = (probed or {}).get(beat.host, Verdict.UNDECIDED)
        if answer is Verdict.STALL and beat_age <= stall_tolerance:
            stalled = True  # it answered: its storage does not
            continue
        if answer is Verdict.UNDECIDED and (
            beat_age <= stall_tolerance
            # every node silent, or peers progressed silent_after after its whole node went quiet
            # (a node with a rank that still beats has quiet ~0: never a stall)
            and (
                every_node_quiet
                or live_progress > now - quiet + silent_after
                # In init (imports, rendezvous: no marks) nobody can be seen to progress, so time is
                # the only evidence: wait out the tolerance. A node lost there ends its srun step or
                # its job in SLURM (SlurmdTimeout); seen in the soak: a 10-minute storage stall during
                # a relaunch's init was a false death and a false exclusion.
                or (whole_node and all_in_init and beat.phase is Phase.INIT)
                # In a save, storage is what stalls, and the peers that finished theirs wait for
                # this node at the next barrier: nobody can be seen to progress either. A false
                # death there throws away the save and the work since the last one; a node lost
                # in a save ends its job NODE_FAIL in SLURM (SlurmdTimeout). Seen in the soak: a
                # 10-minute storage stall on one node during a save was a false death and exclusion.
                or (whole_node and beat.phase is Phase.CHECKPOINT)
            )
        ):
            stalled = True
            continue
        findings.append(
            Finding(Cause.DEAD_RANK, view.rank, beat.host, beat.phase.value, beat.step, beat_age, dead_after)
        )
    return stalled
