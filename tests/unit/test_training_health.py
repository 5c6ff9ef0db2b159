"""orchestrator/training_health.py: the detection rules and the rollback planner, on plain records.

Expected values are computed by hand in the comments (medians, MADs, thresholds), not with the
module's formulas; the healthy curves are synthetic but shaped like real ones (a warm-up drop, a
cosine LR decay that shrinks the noise, skewed "hard batch" bumps, rare NaN skips), many seeds.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

import pytest

from orchestrator.config.schema import HealthConfig
from orchestrator.contract import StepMetrics
from orchestrator.training_health import (
    DIVERGENCE,
    GRAD_NORM_EXPLOSION,
    LOSS_SPIKE,
    SKIP_STORM,
    CheckpointInfo,
    assess,
    divergence,
    lineage,
    plan_rollback,
    policy_for,
)

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
# The 10 values before the spike: sorted 2.98 2.98 2.99 2.99 3.00 3.00 3.01 3.01 3.02 3.02 -> median
# 3.00; |x - 3.00| sorted 0 0 .01 .01 .01 .01 .02 .02 .02 .02 -> MAD 0.01. 6 x 1.4826 x 0.01 =
# 0.0890 < min rise 0.1, so the threshold is 3.00 + 0.1 = 3.10.
CALM = [3.00, 3.02, 2.98, 3.01, 2.99, 3.00, 3.02, 2.98, 3.01, 2.99]
SMALL = HealthConfig(spike_window=10, grad_norm_window=10, divergence_window=20)


def test_spike_of_three_steps_is_found_with_its_numbers():
    found = assess(records(CALM + [3.5, 3.6, 3.4, 3.0]), SMALL)
    assert [f.kind for f in found] == [LOSS_SPIKE]
    spike = found[0]
    assert (spike.onset_step, spike.step) == (11, 13)
    assert spike.baseline == pytest.approx(3.00) and spike.threshold == pytest.approx(3.10)
    assert spike.details == {"consecutive": 3, "peak": 3.6}
    assert "loss 3.5 at step 11 is 0.5 above the median 3 of the 10 steps before (threshold 3.1)" in spike.message
    print(spike.message)


def test_two_steps_up_or_a_rise_below_the_bar_is_no_spike():
    assert assess(records(CALM + [3.5, 3.6, 3.0, 3.0]), SMALL) == []  # 2 < 3 consecutive
    assert assess(records(CALM + [3.09, 3.09, 3.09, 3.0]), SMALL) == []  # under 3.10


def test_mad_sets_the_bar_when_the_noise_is_larger():
    # Deviations of 0.05 around 3.0: median 3.0, MAD 0.05 -> 6 x 1.4826 x 0.05 = 0.44478: bar 3.44478.
    noisy = [3.05, 2.95] * 5
    assert assess(records(noisy + [3.44, 3.44, 3.44]), SMALL) == []
    found = assess(records(noisy + [3.45, 3.45, 3.45]), SMALL)
    assert [f.kind for f in found] == [LOSS_SPIKE] and found[0].threshold == pytest.approx(3.44478)


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
    assert found[0].details["ratio"] == 12.0 and "12x the median 1" in found[0].message
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


def test_divergence_compares_the_medians_of_two_halves():
    # window 20: older half 3.00 (+-0.01), newer half 3.08 (+-0.01): medians 3.00 and 3.08, rise 0.08.
    older = [3.00, 3.01, 2.99] * 3 + [3.00]
    newer = [3.08, 3.09, 3.07] * 3 + [3.08]
    found = divergence(records(older + newer), SMALL)
    assert [(f.kind, f.onset_step, f.step) for f in found] == [(DIVERGENCE, 11, 20)]
    assert found[0].details["rise"] == pytest.approx(0.08) and "steps 11-20 is 3.08" in found[0].message
    assert divergence(records(older + [x - 0.04 for x in newer]), SMALL) == []  # rise 0.04 < 0.05
    # Already diverging when a pass judged step 19: not new at step 20.
    longer = records(older[:1] + older + newer)
    assert divergence(longer, SMALL, since_step=20) == []


# -- healthy curves ----------------------------------------------------------------------------
def healthy_run(seed: int, steps: int = 3000):
    """A warm-up drop from ~10 to ~3, a slow decline under a cosine LR decay, noise that shrinks with
    the LR, 1% of steps a "hard batch" (+0.15 to +0.4, alone), rare NaN skips, skewed grad norms."""
    rng = random.Random(seed)
    out = []
    for step in range(1, steps + 1):
        lr_factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
        loss = 2.6 + 7.4 * math.exp(-step / 120) + 0.4 * (1 - step / steps) + rng.gauss(0, 0.03 + 0.05 * lr_factor)
        if rng.random() < 0.01:
            loss += rng.uniform(0.15, 0.4)
        grad = (0.4 + 4.0 * math.exp(-step / 200)) * math.exp(rng.gauss(0, 0.3))
        skipped = rng.random() < 0.002
        out.append(StepMetrics(step=step, time=float(step), loss=None if skipped else loss,
                               grad_norm=None if skipped else grad, skipped=skipped, consumed_samples=step * 8,
                               global_batch=8))
    return out


def test_no_finding_on_healthy_curves_of_many_seeds():
    started = time.perf_counter()
    for seed in range(40):
        run = healthy_run(seed)
        assert assess(run, DEFAULTS) == [], (seed, [f.message for f in assess(run, DEFAULTS)])
        for end in range(1000, 3001, 250):  # the divergence rule at many points of the run
            assert divergence(run[:end], DEFAULTS) == [], (seed, end)
    seconds = (time.perf_counter() - started) / 40
    print(f"one seed: 3,000 steps assessed (+ 9 divergence checks) in {seconds * 1000:.1f} ms")


def test_injected_problems_in_a_healthy_curve_are_found():
    run = healthy_run(1)
    run[1999:2004] = [replace(r, loss=r.loss + 1.5) for r in run[1999:2004]]  # steps 2000-2004: +1.5
    found = assess(run, DEFAULTS)
    assert [(f.kind, f.onset_step) for f in found] == [(LOSS_SPIKE, 2000)]
    diverging = healthy_run(2)
    diverging[2500:] = [  # from step 2501 the loss climbs 0.4 over 500 steps
        r if r.loss is None else replace(r, loss=r.loss + 0.4 * (r.step - 2500) / 500) for r in diverging[2500:]
    ]
    kinds = [f.kind for f in assess(diverging, DEFAULTS)]
    assert kinds == [DIVERGENCE], kinds


def test_policy_is_per_finding():
    cfg = HealthConfig(policy={"loss_spike": "rollback", "skip_storm": "pause"})
    spike = assess(records(CALM + [3.5, 3.6, 3.4]), SMALL)[0]
    assert policy_for(spike, cfg) == "rollback" and policy_for(spike, DEFAULTS) == "notify"


# -- the planner ------------------------------------------------------------------------------
CKPTS = [CheckpointInfo(step, step * 8, True) for step in (100, 200, 300, 400)]
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
    bad = [CheckpointInfo(100, 999, True), CheckpointInfo(200, 1600, False), *CKPTS[2:]]
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
