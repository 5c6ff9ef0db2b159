"""Learning-rate and batch-size-rampup schedules, Megatron's, as pure functions of sample counts.

Both are functions of samples, not steps, so that a run whose global batch changes (rampup) or
that skips steps (non-finite gradients) stays on the same curve, and so that a resume needs
nothing but the two counters stored in the checkpoint:

- `lr_at(samples)`: Megatron's `OptimizerParamScheduler` in sample mode. `samples` counts the
  samples of *applied* steps (DeepSpeed, like Megatron, does not advance the scheduler on a
  skipped step).
- `global_batch_at(consumed_samples)`: Megatron's `RampupBatchsizeNumMicroBatches` (BLOOM:
  --rampup-batch-size 192 16 9_765_625). `consumed_samples` counts every sample read, skipped
  steps included (the data position).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup from 0 to `max_lr` over `warmup_samples`, then decay to `min_lr` at
    `decay_samples` (cosine, linear or constant), then `min_lr` for ever."""

    max_lr: float
    min_lr: float
    warmup_samples: int
    decay_samples: int
    style: Literal["cosine", "linear", "constant"] = "cosine"

    def __post_init__(self) -> None:
        if self.min_lr > self.max_lr:
            raise ValueError(f"min_lr ({self.min_lr}) must not exceed max lr ({self.max_lr})")
        if self.warmup_samples < 0:
            raise ValueError(f"warmup_samples must be >= 0, got {self.warmup_samples}")
        if self.style != "constant" and self.decay_samples <= self.warmup_samples:
            raise ValueError(
                f"decay_samples ({self.decay_samples}) must exceed warmup_samples ({self.warmup_samples}): "
                "lower optimizer.warmup_samples or raise optimizer.decay_samples"
            )

    def lr_at(self, samples: int) -> float:
        if self.warmup_samples > 0 and samples <= self.warmup_samples:
            return self.max_lr * samples / self.warmup_samples
        if self.style == "constant":
            return self.max_lr
        if samples > self.decay_samples:
            return self.min_lr
        ratio = (samples - self.warmup_samples) / (self.decay_samples - self.warmup_samples)
        if self.style == "linear":
            coeff = 1.0 - ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


@dataclass(frozen=True)
class BatchRampup:
    """Global batch `start`, grown by `increment` every `samples / n_increments` consumed samples
    until it reaches `global_batch`; from `samples` on, `global_batch`.

    `micro_times_dp` = micro_batch_size x dp: every batch of the ramp must be a multiple of it
    (the engine runs batch / micro_times_dp gradient-accumulation steps).
    """

    global_batch: int
    micro_times_dp: int
    start: int | None = None
    increment: int | None = None
    samples: int | None = None

    def __post_init__(self) -> None:
        if self.global_batch % self.micro_times_dp:
            raise ValueError(
                f"global batch {self.global_batch} is not a multiple of micro_batch_size x dp = {self.micro_times_dp}"
            )
        if self.start is None:
            return
        assert self.increment is not None and self.samples is not None
        if self.start > self.global_batch:
            raise ValueError(f"rampup.start ({self.start}) exceeds the global batch ({self.global_batch})")
        if (self.global_batch - self.start) % self.increment:
            raise ValueError(
                f"global batch - rampup.start = {self.global_batch - self.start} is not a multiple of "
                f"rampup.increment ({self.increment})"
            )
        for batch in range(self.start, self.global_batch + 1, self.increment):
            if batch % self.micro_times_dp:
                raise ValueError(
                    f"rampup batch {batch} is not a multiple of micro_batch_size x dp = {self.micro_times_dp}: "
                    "choose rampup.start and rampup.increment as multiples of it"
                )

    @property
    def ramps(self) -> bool:
        return self.start is not None and self.start < self.global_batch

    def global_batch_at(self, consumed_samples: int) -> int:
        if not self.ramps:
            return self.global_batch
        assert self.start is not None and self.increment is not None and self.samples is not None
        if consumed_samples > self.samples:
            return self.global_batch
        n_increments = (self.global_batch - self.start) // self.increment
        samples_per_increment = self.samples / n_increments
        steps = int(consumed_samples / samples_per_increment)
        return min(self.global_batch, self.start + steps * self.increment)

    def micro_batches_at(self, consumed_samples: int) -> int:
        return self.global_batch_at(consumed_samples) // self.micro_times_dp


def lr_schedule_from_config(cfg) -> LRSchedule:  # cfg: orchestrator.plan.config.RunConfig
    opt = cfg.optimizer
    return LRSchedule(
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        warmup_samples=opt.warmup_samples,
        decay_samples=cfg.decay_samples,
        style=opt.decay_style,
    )


def rampup_from_config(cfg) -> BatchRampup:
    par = cfg.parallel
    ramp = par.rampup
    return BatchRampup(
        global_batch=par.global_batch_size,
        micro_times_dp=par.micro_batch_size * cfg.dp,
        start=ramp.start if ramp else None,
        increment=ramp.increment if ramp else None,
        samples=ramp.samples if ramp else None,
    )
