"""orchestrator/contract/training_health.py: the detection rules and the rollback planner, on plain records.

Expected values are computed by hand in the comments (medians, MADs, thresholds), not with the
module's formulas; the healthy curves are synthetic but shaped like real ones (a warm-up drop, a
cosine LR decay that shrinks the noise, skewed "hard batch" bumps, rare NaN skips), many seeds.
"""

from __future__ import annotations

import math
import random
import time

import pytest

from orchestrator.contract import StepMetrics
from orchestrator.contract.training_health import (
    DIVERGENCE,
    GRAD_NORM_EXPLOSION,
    LOSS_SPIKE,
    SKIP_STORM,
    RollbackCandidate,
    assess,
    divergence,
    lineage,
    plan_rollback,
    policy_for,
)
from orchestrator.plan.config.schema import HealthConfig
from tests.health_curves import flat_run, healthy_run, with_drift, with_grad_burst, with_spike

DEFAULTS = HealthConfig()


def records(losses, grad_norms=None, skipped=(), start=1, batch=8):
    """Metrics records for consecutive steps from `start`; consumed_samples = step * batch."""
    out = []
    for i, loss in enumerate(losses):
        step = start + i
        out.append(StepMetrics(step=step, time=float(step), loss=None if step in skipped else loss,
                               skipped=step in skipped,
                               grad_norm=None if step in skipped else (grad_norms[i] if grad_norms else 1.0),
                               consumed_samples=step * batch, global_batch=batch, lr=1e-4))
    return out


# -- loss spike ---------------------------------------------------------------------------------
# Window 10 (steps 1-10): the slope is the line through the medians of its two groups of 5 (steps
# 1-5: 3.00 3.02 2.98 3.01 2.99 -> 3.00 at step 3; steps 6-10: the same -> 3.00 at 8): 0. The level
# is the median of the newest 5 (3.00 at step 8): the trend at step 11 is 3.00. First
# differences .02 -.04 .03 -.02 .01 .02 -.04 .03 -.02: median .01, |d - .01| sorted 0 .01 .01 .02
# .02 .03 .03 .05 .05 -> MAD .02; spread 1.4826 x .02 / sqrt(2) = 0.020967; 5 spreads = 0.104835 >
# the 0.1 floor: threshold 3.104835.
CALM = [3.00, 3.02, 2.98, 3.01, 2.99, 3.00, 3.02, 2.98, 3.01, 2.99]
SMALL = HealthConfig(spike_window=10, grad_norm_window=10, divergence_window=20)


def test_spike_of_three_steps_is_found_with_its_numbers():
    found = assess(records(CALM + [3.5, 3.6, 3.4, 3.0]), SMALL)
    assert [f.kind for f in found] == [LOSS_SPIKE]
    spike = found[0]
    assert (spike.onset_step, spike.step) == (11, 13)
    assert spike.baseline == pytest.approx(3.00) and spike.threshold == pytest.approx(3.104835, abs=1e-6)
    judged = spike.judged
    assert judged.spread == pytest.approx(0.020967, abs=1e-6) and judged.slope == 0.0
    assert judged.spreads == pytest.approx(0.5 / 0.020967, rel=1e-4) and judged.window_steps == (1, 10)
    assert spike.details == {"consecutive": 3, "peak": 3.6}
    assert "loss 3.5 at step 11 is 0.5 above its trend 3 (flat over steps 1-10): 23.8 residual spreads of 0.021" in (
        spike.message
    )
    print(spike.message)


def test_two_steps_up_or_a_rise_below_the_bar_is_no_spike():
    assert assess(records(CALM + [3.5, 3.6, 3.0, 3.0]), SMALL) == []  # 2 < 3 consecutive
    assert assess(records(CALM + [3.104, 3.104, 3.104, 3.0]), SMALL) == []  # under 3.104835


