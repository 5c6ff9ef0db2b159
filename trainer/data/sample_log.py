"""Which samples each step read: logs/samples-dp<d>.jsonl, with TRAINER_SAMPLE_LOG=1 (tests, audits).

One line per step, written by the first-stage, TP-rank-0 rank of DP replica d: {"step": N,
"positions": [...]}, the positions of the global sample order (docs/data.md) that its
micro-batches of step N read, in the order read. A resumed or rolled-back process appends, so the
file also holds the steps a rollback abandoned: the history the run kept is, step by step, the
last line written for each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.contract import append_jsonl


class _Recording:
    """The dataset, noting each position read."""

    def __init__(self, dataset, read: list[int]) -> None:
        self.dataset, self.read = dataset, read

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, position: int) -> dict[str, Any]:
        self.read.append(int(position))
        return self.dataset[position]


class SampleLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: off
        self.read: list[int] = []

    def wrap(self, dataset):
        return dataset if self.path is None else _Recording(dataset, self.read)

    def step_done(self, step: int) -> None:
        if self.path is not None:
            append_jsonl(self.path, {"step": step, "positions": list(self.read)})
            self.read.clear()
