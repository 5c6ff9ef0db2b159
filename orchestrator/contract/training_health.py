"""Training health: pure rules from metrics.jsonl records to findings, and the rollback planner.

Nothing here reads or writes a file or reads a clock: the records, the checkpoints, the config's
`health:` section (orchestrator/plan/config/schema.py HealthConfig) and `now` are passed in, so every
rule is testable with plain data. Stdlib only (the controller's side).

Records are metrics.jsonl lines as the contract reads them (`contract.StepMetrics`): step, loss
and grad_norm (None when not finite), skipped (a non-finite gradient: the step was not applied),
consumed_samples (the data position after the step), global_batch, lr. A rolled-back run writes steps again; `lineage()`
keeps the history that led to the newest record (a step that is not above the one before it cuts
the history back to before that step), and every rule reads the lineage only.

Rules. A "valid" step has a finite loss and was not skipped; windows count valid steps.
The spike and explosion rules judge a step's distance from the curve's own trend, in units of the
noise around it, not its level against the window's spread: on a falling curve the window's
spread is mostly descent (the demo's steps 14-33 fall 8.28 -> 7.74: median 8.06, MAD 0.165, so
median + 6 x 1.4826 x MAD = 9.53 misses a +10% spike; the step-to-step noise is ~0.04).
- the trend (orchestrator/contract/robust_trend.py): over the `spike_window` valid steps before step t, a
  level (the median of the newest max(5, W/20) values) and a slope (the resistant line through the
  medians of the window's last two quarters), extrapolated to t; the spread: the noise's standard
  deviation from the window's first differences, 1.4826 x MAD(differences) / sqrt(2);
- loss spike: from an onset step t on, the loss is above
      threshold = trend(t) + max(spike_mad_k x spread, spike_min_rise)
  for `spike_consecutive` consecutive valid steps (the floor spike_min_rise keeps a flat,
  noiseless curve from alarming on rounding; no judgement before a full window). The trend and
  the spread are frozen at the onset, so that the spike does not raise its own bar; the episode
  ends at the first valid step back under the threshold, or after max(consecutive, W/2) steps (a
  trend extrapolated further is a guess); the next spike is a new finding.
- grad-norm explosion: the same on log(grad norm) over `grad_norm_window`, with the margin
  max(grad_norm_mad_k x spread, log(grad_norm_factor)): at least grad_norm_factor x the trend, for
  `grad_norm_consecutive` consecutive valid steps (a ratio to a trend: grad norms fall early on).
- NaN/Inf skip storm: more than `skip_storm_max` skipped steps among the last `skip_storm_window`
  steps; onset = the first skipped step of that window; one finding until the count is back to
  at most skip_storm_max.
- slow divergence: over the last `divergence_window` valid steps of the lineage (judged at its end
  only: it is a state, not an event), the resistant line through the medians of the window's older
  and newer halves rises by more than `divergence_min_rise` from the window's first step to its
  last. Medians of halves ignore spikes; a healthy curve (falling, or flat with noise) has a line
  that falls, or rises by a few standard errors of a median (~0.003 for 500 steps of 1% noise).
Each finding carries the numbers a person needs (value, baseline = the trend, threshold, steps), a
sentence, and for the trend rules a `TrendJudgement`: the trend, its slope, the spread, the margin
and the distance above the trend in spreads.

Cost: one pass is O(N x W) for N records and a window W, the W part a memmove in C: the trend's
medians come from sorted groups kept as the window slides; the spread (O(W log W)) is computed only for a value already
above the trend + the floor. 3,000 steps (every rule) in 15-27 ms on the shared 2-core machine
(bench/spike_sensitivity.py writes the figure), so ~0.15 s for a month of BLOOM's steps (~30k).
`since_step` keeps the findings whose rule was met after that step (the controller passes the
last step it judged), over the whole lineage, so an episode that straddles two passes is found
once, when its rule is met.

Rollback planner (`plan_rollback`): the newest verified checkpoint with step <= onset - 1 -
rollback_margin_steps whose consumed_samples agree with the lineage (a checkpoint of an abandoned
history is never chosen); skip [that checkpoint's consumed_samples, the onset step's consumed
samples + rollback_skip_margin_batches x its global batch); the LR cut of the config; and the
budget: with `rollback_budget` rollbacks already in the last `rollback_budget_hours` (times of the
controller's own clock) the decision is to stop and call a person.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from orchestrator.contract import StepMetrics
from orchestrator.contract.directive import Rollback
from orchestrator.contract.robust_trend import SlidingTrend, TrendFit

LOSS_SPIKE = "loss_spike"
GRAD_NORM_EXPLOSION = "grad_norm_explosion"
SKIP_STORM = "skip_storm"
DIVERGENCE = "divergence"
KINDS = (LOSS_SPIKE, GRAD_NORM_EXPLOSION, SKIP_STORM, DIVERGENCE)


@dataclass(frozen=True)
class TrainingFinding:
    kind: str
    onset_step: int  # the first step of the episode (a rollback goes back before it)
    step: int  # the step at which the rule was met
    value: float  # loss, grad norm, skipped steps, or the trend at the divergence window's end
    baseline: float  # the trend at the onset, allowed skips, or the trend at the window's start
    threshold: float
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    judged: TrendJudgement | None = None  # the trend rules' trend, spread, margin and distance

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "onset_step": self.onset_step,
            "step": self.step,
            "value": _round(self.value),
            "baseline": _round(self.baseline),
            "threshold": _round(self.threshold),
            "message": self.message,
            **self.details,
            **(self.judged.as_dict() if self.judged else {}),
        }


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def lineage(records: Iterable[StepMetrics], kept: list[StepMetrics] | None = None) -> list[StepMetrics]:
    """The records of the history that led to the newest one, oldest first: `kept` (a lineage
    already, extended in place when given) followed by `records`."""
    kept = [] if kept is None else kept
    for record in records:
        while kept and kept[-1].step >= record.step:
            kept.pop()
        kept.append(record)
    return kept


def _valid(record: StepMetrics) -> bool:
    return not record.skipped and _finite(record.loss)


# -- the rules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrendJudgement:
    """What a trend rule compared a value with: the trend at `trend_step` (the onset; the window's
    first step for divergence), its slope, the spread of the noise around it, the margin above the
    trend the value had to pass (the threshold is trend + margin) and how far above the trend it
    was, in spreads. In log units for the grad-norm rule."""

    trend: float
    trend_step: int
    slope: float  # per step
    spread: float
    margin: float
    spreads: float  # (value - trend) / spread; inf for a noiseless window
    window_steps: tuple[int, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "trend": _round(self.trend),
            "trend_step": self.trend_step,
            "trend_slope": _round(self.slope),
            "residual_spread": _round(self.spread),
            "margin": _round(self.margin),
            "spreads": _round(self.spreads) if math.isfinite(self.spreads) else None,
            "window_steps": list(self.window_steps),
        }


class Episode(NamedTuple):
    onset: int  # step of the first value above the threshold
    met: int  # step at which the run of values above it reached `consecutive`
    value: float  # at the onset
    fit: TrendFit  # the window's trend, frozen at the onset
    margin: float  # above the trend
    length: int  # consecutive values above the threshold
    peak: float

    def judgement(self) -> TrendJudgement:
        trend = self.fit.at(self.onset)
        spreads = (self.value - trend) / self.fit.spread if self.fit.spread > 0 else math.inf
        return TrendJudgement(
            trend, self.onset, self.fit.slope, self.fit.spread, self.margin, spreads, self.fit.window_steps
        )


def _episodes(
    steps: Sequence[int],
    values: Sequence[float],
    window: int,
    consecutive: int,
    floor: float,
    margin_for: Callable[[TrendFit], float],
    since_step: int,
) -> list[Episode]:
    """Runs of at least `consecutive` values above trend + margin, met after `since_step`. A run
    starts at a value above the trend of the `window` values before it by more than
    margin_for(that trend's fit) (never less than `floor`: the cheap test that spares the fit); the
    fit stays frozen for the run (the spike does not raise its own bar), which ends at the first
    value back under it, or after max(consecutive, window // 2) values: a trend extrapolated further
    than that is a guess (a value still above the window's new trend starts a new run)."""
    found: list[Episode] = []
    if len(values) <= window:
        return found
    trend = SlidingTrend(steps, values, window)
    run: _OpenRun | None = None

    def close(current: _OpenRun) -> None:
        if current.length >= consecutive and current.met is not None and current.met > since_step:
            found.append(
                Episode(
                    current.onset,
                    current.met,
                    current.value,
                    current.fit,
                    current.margin,
                    current.length,
                    current.peak,
                )
            )

    longest = max(consecutive, window // 2)
    for index in range(window, len(values)):
        step, value = steps[index], values[index]
        if run is not None and run.length < longest and value > run.fit.at(step) + run.margin:
            run.length += 1
            run.peak = max(run.peak, value)
            if run.length == consecutive:
                run.met = step
        elif run is not None:
            close(run)
            run = None
        if run is None and value > trend.trend_at(step) + floor:
            fit = trend.fit()
            margin = max(margin_for(fit), floor)
            if value > fit.at(step) + margin:
                run = _OpenRun(step, step if consecutive == 1 else None, value, fit, margin, 1, value)
        trend.advance()
    if run is not None:
        close(run)
    return found


@dataclass
class _OpenRun:
    """An episode being followed (see Episode)."""

    onset: int
    met: int | None
    value: float
    fit: TrendFit
    margin: float
    length: int
    peak: float


def loss_spikes(records: Sequence[StepMetrics], cfg, since_step: int = -1) -> list[TrainingFinding]:
    valid = [r for r in records if _valid(r)]
    steps, losses = [r.step for r in valid], [float(r.loss) for r in valid]
    episodes = _episodes(
        steps,
        losses,
        cfg.spike_window,
        cfg.spike_consecutive,
        cfg.spike_min_rise,
        lambda fit: cfg.spike_mad_k * fit.spread,
        since_step,
    )
    out = []
    for e in episodes:
        judged = e.judgement()
        threshold = judged.trend + judged.margin
        out.append(
            TrainingFinding(
                LOSS_SPIKE,
                e.onset,
                e.met,
                e.value,
                judged.trend,
                threshold,
                f"loss spike: loss {e.value:.4g} at step {e.onset} is {e.value - judged.trend:.3g} above its trend "
                f"{judged.trend:.4g} ({_slope_words(judged.slope)} over steps {judged.window_steps[0]}-"
                f"{judged.window_steps[1]}): {_spreads_words(judged)} (threshold {threshold:.4g} = trend + "
                f"max({cfg.spike_mad_k:g} spreads, {cfg.spike_min_rise:g})), for {e.length} consecutive steps "
                f"(rule: {cfg.spike_consecutive}); peak {e.peak:.4g}",
                {"consecutive": e.length, "peak": _round(e.peak)},
                judged,
            )
        )
    return out


def _slope_words(slope: float) -> str:
    return "flat" if slope == 0 else f"{'falling' if slope < 0 else 'rising'} {abs(slope):.3g}/step"


def _spreads_words(judged: TrendJudgement) -> str:
    if not math.isfinite(judged.spreads):
        return "the window has no noise (residual spread 0)"
    return f"{judged.spreads:.3g} residual spreads of {judged.spread:.3g}"


def grad_norm_explosions(records: Sequence[StepMetrics], cfg, since_step: int = -1) -> list[TrainingFinding]:
    """Judged on log(grad norm): grad norms are skewed (log-normal-like), and a trend of the logs is
    a trend of ratios, so "12x its trend" reads at once."""
    valid = [r for r in records if not r.skipped and _finite(r.grad_norm) and r.grad_norm > 0]
    steps, logs = [r.step for r in valid], [math.log(r.grad_norm) for r in valid]
    episodes = _episodes(
        steps,
        logs,
        cfg.grad_norm_window,
        cfg.grad_norm_consecutive,
        math.log(cfg.grad_norm_factor),
        lambda fit: cfg.grad_norm_mad_k * fit.spread,
        since_step,
    )
    out = []
    for e in episodes:
        judged = e.judgement()
        value, trend, threshold = (
            math.exp(e.value),
            math.exp(judged.trend),
            math.exp(judged.trend + judged.margin),
        )
        ratio = value / trend
        out.append(
            TrainingFinding(
                GRAD_NORM_EXPLOSION,
                e.onset,
                e.met,
                value,
                trend,
                threshold,
                f"grad-norm explosion: grad norm {value:.4g} at step {e.onset} is {ratio:.3g}x its trend {trend:.4g} "
                f"(the trend of log grad norms over steps {judged.window_steps[0]}-{judged.window_steps[1]}): "
                f"{_spreads_words(judged)} in log units (limit {threshold / trend:.3g}x = the larger of "
                f"{cfg.grad_norm_factor:g}x and {cfg.grad_norm_mad_k:g} spreads), for {e.length} consecutive "
                f"steps; peak {math.exp(e.peak):.4g}",
                {"consecutive": e.length, "peak": _round(math.exp(e.peak)), "ratio": _round(ratio)},
                judged,
            )
        )
    return out


def skip_storms(records: Sequence[StepMetrics], cfg, since_step: int = -1) -> list[TrainingFinding]:
    window, allowed = cfg.skip_storm_window, cfg.skip_storm_max
    out, in_storm = [], False
    skipped_steps: deque[int] = deque()  # the skipped steps in the window
    for record in records:
        step = record.step
        if record.skipped:
            skipped_steps.append(step)
        while skipped_steps and skipped_steps[0] <= step - window:
            skipped_steps.popleft()
        count = len(skipped_steps)
        if count > allowed and not in_storm:
            in_storm = True
            if step > since_step:
                out.append(
                    TrainingFinding(
                        SKIP_STORM,
                        skipped_steps[0],
                        step,
                        count,
                        allowed,
                        allowed + 1,
                        f"NaN/Inf skip storm: {count} of the last {window} steps (to step {step}) were skipped for a "
                        f"non-finite gradient, more than the {allowed} allowed; the first at step {skipped_steps[0]}",
                        {"skipped_steps": list(skipped_steps)},
                    )
                )
        elif count <= allowed:
            in_storm = False
    return out


def _window_trend(valid: Sequence[StepMetrics], window: int) -> TrendFit | None:
    """The resistant line of the last `window` valid losses (None before a full window)."""
    if len(valid) < window:
        return None
    last = valid[-window:]
    return SlidingTrend([r.step for r in last], [float(r.loss) for r in last], window).fit()


def _rise(fit: TrendFit) -> float:
    first, last = fit.window_steps
    return fit.window_slope * (last - first)


def divergence(records: Sequence[StepMetrics], cfg, since_step: int = -1) -> list[TrainingFinding]:
    """Judged at the end of the lineage; not new when the rule already held at since_step."""
    valid = [r for r in records if _valid(r)]
    fit = _window_trend(valid, cfg.divergence_window)
    if fit is None or valid[-1].step <= since_step:
        return []
    rise = _rise(fit)
    if rise <= cfg.divergence_min_rise:
        return []
    before = _window_trend([r for r in valid if r.step <= since_step], cfg.divergence_window)
    if before is not None and _rise(before) > cfg.divergence_min_rise:
        return []  # the same divergence, found by an earlier pass
    first, last = fit.window_steps
    onset = valid[-(cfg.divergence_window - cfg.divergence_window // 2)].step  # the newer half's first
    start, end = fit.window_line_at(first), fit.window_line_at(last)
    spreads = rise / fit.spread if fit.spread > 0 else math.inf
    judged = TrendJudgement(
        start, first, fit.window_slope, fit.spread, cfg.divergence_min_rise, spreads, fit.window_steps
    )
    return [
        TrainingFinding(
            DIVERGENCE,
            onset,
            last,
            end,
            start,
            start + cfg.divergence_min_rise,
            f"slow divergence: the loss's trend over steps {first}-{last} rises {rise:.3g}, from {start:.4g} to "
            f"{end:.4g} ({_slope_words(fit.window_slope)}; noise spread {fit.spread:.3g}), more than the allowed "
            f"{cfg.divergence_min_rise:g}",
            {"rise": _round(rise)},
            judged,
        )
    ]


def assess(records: Iterable[StepMetrics], cfg, since_step: int = -1) -> list[TrainingFinding]:
    """Every finding of the lineage of `records` whose rule was met after `since_step`, by onset."""
    history = lineage(records)
    found = [
        *loss_spikes(history, cfg, since_step),
        *grad_norm_explosions(history, cfg, since_step),
        *skip_storms(history, cfg, since_step),
        *divergence(history, cfg, since_step),
    ]
    return sorted(found, key=lambda f: (f.onset_step, KINDS.index(f.kind)))


def history_length(cfg) -> int:
    """How many recent steps of the lineage the rules need: twice the longest window (windows
    count valid steps; skipped ones take room too), plus the rollback margin (the planner checks
    checkpoints against the steps before the onset)."""
    windows = (cfg.spike_window, cfg.grad_norm_window, cfg.skip_storm_window, cfg.divergence_window)
    return 2 * max(windows) + cfg.rollback_margin_steps


def policy_for(finding: TrainingFinding, cfg) -> str:
    """notify | pause | rollback: the config's policy for this kind of finding."""
    return getattr(cfg.policy, finding.kind)


# -- the rollback planner ---------------------------------------------------------------------
@dataclass(frozen=True)
class RollbackCandidate:
    step: int
    consumed_samples: int
    verified: bool  # its manifest verifies and it was never reported damaged


@dataclass(frozen=True)
class RollbackPlan:
    decision: str  # "rollback", or "call_person" (budget spent, nothing to go back to)
    reason: str
    to_step: int | None = None
    skip_samples: tuple[tuple[int, int], ...] = ()
    lr_scale: float = 1.0
    lr_scale_steps: int = 0
    rollbacks_in_window: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "reason": self.reason,
            "to_step": self.to_step,
            "skip_samples": [list(r) for r in self.skip_samples],
            "lr_scale": self.lr_scale,
            "lr_scale_steps": self.lr_scale_steps,
            "rollbacks_in_window": self.rollbacks_in_window,
        }

    def directive(self, directive_id: str, requested_by: str, requested_at: float) -> Rollback:
        if self.decision != "rollback" or self.to_step is None:
            raise ValueError(f"no directive for a {self.decision!r} plan: {self.reason}")
        return Rollback(
            id=directive_id,
            to_step=self.to_step,
            skip_samples=self.skip_samples,
            lr_scale=self.lr_scale,
            lr_scale_steps=self.lr_scale_steps,
            reason=self.reason[:500],
            requested_by=requested_by,
            requested_at=requested_at,
        )


def rollbacks_in_window(rollback_times: Iterable[float], now: float, hours: float) -> int:
    since = now - hours * 3600.0
    return sum(1 for t in rollback_times if since < t <= now)


def plan_rollback(
    onset_step: int,
    checkpoints: Iterable[RollbackCandidate],
    records: Iterable[StepMetrics],
    cfg,
    rollback_times: Iterable[float],
    now: float,
) -> RollbackPlan:
    """Where to go back to and what to skip for a finding with this onset (see the module doc)."""
    used = rollbacks_in_window(rollback_times, now, cfg.rollback_budget_hours)
    if used >= cfg.rollback_budget:
        return RollbackPlan(
            "call_person",
            f"rollback budget spent: {used} rollbacks in the last "
            f"{cfg.rollback_budget_hours:g} h (budget {cfg.rollback_budget}); the run is paused "
            "until a person decides (runctl health, then runctl rollback or runctl resume)",
            rollbacks_in_window=used,
        )
    history = {r.step: r for r in lineage(records)}
    onset = history.get(onset_step)
    if onset is None or onset.consumed_samples is None or onset.global_batch is None:
        return RollbackPlan(
            "call_person",
            f"no metrics record with consumed_samples and global_batch for the "
            f"onset step {onset_step}: cannot compute the samples to skip",
            rollbacks_in_window=used,
        )
    latest_allowed = onset_step - 1 - cfg.rollback_margin_steps
    rejected = []
    for ckpt in sorted(checkpoints, key=lambda c: c.step, reverse=True):
        if ckpt.step > latest_allowed:
            continue
        seen = history.get(ckpt.step)
        if not ckpt.verified:
            rejected.append(f"step {ckpt.step} does not verify")
            continue
        if seen is not None and seen.consumed_samples != ckpt.consumed_samples:
            rejected.append(
                f"step {ckpt.step} is from another history (consumed_samples {ckpt.consumed_samples}, "
                f"the metrics say {seen.consumed_samples})"
            )
            continue
        end = onset.consumed_samples + cfg.rollback_skip_margin_batches * onset.global_batch
        skip = ((ckpt.consumed_samples, end),) if end > ckpt.consumed_samples else ()
        reason = (
            f"onset at step {onset_step}: back to step {ckpt.step} (the newest verified checkpoint at least "
            f"{cfg.rollback_margin_steps} steps before it), skipping samples [{ckpt.consumed_samples}, {end}) "
            f"(to the onset's {onset.consumed_samples} + {cfg.rollback_skip_margin_batches} batches of "
            f"{onset.global_batch})"
        )
        if cfg.lr_scale != 1.0:
            reason += f", LR x{cfg.lr_scale:g} for {cfg.lr_scale_steps} steps"
        return RollbackPlan("rollback", reason, ckpt.step, skip, cfg.lr_scale, cfg.lr_scale_steps, used)
    why = "; ".join(rejected) if rejected else "none saved that early"
    return RollbackPlan(
        "call_person",
        f"no verified checkpoint at or before step {latest_allowed} (onset "
        f"{onset_step} - 1 - margin {cfg.rollback_margin_steps}): {why}",
        rollbacks_in_window=used,
    )
