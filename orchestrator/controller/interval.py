"""The checkpoint interval, re-fitted during the run from its own failures and save stall.

    learner = IntervalLearner.of(cfg, paths)       # the planner's MTBF and stall as the prior
    learner.count_failures(actions)                # the failures among the actions applied
    actions = learner.after_pass(state, beats, now)   # an event (and the directive, in apply mode)

The rate: failures of the job are Poisson with rate lambda; the prior is Gamma(a0, a0 x M0) with
M0 the planner's job MTBF (cluster.gpu_mtbf_hours / GPUs) and a0 = PRIOR_FAILURES (the prior weighs
as much as one failure seen). After n failures in T hours of jobs running the posterior is
Gamma(a0 + n, a0 M0 + T), whose mean (a0 + n) / (a0 M0 + T) is the fitted rate. With a0 an integer,
P(lambda > 1 / M0) is a Poisson sum: exact, no special functions.
The prior is left only on evidence: until the posterior puts EVIDENCE of its mass above the
prior's rate (or EVIDENCE_BELOW below it) the fit keeps the prior's rate (a month at the prior's
rate has ~6 failures: their Poisson noise alone would move the interval by 30-60%); once it has,
the fit follows the posterior mean from then on (a controller that restarts finds the same counts
and decides again). Below is stricter: quiet weeks are common at the prior's rate, and an interval
too long for a rate 4x the plan's costs more than one a little short for a quiet run. Checked over
300 seeded months (tests/unit/test_adaptive_interval.py): at the prior's rate 95% of months never
move the interval by more than 20%; at 4x, the median month is within 25% of Young/Daly for the
true rate after 150 h (a week has ~5.6 failures: no rule can know sooner and stay calm at 1x).
The stall: the median over launches of rank 0's longest save stall (`durations["checkpoint"]` of
its heartbeat: the host snapshot of an async save), read only from beats in the step phase (the
final save before an exit is the whole write, and no step follows it); the planner's stall until
a save was seen.
The interval: Young/Daly sqrt(2 x stall x MTBF) (orchestrator.plan.planner), within
[checkpoint.min_interval_hours, max_interval_hours]. A fit that moves the interval in force by
MIN_CHANGE or more is an event; with adaptive_interval: apply also the directive
(contract/interval.py) that the trainer reads after its next save. Cost: a sum over the jobs of
state.json and a few floats per pass; events.jsonl is read once, at the first pass.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from orchestrator.contract import Phase
from orchestrator.contract import failure_events as fev
from orchestrator.contract.directive import DirectiveError
from orchestrator.contract.events import read_events
from orchestrator.contract.interval import CheckpointIntervalFit, IntervalDirective, read_interval_directive
from orchestrator.contract.paths import RunPaths
from orchestrator.plan.goodput_model import young_daly_interval_hours
from orchestrator.plan.planner import plan_run

from .actions import Record

PRIOR_FAILURES = 1  # a0: an integer (the Poisson sum below)
EVIDENCE = 0.975  # P(rate above the prior's) that leaves the prior
EVIDENCE_BELOW = 0.995  # P(rate below the prior's) that leaves it
MIN_CHANGE = 0.10


@dataclass(frozen=True)
class IntervalFit:
    failures: int
    exposure_hours: float
    prior_job_mtbf_hours: float
    posterior_job_mtbf_hours: float  # the posterior mean's MTBF (1 / mean rate)
    probability_rate_above_prior: float
    left_prior: bool
    job_mtbf_hours: float  # what the interval is fitted to: the prior's, or the posterior's
    stall_seconds: float
    young_daly_hours: float
    interval_hours: float  # within the bounds

    @property
    def evidence(self) -> str:
        if not self.left_prior:
            return "prior"
        side = "above" if self.probability_rate_above_prior >= 0.5 else "below"
        return f"P(failure rate {side} the prior's) = {max(self.probability_rate_above_prior, 1 - self.probability_rate_above_prior):.3f}"


def poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean)."""
    term = total = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        total += term
    return min(1.0, total)


def fit_interval(
    *,
    prior_job_mtbf_hours: float,
    failures: int,
    exposure_hours: float,
    stall_seconds: float,
    min_hours: float,
    max_hours: float,
    left_prior: bool = False,
) -> IntervalFit:
    """The module docstring's rule, pure: `left_prior` says the evidence was already there once."""
    shape = PRIOR_FAILURES + failures
    rate_scale = PRIOR_FAILURES * prior_job_mtbf_hours + max(0.0, exposure_hours)
    # Gamma(k, b) with integer k: P(lambda > x) = P(Poisson(x b) <= k - 1).
    above = poisson_cdf(shape - 1, rate_scale / prior_job_mtbf_hours)
    left = left_prior or above >= EVIDENCE or 1 - above >= EVIDENCE_BELOW
    posterior_mtbf = rate_scale / shape
    mtbf = posterior_mtbf if left else prior_job_mtbf_hours
    young_daly = young_daly_interval_hours(stall_seconds, mtbf)
    return IntervalFit(
        failures=failures, exposure_hours=exposure_hours, prior_job_mtbf_hours=prior_job_mtbf_hours,
        posterior_job_mtbf_hours=posterior_mtbf, probability_rate_above_prior=above, left_prior=left,
        job_mtbf_hours=mtbf, stall_seconds=stall_seconds, young_daly_hours=young_daly,
        interval_hours=min(max(young_daly, min_hours), max_hours),
    )  # fmt: skip


