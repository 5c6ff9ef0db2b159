"""Per-step metrics: one JSON line in `metrics.jsonl` and TensorBoard scalars, on rank 0 only.

Fields of a metrics.jsonl line (orchestrator.contract.StepMetrics; the dashboard reads them):
    step, loss, lr, grad_norm, skipped (bool: non-finite grad norm, step not applied),
    skipped_total, global_batch, consumed_samples, step_seconds, tokens_per_s,
    tflops_per_gpu (Megatron's model FLOPs formula, recompute included), time (epoch seconds),
    and eval_loss on the steps where evaluation ran (every data.eval_interval steps; a fixed
    validation set of data.eval_iters global batches); with dp > 1, dp_losses: each DP replica's
    own loss, in DP-rank order (their mean is `loss`), for trainer/replay.py.
consumed_samples is the data position after the step (docs/data.md: a rollback's skipped samples
count); lr is the LR applied (a rollback's LR cut included). orchestrator/contract/training_health.py
judges these records.
A NaN/inf value is written as null (JSON has no NaN).
"""

from __future__ import annotations

import math
import os
import time

from orchestrator.contract import RunPaths, StepMetrics
from orchestrator.contract.metrics import append_metrics


def flops_per_iteration(cfg, global_batch: int) -> float:
    """FLOPs of one iteration (Megatron-LM / BLOOM's formula), recompute included when on:
    24 * f * B * s * l * h^2 * (1 + s/(6h) + V/(16 l h)), f = 4 with activation recompute, else 3
    (forward = 1, backward = 2, recompute = 1 more forward)."""
    # One formula for the planner and the trainer: the planner's (stdlib-only, safe to import here).
    from orchestrator.plan.planner import flops_per_iteration as planner_flops

    return float(planner_flops(cfg, global_batch, recompute=cfg.parallel.activation_checkpointing))


def _finite_or_none(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


class MetricsLogger:
    def __init__(self, cfg, paths: RunPaths, rank: int, world_size: int, tensorboard: bool = True):
        self.cfg = cfg
        self.paths = paths
        self.enabled = rank == 0
        self.world_size = world_size
        self._tb = None
        if self.enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(paths.tensorboard))
            except ImportError as exc:  # metrics.jsonl stays the record; say why TensorBoard is off
                print(f"[metrics] TensorBoard disabled ({exc}); install the `tensorboard` package", flush=True)

    def log_step(self, *, step: int, loss: float, lr: float, grad_norm: float | None, skipped: bool,
                 skipped_total: int, global_batch: int, consumed_samples: int, step_seconds: float,
                 eval_loss: float | None = None, dp_losses: list[float] | None = None) -> StepMetrics:
        tokens = global_batch * self.cfg.model.seq_length
        tflops = flops_per_iteration(self.cfg, global_batch) / (step_seconds * self.world_size * 1e12)
        record = StepMetrics(
            step=step,
            time=time.time(),
            loss=_finite_or_none(loss),
            lr=lr,
            grad_norm=_finite_or_none(grad_norm),
            skipped=skipped,
            skipped_total=skipped_total,
            global_batch=global_batch,
            consumed_samples=consumed_samples,
            step_seconds=step_seconds,
            tokens_per_s=tokens / step_seconds,
            tflops_per_gpu=tflops,
            eval_loss=_finite_or_none(eval_loss),
            job_id=os.environ.get("SLURM_JOB_ID"),
            dp_losses=None if dp_losses is None else [_finite_or_none(x) for x in dp_losses],
        )
        if not self.enabled:
            return record
        append_metrics(self.paths.metrics, record)
        if self._tb is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_gpu", "global_batch", "eval_loss"):
                value = getattr(record, key)
                if value is not None:
                    self._tb.add_scalar(f"train/{key}", value, step)
            self._tb.add_scalar("train/loss_vs_samples", record.loss or float("nan"), consumed_samples)
            self._tb.add_scalar("train/skipped_total", skipped_total, step)
        return record

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
