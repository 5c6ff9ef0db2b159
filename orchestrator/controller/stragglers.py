"""Straggler detection: which node is slow, from the compute time each rank reports per step.

A slow node does not stop a job, it drags it: every rank's step time (wall) is the slowest rank's,
because collectives make the others wait. So the ranks report their own compute time per step,
waits excluded (`extra.compute_seconds` in the heartbeat, trainer/compute_time.py), and this module
compares them. Pure rules over plain data, the controller's monotonic time passed in; node clocks
are never used (a compute time is a duration measured on one node).

Rules, per round (a round: every rank of the running job has reported a step newer than the last
round's; each rank's latest value is used, neighbouring steps do the same work):
- Peers: ranks with the same `compute_group` (pipeline stage and TP rank) do the same work. A
  rank's ratio is its compute time over the median of its group (groups of >= MIN_PEERS ranks; a
  smaller group cannot say who is the odd one). A node's `vs_median` is its worst rank's ratio. The
  median, not the mean: one very slow node must not raise the reference it is compared with.
  Comparing within groups keeps the nodes of the embedding stages (more work) from being flagged.
- History: a node's compute time (its slowest rank's) over its own baseline (an EWMA of the
  rounds where it was not slow, after MIN_HISTORY_ROUNDS rounds), divided by the median of that
  ratio over the nodes (>= MIN_PEERS of them): a whole-job slowdown (batch-size rampup, a slow
  filesystem) moves every node alike and cancels; a node that got slower than it used to be
  stands out even when it has no peers. -> `vs_history`.
- score = the larger of the two. A node is SLOW in a round when score >= threshold. It becomes a
  STRAGGLER when it has been slow in every round for `straggler_seconds` of the controller's
  monotonic clock and at least MIN_SLOW_ROUNDS rounds (a controller paused for a while must not
  turn one slow round into a straggler). It RECOVERS by the same rule, below the threshold.
- No false alarms: the first WARMUP_ROUNDS rounds of each job (or requeued/relaunched one) are not
  scored (compilation, caches, the first step after a resume); the history starts again with each
  job; only the steps' compute is measured, so init, checkpoint saves and eval never enter it.
Cost: O(ranks) per round (48 x 8 ranks: a sort per group), nothing between rounds.

`StragglerWatch.on_pass` is the controller's hook: it turns the changes into actions (an event and
a notification when a node becomes a straggler, an event when it recovers, an exclusion when
`watchdog.straggler_exclude`), and keeps the scores in `state.stragglers` for `runctl status` (a ChangeState action).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, is_not
from statistics import median
from typing import Any

from orchestrator.contract import Heartbeat, Phase
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import RESPONSES, Cause

from .actions import Action, ChangeState, Exclude, Record, alert
from .pass_view import JobView

MIN_PEERS = 3
WARMUP_ROUNDS = 2
MIN_HISTORY_ROUNDS = 3
MIN_SLOW_ROUNDS = 3
EWMA_WEIGHT = 0.2  # of the newest round in a node's baseline
MAX_GROUP_CHARS = 64


@dataclass(frozen=True)
class RankSample:
    """One rank's latest report: its compute seconds of step `step`."""

    rank: int
    node: str
    step: int
    compute_seconds: float
    group: str = ""


@dataclass
class NodeTrack:
    baseline: float | None = None
    history_rounds: int = 0
    slow_since: float | None = None  # monotonic time of the first slow round of this streak
    slow_rounds: int = 0
    well_since: float | None = None  # the same, below the threshold, while a straggler
    well_rounds: int = 0
    straggler: bool = False
    last: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Change:
    kind: str  # "straggler" or "straggler_recovered"
    node: str
    details: dict[str, Any]