def test_a_ten_percent_spike_on_a_falling_curve_is_found():
    # Shaped like the demo's curve at steps 14-37: falling 0.028 a step with noise of +-0.03, then
    # steps 34-37 at +10% (+0.77). Window 20 before step 34: the median of its levels is ~0.27 above
    # the trend at step 34 and their MAD is ~0.14 (mostly the descent), so median + 6 x 1.4826 x MAD
    # lies ~1.5 above the trend. The trend: two groups of 10 give the slope -0.028, the newest 5 the level;
    # the noise spread from differences is ~0.04: the spike is ~20 spreads. The steps after it, up to
    # 70, are no spike: the windows that hold the spike keep their slope (medians of 10).
    noise = [0.03, -0.03, 0.01, -0.01]
    clean = [8.3 - 0.028 * step + noise[step % 4] for step in range(1, 71)]
    spiked = [loss * 1.10 if 34 <= step <= 37 else loss for step, loss in enumerate(clean, start=1)]
    cfg = HealthConfig(spike_window=20, spike_consecutive=2)
    assert assess(records(clean), cfg) == []
    [spike] = assess(records(spiked), cfg)
    assert (spike.kind, spike.onset_step, spike.step, spike.details["consecutive"]) == (LOSS_SPIKE, 34, 35, 4)
    true_trend = 8.3 - 0.028 * 34
    assert spike.judged.trend == pytest.approx(true_trend, abs=0.03) and spike.judged.slope == pytest.approx(-0.028, abs=0.002)
    assert spike.judged.spreads > 15, spike.message
    print(spike.message)


def test_flat_noiseless_curve_needs_the_floor():
    # No noise: spread 0, so any rise would be infinitely many spreads; the floor (0.1) decides.
    flat = [3.0] * 10
    assert assess(records(flat + [3.0000001] * 3), SMALL) == []
    assert assess(records(flat + [3.09] * 3), SMALL) == []
    [spike] = assess(records(flat + [3.11] * 3), SMALL)
    assert spike.threshold == pytest.approx(3.1) and "no noise (residual spread 0)" in spike.message


def test_skipped_steps_do_not_break_a_spike_and_since_step_reports_once():
    series = records(CALM + [3.5, 3.6, 0.0, 3.4, 3.0], skipped={13})
    found = assess(series, SMALL)
    assert [(f.kind, f.onset_step, f.step) for f in found] == [(LOSS_SPIKE, 11, 14)]
    # A pass that judged up to step 12 had seen two spiking steps: the rule is met at step 14, after it.
    assert [f.step for f in assess(series, SMALL, since_step=12)] == [14]
    assert assess(series, SMALL, since_step=14) == []


def test_a_rolled_back_history_is_not_judged():
    # Steps 1-13 with a spike at 11-13, then a rollback to step 10 and calm steps 11-14.
    first = records(CALM + [3.5, 3.6, 3.4])
    again = records([3.0, 3.01, 2.99, 3.0], start=11)
    history = lineage(first + again)
    assert [r.step for r in history] == list(range(1, 15)) and history[10].loss == 3.0
    assert assess(first + again, SMALL) == []


# -- grad norm, storm, divergence --------------------------------------------------------------
def test_grad_norm_explosion_is_a_ratio_to_the_median():
    losses = [3.0] * 13
    # median of ten 1.0 = 1.0; factor 10 -> limit 10.0; 12.0 and 15.0 are 12x and 15x.
    found = assess(records(losses, [1.0] * 10 + [12.0, 15.0, 1.0]), SMALL)
    assert [(f.kind, f.onset_step, f.step) for f in found] == [(GRAD_NORM_EXPLOSION, 11, 12)]
    assert found[0].details["ratio"] == 12.0 and "12x its trend 1" in found[0].message
    assert assess(records(losses, [1.0] * 10 + [12.0, 1.0, 15.0]), SMALL) == []  # never 2 in a row
    assert assess(records(losses, [1.0] * 10 + [9.9, 9.9, 1.0]), SMALL) == []


