"""metrics.jsonl: one line per training step, written by rank 0 (trainer/metrics.py), read by the
dashboard, the report, goodput, the exporter and training-health detection as `StepMetrics`.

A NaN or infinite value is written as null (JSON has no NaN) and reads back as None.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .files import ContractError, append_jsonl, check_version, loads_bounded, read_jsonl
from .values import int_or_none, number_or_none

METRICS_VERSION = 1


@dataclass(frozen=True)
class StepMetrics:
    step: int
    time: float  # rank 0's clock
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    skipped: bool = False  # non-finite gradient norm: the step was not applied
    skipped_total: int = 0
    global_batch: int | None = None
    consumed_samples: int | None = None
    step_seconds: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None  # Megatron's model FLOPs formula, recompute included
    eval_loss: float | None = None
    job_id: str | None = None  # SLURM's job id of the job that ran the step
    # Per data-parallel replica, its share of the loss (dp > 1): a replay (trainer.replay) names the
    # replica that diverged.
    dp_losses: list[float | None] | None = None
    version: int = METRICS_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for name in (
            "loss",
            "lr",
            "grad_norm",
            "step_seconds",
            "tokens_per_s",
            "tflops_per_gpu",
            "eval_loss",
        ):
            data[name] = number_or_none(data[name])
        for optional in ("eval_loss", "job_id", "dp_losses"):
            if data[optional] is None:
                data.pop(optional)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMetrics | None:
        """None for a line that is not a step's metrics (no integer step)."""
        check_version(data, "a metrics.jsonl line", METRICS_VERSION)
        step = int_or_none(data.get("step"))
        if step is None:
            return None
        return cls(
            step=step,
            time=number_or_none(data.get("time")) or 0.0,
            loss=number_or_none(data.get("loss")),
            lr=number_or_none(data.get("lr")),
            grad_norm=number_or_none(data.get("grad_norm")),
            skipped=data.get("skipped") is True,
            skipped_total=int_or_none(data.get("skipped_total")) or 0,
            global_batch=int_or_none(data.get("global_batch")),
            consumed_samples=int_or_none(data.get("consumed_samples")),
            step_seconds=number_or_none(data.get("step_seconds")),
            tokens_per_s=number_or_none(data.get("tokens_per_s")),
            tflops_per_gpu=number_or_none(data.get("tflops_per_gpu")),
            eval_loss=number_or_none(data.get("eval_loss")),
            job_id=None if data.get("job_id") is None else str(data.get("job_id")),
            dp_losses=[number_or_none(x) for x in data["dp_losses"]]
            if isinstance(data.get("dp_losses"), list)
            else None,
        )


def append_metrics(path: Path, record: StepMetrics) -> None:
    append_jsonl(path, record.to_dict())


def read_metrics(path: Path) -> list[StepMetrics]:
    """Every step's metrics, in file order."""
    return [m for m in (StepMetrics.from_dict(r) for r in read_jsonl(path)) if m is not None]


@dataclass(frozen=True)
class MetricsChunk:
    """The steps of the complete lines of metrics.jsonl between two offsets (`read_metrics_from`)."""

    records: list[StepMetrics]
    end: int  # the offset after the last complete line read: where the next read starts
    identity: tuple[int, int] | None  # (st_dev, st_ino) of the file read (None: no file)
    size: int = 0  # the file's size when read (smaller than an offset kept: truncated)
    aligned: bool = True  # the read began at the start of a line (not: inside one)


def read_metrics_from(path: Path, offset: int, max_bytes: int = 4 << 20) -> MetricsChunk:
    """The steps of the complete lines from byte `offset` on, at most `max_bytes` of them: a
    reader that keeps the returned `end` reads each line of the file once (metrics.jsonl grows for
    months). A last line still being written is left for the next call. When `offset` is inside a
    line (a reader priming itself from some way back), that line is skipped. A line that is not
    JSON, not a step or of a newer version is skipped too (a reader cannot stop on one line)."""
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            start = max(0, offset)
            if start > 0:  # inside a line unless the byte before is its end
                handle.seek(start - 1)
                inside = handle.read(1) != b"\n"
            else:
                inside = False
            chunk = handle.read(max_bytes)
    except FileNotFoundError:
        return MetricsChunk([], 0, None)
    identity, size = (info.st_dev, info.st_ino), info.st_size
    last_newline = chunk.rfind(b"\n")
    if last_newline < 0:
        # No complete line yet; a single line longer than max_bytes is not a metrics line: skipped.
        end = start + len(chunk) if len(chunk) >= max_bytes else start
        return MetricsChunk([], end, identity, size, not inside)
    lines = chunk[: last_newline + 1].split(b"\n")[:-1]
    if inside:
        lines = lines[1:]
    records = []
    for line in lines:
        try:
            data = loads_bounded(line) if line.strip() else None
            parsed = StepMetrics.from_dict(data) if isinstance(data, dict) else None
        except (ValueError, ContractError):
            continue
        if parsed is not None:
            records.append(parsed)
    return MetricsChunk(records, start + last_newline + 1, identity, size, not inside)


def tail_metrics(path: Path, max_bytes: int = 256 * 1024) -> list[StepMetrics]:
    """The steps in the last `max_bytes` of metrics.jsonl (it grows for months; a screen needs the
    end). A line cut by the window's start is skipped."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - max_bytes))
            chunk = handle.read()
    except OSError:
        return []
    lines = chunk.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]
    out = []
    for line in lines:
        try:
            record = loads_bounded(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(record, dict):
            parsed = StepMetrics.from_dict(record)
            if parsed is not None:
                out.append(parsed)
    return out