@dataclass(frozen=True)
class PublishInterval:
    """Write accepted/checkpoint_interval (the applier's one writer of it)."""

    directive: IntervalDirective


def training_hours(jobs: list[Any], now: float) -> float:
    """Hours the run's jobs have been running (started, until their end or now)."""
    total = 0.0
    for job in jobs:
        if job.started_at is not None:
            total += max(0.0, (job.ended_at if job.ended_at is not None else now) - job.started_at)
    return total / 3600


class IntervalLearner:
    def __init__(self, paths: RunPaths, mode: str, prior_job_mtbf_hours: float, prior_stall_seconds: float,
                 bounds: tuple[float, float], in_force_hours: float):  # fmt: skip
        self.paths, self.mode = paths, mode
        self.prior_job_mtbf_hours, self.prior_stall_seconds = prior_job_mtbf_hours, prior_stall_seconds
        self.bounds = bounds
        self.in_force_hours = in_force_hours
        self.failures: int | None = None  # counted from events.jsonl at the first pass
        self.left_prior = False
        self.stalls: dict[tuple[str, int], float] = {}  # (job, launch) -> rank 0's longest save stall
        self.last_fit: IntervalFit | None = None

    @classmethod
    def of(cls, cfg: Any, paths: RunPaths) -> IntervalLearner:
        ck = cfg.checkpoint
        plan = plan_run(cfg) if ck.adaptive_interval != "off" else None
        in_force = ck.interval_hours or 0.0
        if ck.adaptive_interval == "apply":
            try:
                directive = read_interval_directive(paths)
            except DirectiveError:
                directive = None  # the applier's next write replaces it
            if directive is not None:
                in_force = min(max(directive.interval_hours, ck.min_interval_hours), ck.max_interval_hours)
        return cls(
            paths, ck.adaptive_interval,
            plan.job_mtbf_hours if plan else math.inf, plan.save_stall_seconds if plan else 0.0,
            (ck.min_interval_hours, ck.max_interval_hours), in_force,
        )  # fmt: skip

    def note_failure(self) -> None:
        if self.failures is not None:
            self.failures += 1

    def count_failures(self, actions: list[Any]) -> None:
        """The `failure` events among actions the controller applied (every path records one)."""
        for action in actions:
            if isinstance(action, Record) and isinstance(action.event, fev.Failure):
                self.note_failure()

    def stall_seconds(self) -> float:
        return statistics.median(self.stalls.values()) if self.stalls else self.prior_stall_seconds

    def after_pass(self, jobs: list[Any], beats: list[Any], now: float) -> list[Any]:
        if self.mode == "off":
            return []
        if self.failures is None:
            self.failures = sum(1 for e in read_events(self.paths.events) if isinstance(e, fev.Failure))
        for beat in beats:
            # Only while training goes on: the save before an exit is the whole write, not a stall.
            stall = beat.durations.get("checkpoint") if beat.rank == 0 and beat.phase is Phase.STEP else None
            if stall:
                self.stalls[(str(beat.job_id), beat.launch)] = float(stall)
        fit = fit_interval(
            prior_job_mtbf_hours=self.prior_job_mtbf_hours, failures=self.failures,
            exposure_hours=training_hours(jobs, now), stall_seconds=self.stall_seconds(),
            min_hours=self.bounds[0], max_hours=self.bounds[1], left_prior=self.left_prior,
        )  # fmt: skip
        self.left_prior, self.last_fit = fit.left_prior, fit
        if abs(fit.interval_hours - self.in_force_hours) < MIN_CHANGE * self.in_force_hours:
            return []
        previous, self.in_force_hours = self.in_force_hours, fit.interval_hours
        event = CheckpointIntervalFit(
            adaptive_mode=self.mode, interval_hours=round(fit.interval_hours, 4), previous_hours=round(previous, 4),
            young_daly_hours=round(fit.young_daly_hours, 4), failures=fit.failures,
            exposure_hours=round(fit.exposure_hours, 2), prior_job_mtbf_hours=round(fit.prior_job_mtbf_hours, 2),
            posterior_job_mtbf_hours=round(fit.posterior_job_mtbf_hours, 2),
            save_stall_seconds=round(fit.stall_seconds, 1), evidence=fit.evidence,
        )  # fmt: skip
        actions: list[Any] = [Record(event)]
        if self.mode == "apply":
            reason = (f"Young/Daly for a job MTBF of {fit.job_mtbf_hours:.1f} h ({fit.failures} failures in "
                      f"{fit.exposure_hours:.0f} h, prior {fit.prior_job_mtbf_hours:.0f} h) and a {fit.stall_seconds:.0f} s stall")  # fmt: skip
            actions.append(PublishInterval(IntervalDirective(fit.interval_hours, now, reason)))
        return actions
