"""Synthetic loss curves for the training-health rules: healthy ones shaped like real runs, and the
problems the rules must find injected into them (tests/unit/test_training_health.py,
bench/spike_sensitivity.py).

A healthy run: the loss falls with the LR's integral (a plateau during the linear LR warm-up, a
steep early descent, a slower one as the cosine decay brings the LR down), noise that shrinks with
the LR, 1% of steps a "hard batch" (+0.15 to +0.4, never two in a row), rare NaN skips, skewed grad
norms that fall and shrink with the LR. Each seed draws its own warm-up length, descent speed,
start and floor.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from orchestrator.contract import StepMetrics


@dataclass(frozen=True)
class CurveShape:
    warmup_steps: int
    tau: float  # steps at the peak LR for the early descent to fall by e
    start: float  # the loss before training
    floor: float  # where the descent tends
    slow_drop: float  # the slow descent over the run, on top of the early one
    noise: float  # the noise's standard deviation at the end of the decay (1.5x that at the peak LR)

    @classmethod
    def draw(cls, rng: random.Random) -> CurveShape:
        return cls(
            warmup_steps=rng.randint(30, 300),
            tau=rng.uniform(60.0, 200.0),
            start=rng.uniform(10.0, 11.0),
            floor=rng.uniform(2.4, 2.8),
            slow_drop=rng.uniform(0.2, 0.6),
            noise=rng.uniform(0.01, 0.025),
        )


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0.1."""
    if step <= warmup:
        return step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def healthy_run(seed: int, steps: int = 3000) -> list[StepMetrics]:
    rng = random.Random(seed)
    shape = CurveShape.draw(rng)
    out, integral, bumped = [], 0.0, False
    total = sum(lr_factor(s, steps, shape.warmup_steps) for s in range(1, steps + 1))
    for step in range(1, steps + 1):
        lr = lr_factor(step, steps, shape.warmup_steps)
        integral += lr
        trend = (
            shape.floor
            + (shape.start - shape.floor) * math.exp(-integral / shape.tau)
            + shape.slow_drop * (1 - integral / total)
        )
        loss = trend + rng.gauss(0, shape.noise * (1 + 0.5 * lr))
        bumped = not bumped and rng.random() < 0.01
        if bumped:
            loss += rng.uniform(0.15, 0.4)
        grad = (0.4 + 4.0 * math.exp(-integral / 200)) * (0.5 + lr) * math.exp(rng.gauss(0, 0.3))
        out.append(_record(step, loss, grad, skipped=rng.random() < 0.002))
    return out


def flat_run(seed: int, steps: int = 3000, level: float = 3.0, noise: float = 0.02) -> list[StepMetrics]:
    """A plateau: the level, normal noise, the same hard batches and skips as a healthy run."""
    rng = random.Random(10_000 + seed)
    out, bumped = [], False
    for step in range(1, steps + 1):
        loss = level + rng.gauss(0, noise)
        bumped = not bumped and rng.random() < 0.01
        if bumped:
            loss += rng.uniform(0.15, 0.4)
        out.append(_record(step, loss, 0.5 * math.exp(rng.gauss(0, 0.3)), skipped=rng.random() < 0.002))
    return out


def _record(step: int, loss: float, grad: float, skipped: bool) -> StepMetrics:
    return StepMetrics(
        step=step,
        time=float(step),
        loss=None if skipped else loss,
        grad_norm=None if skipped else grad,
        skipped=skipped,
        consumed_samples=step * 8,
        global_batch=8,
    )


def with_spike(run: list[StepMetrics], onset: int, length: int, fraction: float) -> list[StepMetrics]:
    """The loss of steps onset..onset+length-1 raised by `fraction` of itself (a skipped step stays)."""
    return [
        replace(r, loss=r.loss * (1 + fraction)) if onset <= r.step < onset + length and r.loss is not None else r
        for r in run
    ]


def with_drift(run: list[StepMetrics], start: int, length: int, fraction: float) -> list[StepMetrics]:
    """From step `start` on, the loss rises linearly by `fraction` of itself over `length` steps."""
    return [
        replace(r, loss=r.loss * (1 + fraction * min(1.0, (r.step - start) / length)))
        if r.step > start and r.loss is not None
        else r
        for r in run
    ]


def with_grad_burst(run: list[StepMetrics], onset: int, length: int, factor: float) -> list[StepMetrics]:
    return [
        replace(r, grad_norm=r.grad_norm * factor)
        if onset <= r.step < onset + length and r.grad_norm is not None
        else r
        for r in run
    ]