class StragglerScorer:
    """Per-node scores and straggler state of one job (or requeued incarnation) at a time."""

    def __init__(self, threshold: float, duration_seconds: float):
        self.threshold = threshold
        self.duration = duration_seconds
        self._reset(None)

    def _reset(self, job_key: Any) -> None:
        self.job_key = job_key
        self.nodes: dict[str, NodeTrack] = {}
        self.last_round_step: int | None = None
        self.rounds = 0
        self.round_step: int | None = None

    def observe(self, job_key: Any, samples: list[RankSample], now: float) -> list[Change]:
        """Score a new round if the samples make one; the nodes that became or stopped being
        stragglers. `now`: the controller's monotonic clock."""
        if job_key != self.job_key:
            self._reset(job_key)
        if not samples:
            return []
        step = min(s.step for s in samples)
        if self.last_round_step is not None and step <= self.last_round_step:
            return []
        self.last_round_step = step
        self.rounds += 1
        if self.rounds <= WARMUP_ROUNDS:
            return []
        self.round_step = step
        return self._score_round(samples, now)

    def _score_round(self, samples: list[RankSample], now: float) -> list[Change]:
        vs_median = _vs_median(samples)
        node_compute: dict[str, float] = {}
        for s in samples:
            node_compute[s.node] = max(node_compute.get(s.node, 0.0), s.compute_seconds)
        ratios = {}
        for node, seconds in node_compute.items():
            track = self.nodes.setdefault(node, NodeTrack())
            if track.baseline and track.history_rounds >= MIN_HISTORY_ROUNDS:
                ratios[node] = seconds / track.baseline
        reference = median(ratios.values()) if len(ratios) >= MIN_PEERS else None
        changes = []
        for node, seconds in sorted(node_compute.items()):
            track = self.nodes[node]
            history = ratios[node] / reference if reference and node in ratios else None
            scores = [x for x in (vs_median.get(node), history) if x is not None]
            score = max(scores) if scores else None
            slow = score is not None and score >= self.threshold
            track.last = {
                "score": _round(score),
                "vs_median": _round(vs_median.get(node)),
                "vs_history": _round(history),
                "compute_seconds": _round(seconds),
            }
            if not slow:  # a slow round never becomes the baseline it is judged against
                track.baseline = (
                    seconds
                    if track.baseline is None
                    else ((1 - EWMA_WEIGHT) * track.baseline + EWMA_WEIGHT * seconds)
                )
                track.history_rounds += 1
            change = self._follow(node, track, slow, score is not None, now)
            if change is not None:
                changes.append(change)
        return changes

    def _follow(self, node: str, track: NodeTrack, slow: bool, scored: bool, now: float) -> Change | None:
        if slow:
            track.slow_since = now if track.slow_since is None else track.slow_since
            track.slow_rounds += 1
            track.well_since, track.well_rounds = None, 0
        elif scored:
            track.slow_since, track.slow_rounds = None, 0
            track.well_since = now if track.well_since is None else track.well_since
            track.well_rounds += 1
        track.last["slow_for_seconds"] = (
            _round(now - track.slow_since) if track.slow_since is not None else 0.0
        )
        details = {
            **track.last,
            "step": self.round_step,
            "threshold": self.threshold,
            "straggler_seconds": self.duration,
        }
        if not track.straggler and slow and self._lasted(track.slow_since, track.slow_rounds, now):
            track.straggler = True
            return Change(Cause.STRAGGLER, node, details)
        if track.straggler and not slow and scored and self._lasted(track.well_since, track.well_rounds, now):
            track.straggler = False
            return Change("straggler_recovered", node, details)
        return None

    def _lasted(self, since: float | None, rounds: int, now: float) -> bool:
        return since is not None and now - since >= self.duration and rounds >= MIN_SLOW_ROUNDS

    def summary(self) -> dict[str, Any]:
        """What `runctl status` shows: per node its scores, whether it is a straggler."""
        return {
            "step": self.round_step,
            "threshold": self.threshold,
            "nodes": {
                n: {**t.last, "straggler": t.straggler} for n, t in sorted(self.nodes.items()) if t.last
            },
        }


def _vs_median(samples: list[RankSample]) -> dict[str, float]:
    """node -> its worst rank's compute time over the median of that rank's peer group."""
    groups: dict[str, list[RankSample]] = {}
    for s in samples:
        groups.setdefault(s.group, []).append(s)
    out: dict[str, float] = {}
    for members in groups.values():
        if len({m.node for m in members}) < MIN_PEERS:
            continue
        middle = median(m.compute_seconds for m in members)
        if middle <= 0:
            continue
        for m in members:
            out[m.node] = max(out.get(m.node, 0.0), m.compute_seconds / middle)
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


_JOB_ID = attrgetter("job_id")
_INCARNATION = attrgetter("restart_count", "launch")
_PHASE = attrgetter("phase")
_COMPUTE_STEP = attrgetter("compute_step")