def test_skip_storm_needs_more_than_the_allowed_skips_in_the_window():
    losses = [3.0] * 400
    five = {10, 20, 30, 40, 50}  # 5 in 100 steps: allowed (max 5)
    assert assess(records(losses, skipped=five), DEFAULTS) == []
    # A sixth at step 60 makes 6 in steps (-39, 60]; a second storm at 300-305 after a quiet stretch.
    storms = five | {60} | set(range(300, 306))
    found = [f for f in assess(records(losses, skipped=storms), DEFAULTS) if f.kind == SKIP_STORM]
    assert [(f.onset_step, f.step, f.value) for f in found] == [(10, 60, 6), (300, 305, 6)]
    assert "6 of the last 100 steps (to step 60) were skipped" in found[0].message


def test_divergence_is_a_rising_trend_over_the_window():
    # window 20: older half 3.00 (+-0.01) at median step 5.5, newer half 3.08 (+-0.01) at 15.5: the
    # line through them rises 0.08 / 10 = 0.008 a step, 0.152 over the window's 19 steps.
    older = [3.00, 3.01, 2.99] * 3 + [3.00]
    newer = [3.08, 3.09, 3.07] * 3 + [3.08]
    found = divergence(records(older + newer), SMALL)
    assert [(f.kind, f.onset_step, f.step) for f in found] == [(DIVERGENCE, 11, 20)]
    assert found[0].details["rise"] == pytest.approx(0.152) and "steps 1-20 rises 0.152" in found[0].message
    # newer half at 3.02: 0.002 a step, 0.038 over the window < 0.05
    assert divergence(records(older + [x - 0.06 for x in newer]), SMALL) == []
    # Already diverging when a pass judged step 20: not new at step 21.
    longer = records(older[:1] + older + newer)
    assert divergence(longer, SMALL, since_step=20) == []


# -- healthy curves (tests/health_curves.py) ----------------------------------------------------
ISSUE_POLICY = HealthConfig(spike_consecutive=2)  # 2 steps in a row, as the demo's rollback policy


def test_no_finding_on_healthy_curves_of_many_seeds():
    started = time.perf_counter()
    for seed in range(40):
        for run in (healthy_run(seed), flat_run(seed)):
            for cfg in (DEFAULTS, ISSUE_POLICY):
                found = assess(run, cfg)
                assert found == [], (seed, [f.message for f in found])
            for end in range(1000, 3001, 250):  # the divergence rule at many points of the run
                assert divergence(run[:end], DEFAULTS) == [], (seed, end)
    seconds = (time.perf_counter() - started) / 80
    print(f"one run: 3,000 steps assessed twice (+ 9 divergence checks) in {seconds * 1000:.1f} ms")


@pytest.mark.parametrize("seed", [3, 17])
def test_subtle_problems_in_healthy_curves_are_found(seed):
    # +10% for 4 steps on the steep descent (step 400) and on a plateau; +6% for 2 steps on a plateau
    # (bench/spike_sensitivity.py measures the smallest over 40 seeds); a +3% drift over the last 500
    # steps of a plateau.
    for run, onset, length, fraction in (
        (healthy_run(seed), 400, 4, 0.10),
        (flat_run(seed), 1500, 4, 0.10),
        (flat_run(seed), 1500, 2, 0.06),
    ):
        found = assess(with_spike(run, onset, length, fraction), ISSUE_POLICY)
        assert [f.kind for f in found] == [LOSS_SPIKE], [f.message for f in found]
        assert found[0].onset_step <= onset + length - 1 and found[0].step >= onset
    drifting = with_drift(flat_run(seed), 2500, 500, 0.03)
    assert [f.kind for f in assess(drifting, DEFAULTS)] == [DIVERGENCE]


