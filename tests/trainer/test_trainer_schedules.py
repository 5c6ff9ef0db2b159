"""LR (warmup + cosine/linear by samples) and batch-size rampup vs their closed forms."""

from __future__ import annotations

import math

import pytest

from trainer.schedules import BatchRampup, LRSchedule, lr_schedule_from_config, rampup_from_config


def closed_form_lr(samples, max_lr, min_lr, warmup, decay, style):
    if samples <= warmup:
        return max_lr * samples / warmup
    if samples >= decay:
        return min_lr
    t = (samples - warmup) / (decay - warmup)
    coeff = {"cosine": (1 + math.cos(math.pi * t)) / 2, "linear": 1 - t, "constant": 1.0}[style]
    return min_lr + (max_lr - min_lr) * coeff


@pytest.mark.parametrize("style", ["cosine", "linear"])
def test_lr_matches_closed_form(style):
    sched = LRSchedule(max_lr=6e-5, min_lr=6e-6, warmup_samples=375, decay_samples=4000, style=style)
    worst = 0.0
    for samples in range(0, 5000, 7):
        worst = max(worst, abs(sched.lr_at(samples) - closed_form_lr(samples, 6e-5, 6e-6, 375, 4000, style)))
    print(f"{style}: max |lr - closed form| = {worst:.3e}")
    assert worst < 1e-18
    # Landmarks: 0 at start, peak at the end of warmup, halfway for cosine at the middle, min after decay.
    assert sched.lr_at(0) == 0.0
    assert sched.lr_at(375) == pytest.approx(6e-5, rel=1e-12)
    assert sched.lr_at(4001) == 6e-6
    if style == "cosine":
        assert sched.lr_at((375 + 4000) // 2) == pytest.approx((6e-5 + 6e-6) / 2, rel=1e-3)


def test_lr_constant_and_validation():
    assert LRSchedule(1e-3, 0.0, 10, 10, "constant").lr_at(500) == 1e-3
    with pytest.raises(ValueError, match="decay_samples"):
        LRSchedule(1e-3, 0.0, warmup_samples=100, decay_samples=50)
    with pytest.raises(ValueError, match="min_lr"):
        LRSchedule(1e-3, 1e-2, 0, 10)


def test_rampup_matches_megatron_closed_form():
    # BLOOM-176B's --rampup-batch-size 192 16 9_765_625 with global batch 2048, mbs 2 x dp 8.
    ramp = BatchRampup(global_batch=2048, micro_times_dp=16, start=192, increment=16, samples=9_765_625)
    n_inc = (2048 - 192) // 16
    per_inc = 9_765_625 / n_inc
    for consumed in [0, 1, int(per_inc) - 1, int(per_inc) + 1, 5_000_000, 9_765_625, 9_765_626, 10**9]:
        expected = 2048 if consumed > 9_765_625 else 192 + int(consumed / per_inc) * 16
        assert ramp.global_batch_at(consumed) == expected, consumed
        assert ramp.micro_batches_at(consumed) == expected // 16
    batches = {ramp.global_batch_at(c) for c in range(0, 10_000_000, 9_973)}
    assert min(batches) == 192 and max(batches) == 2048
    assert all(b % 16 == 0 for b in batches)


def test_rampup_walk_by_steps_is_monotone_and_reaches_global():
    ramp = BatchRampup(global_batch=12, micro_times_dp=2, start=2, increment=2, samples=30)
    consumed, seen = 0, []
    while consumed < 100:
        batch = ramp.global_batch_at(consumed)
        seen.append(batch)
        consumed += batch
    assert seen == sorted(seen) and seen[0] == 2 and seen[-1] == 12
    print("batches:", seen)


def test_rampup_rejects_bad_increments():
    with pytest.raises(ValueError, match="not a multiple of rampup.increment"):
        BatchRampup(global_batch=100, micro_times_dp=2, start=10, increment=7, samples=100)
    with pytest.raises(ValueError, match="micro_batch_size x dp"):
        BatchRampup(global_batch=12, micro_times_dp=4, start=2, increment=2, samples=30)
    assert not BatchRampup(global_batch=8, micro_times_dp=2).ramps


def test_schedules_from_tiny_config():
    from orchestrator.plan.config import load_config
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "tiny-cpu.yaml")
    lr = lr_schedule_from_config(cfg)
    assert lr.max_lr == cfg.optimizer.lr and lr.decay_samples == cfg.train_samples
    assert rampup_from_config(cfg).global_batch_at(0) == cfg.parallel.global_batch_size