def samples_from_beats(
    beats: list[Heartbeat],
    job_id: str,
    node_of: Callable[[int, str], str],
    last_round: tuple[Any, int] | None = None,
) -> tuple[Any, list[RankSample]]:
    """(job key, samples) from the running job's beats. The key tells a requeued or relaunched
    incarnation (same job id, higher SLURM_RESTART_COUNT or launch) apart; older incarnations'
    beats are dropped. No samples unless every rank of the job is in the step phase with a
    compute time: a round is never made of the ranks that happen to be out of a save or an eval
    first. No samples either while the oldest compute step is not past `last_round` (job key,
    step: StragglerScorer.observe would drop them), so a pass between two steps costs a few
    C-level sweeps over the beats, not a sample per rank (16,384 of them: ~40 ms a pass).
    """
    job_id = str(job_id)
    mine = list(compress(beats, map(job_id.__eq__, map(_JOB_ID, beats))))
    incarnation = max(map(_INCARNATION, mine), default=(0, 0))
    mine = list(compress(mine, map(incarnation.__eq__, map(_INCARNATION, mine))))
    key = (job_id, incarnation)
    if any(map(is_not, map(_PHASE, mine), repeat(Phase.STEP))):
        return key, []
    steps = list(map(_COMPUTE_STEP, mine))
    if None in steps:
        return key, []
    if last_round is not None and last_round[0] == key and steps and min(steps) <= last_round[1]:
        return key, []
    samples = []
    for beat in mine:
        seconds = beat.compute_seconds
        if seconds is None or seconds <= 0:
            return key, []
        group = beat.compute_group[:MAX_GROUP_CHARS]
        samples.append(
            RankSample(beat.rank, node_of(beat.rank, beat.host), beat.compute_step, float(seconds), group)
        )
    return key, samples


class StragglerWatch:
    """The controller's side: one call per supervision pass of a running job."""

    def __init__(self, watchdog: Any):
        self.watchdog = watchdog
        self.scorer = StragglerScorer(watchdog.straggler_threshold, watchdog.straggler_seconds)

    def on_pass(self, view: JobView) -> list[Action]:
        state, job, now = view.state, view.job, view.mono
        scorer = self.scorer
        last_round = (scorer.job_key, scorer.last_round_step) if scorer.last_round_step is not None else None
        key, samples = samples_from_beats(view.beats, job.job_id, view.node_of_rank, last_round=last_round)
        if self.scorer.job_key is None:
            self._carry_over(state, job.job_id, key)
        before = self.scorer.rounds, self.scorer.job_key
        changes = self.scorer.observe(key, samples, now)
        actions: list[Action] = []
        if (self.scorer.rounds, self.scorer.job_key) != before:
            actions.append(ChangeState(stragglers={"job_id": job.job_id, **self.scorer.summary()}))
        flagged = [n for n, t in self.scorer.nodes.items() if t.straggler]
        for change in changes:
            fields = {"node": change.node, "job_id": job.job_id, **change.details}
            if change.kind == "straggler_recovered":
                actions.append(Record(fev.StragglerRecovered(**fields)))
                continue
            slow = fev.Straggler(**fields, excluded_next=bool(self.watchdog.straggler_exclude))
            actions += alert(slow, RESPONSES[Cause.STRAGGLER].notice)
            if self.watchdog.straggler_exclude:
                actions.append(self._exclusion(change, job.job_id, flagged))
        return actions

    def _carry_over(self, state: Any, job_id: str, key: Any) -> None:
        """A controller restarted during a job: the nodes the last one flagged in this job stay
        flagged (no second notification); their history starts again."""
        last = state.stragglers if isinstance(state.stragglers, dict) else {}
        if last.get("job_id") != job_id or not isinstance(last.get("nodes"), dict):
            return
        self.scorer.job_key = key
        for node, view in last["nodes"].items():
            if isinstance(view, dict) and view.get("straggler") is True:
                self.scorer.nodes[str(node)] = NodeTrack(straggler=True)

    def _exclusion(self, change: Change, job_id: str, flagged: list[str]) -> Action:
        """Excluded from every later job (the exclude list is read at the next restart or
        submission); capped like an incident: many slow nodes at once is the job, not the nodes."""
        cap = self.watchdog.max_excluded_per_incident
        if len(flagged) > cap:
            return Record(
                fev.ExclusionCapped(
                    job_id=job_id,
                    cause=Cause.STRAGGLER,
                    nodes=sorted(flagged)[:64],
                    why=f"{len(flagged)} stragglers at once > max_excluded_per_incident "
                    f"({cap}): suspect the job or the network, not the nodes",
                )
            )
        reason = (
            f"straggler in job {job_id}: compute {change.details['score']}x its peers/history "
            f"for {change.details['slow_for_seconds']:.0f} s (step {change.details['step']})"  # not a beat or event: the scorer's round details
        )
        return Exclude((change.node,), reason, job_id, Cause.STRAGGLER)