def test_grad_norm_explosion_on_a_falling_grad_norm_is_judged_against_its_trend():
    # A grad norm falling e-fold in 60 steps (log-normal noise of 0.1): the median of steps 100-199
    # (1.04 at step 150) is 2.3x the trend at step 200 (0.45). Steps 200-201 at 15x the trend are
    # 6.5x that median: no finding for a ratio to the median (limit 10x), one for a ratio to the trend.
    rng = random.Random(7)
    falling = [12.5 * math.exp(-step / 60 + rng.gauss(0, 0.1)) for step in range(1, 261)]
    burst = [g * 15 if step in (200, 201) else g for step, g in enumerate(falling, start=1)]
    assert assess(records([3.0] * 260, falling), DEFAULTS) == []
    [found] = assess(records([3.0] * 260, burst), DEFAULTS)
    assert (found.kind, found.onset_step, found.step) == (GRAD_NORM_EXPLOSION, 200, 201)
    assert found.baseline == pytest.approx(12.5 * math.exp(-200 / 60), rel=0.2) and found.details["ratio"] > 10
    print(found.message)
    run = healthy_run(5)
    assert [f.kind for f in assess(with_grad_burst(run, 1200, 3, 12.0), DEFAULTS)] == [GRAD_NORM_EXPLOSION]
    assert assess(with_grad_burst(run, 1200, 3, 3.0), DEFAULTS) == []


def test_policy_is_per_finding():
    cfg = HealthConfig(policy={"loss_spike": "rollback", "skip_storm": "pause"})
    spike = assess(records(CALM + [3.5, 3.6, 3.4]), SMALL)[0]
    assert policy_for(spike, cfg) == "rollback" and policy_for(spike, DEFAULTS) == "notify"


# -- the planner ------------------------------------------------------------------------------
CKPTS = [RollbackCandidate(step, step * 8, True) for step in (100, 200, 300, 400)]
NOW = 1_000_000.0


def test_plan_goes_back_before_the_margin_and_skips_to_the_onset_plus_batches():
    cfg = HealthConfig(rollback_margin_steps=100, rollback_skip_margin_batches=10, lr_scale=0.5, lr_scale_steps=50)
    history = records([3.0] * 420)
    plan = plan_rollback(350, CKPTS, history, cfg, [], NOW)
    # newest checkpoint with step <= 350 - 1 - 100 = 249: step 200 (consumed 1600); onset consumed
    # 350 x 8 = 2800, + 10 batches of 8 = 2880.
    assert (plan.decision, plan.to_step, plan.skip_samples) == ("rollback", 200, ((1600, 2880),))
    assert (plan.lr_scale, plan.lr_scale_steps) == (0.5, 50)
    directive = plan.directive("rb-1", "controller", NOW)
    assert directive.to_step == 200 and directive.skip_samples == ((1600, 2880),)
    print(plan.reason)
    # step 200 unverified, and step 100 from another history: nothing left
    bad = [RollbackCandidate(100, 999, True), RollbackCandidate(200, 1600, False), *CKPTS[2:]]
    refused = plan_rollback(350, bad, history, cfg, [], NOW)
    assert refused.decision == "call_person" and "step 200 does not verify" in refused.reason
    assert "step 100 is from another history" in refused.reason


def test_budget_stops_the_loop_and_calls_a_person():
    cfg = HealthConfig(rollback_budget=2, rollback_budget_hours=24)
    history = records([3.0] * 420)
    day = 24 * 3600
    # One rollback 25 h ago (outside the window) and two in it: 2 used of 2.
    plan = plan_rollback(350, CKPTS, history, cfg, [NOW - day - 3600, NOW - 100, NOW - 50], NOW)
    assert plan.decision == "call_person" and plan.rollbacks_in_window == 2
    assert "2 rollbacks in the last 24 h (budget 2)" in plan.reason
    assert plan_rollback(350, CKPTS, history, cfg, [NOW - day - 3600, NOW - 100], NOW).decision == "rollback"
    with pytest.raises(ValueError, match="no directive"):
        plan.directive("rb-2", "controller", NOW)


def test_config_refuses_an_lr_cut_without_steps():
    with pytest.raises(ValueError, match="lr_scale = 0.5 needs lr_scale_steps > 0"):
        HealthConfig(lr_scale=0.5)
    with pytest.raises(ValueError, match="policy.loss_spike"):
        HealthConfig(policy={"loss_spike": "panic"})
    with pytest.raises(ValueError, match="spike_trend_k"):
        HealthConfig(spike_trend_k=5)  # unknown keys stay errors
    assert HealthConfig().grad_norm_mad_k == 6.0 and HealthConfig().spike_mad_k == 5.0
