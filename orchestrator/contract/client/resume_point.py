"""Which checkpoint a loop resumes from, and the rollback it then honours: the contract's rules
for a loop that is not ours (our trainer applies the same rules collectively, with probes and
universal conversions: trainer/resume.py).

- Candidates are the contract's (contract.resume_candidates): the newest complete checkpoint
  first, never one newer than `latest`.
- An accepted rollback directive not yet applied passes over every checkpoint newer than its
  `to_step`; the newest verified one at or before it is resumed with the directive applied
  (orchestrator/contract/client/rollback.py: skips, LR scale, applied ids).
- A candidate whose files do not match its manifest (size or sha256) is reported in
  checkpoints/damaged.jsonl by rank 0 and skipped, never deleted.

Every rank reads the same files; a loop that wants one reader broadcasts rank 0's answer itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.contract import (
    CheckpointState,
    Rollback,
    RunPaths,
    read_checkpoint_state,
    read_rollback,
    resume_candidates,
    step_of,
    verify_manifest,
)
from orchestrator.contract.manifest import DamageReport, report_damage

from . import rollback as rb
from .skips import SampleSkips


class NoCheckpointForRollback(RuntimeError):
    """The directive asks for a checkpoint at or before its step and none verifies."""


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path | None  # the folder to load the loop's own files from; None: start from scratch
    step: int  # the step it was saved after (0: none)
    consumed_samples: int  # the data position to read on from (skipped samples included)
    rollback: rb.RollbackState = field(default_factory=rb.RollbackState)
    applied_now: Rollback | None = None  # the directive this start applies (None: none, or applied before)
    damaged: tuple[str, ...] = ()  # candidates skipped because they did not verify

    @property
    def skips(self) -> SampleSkips:
        """Data positions never to read (kept across every later checkpoint)."""
        return self.rollback.skips

    def lr_factor(self, step: int) -> float:
        """The LR multiplier of optimizer step `step` (1-based: the step being taken)."""
        return self.rollback.lr_factor(step)

    def describe(self) -> str:
        if self.checkpoint is None:
            start = "no checkpoint: starting at step 0"
        else:
            start = f"resuming from {self.checkpoint.name} (step {self.step}, data position {self.consumed_samples})"
        if self.applied_now is not None:
            start += "; " + rb.describe(self.applied_now, self.step, self.rollback)
        return start


def find_resume_point(
    paths: RunPaths, job_id: str, rank: int, log: Callable[[str], None] = lambda _m: None
) -> ResumePoint:
    directive = read_rollback(paths)
    passed: list[CheckpointState | None] = []
    damaged: list[str] = []
    for found in resume_candidates(paths.checkpoints):
        step = step_of(found.name) or 0
        state = read_checkpoint_state(found)
        if rb.passed_over(directive, step, state):
            log(f"rollback {directive.id}: passing over {found.name} (newer than step {directive.to_step})")
            passed.append(state)
            continue
        problems = verify_manifest(found)
        if problems:
            damaged.append(found.name)
            if rank == 0:
                report_damage(paths.checkpoints, DamageReport(found.name, problems[:20], job_id, time.time()))
            log(f"{found.name} does not verify, skipped: {'; '.join(problems[:3])}")
            continue
        consumed = state.consumed_samples if state is not None else 0
        resumed = rb.resume_state(state, directive, step, consumed, passed)
        applied = directive if directive is not None and not rb.has_applied(state, directive) else None
        return ResumePoint(found, step, consumed, resumed, applied, tuple(damaged))
    if directive is not None and directive.to_step > 0 and not rb.has_applied(None, directive):
        raise NoCheckpointForRollback(
            f"accepted/rollback {directive.id} asks for a checkpoint at or before step {directive.to_step} and "
            "none verifies: give to_step 0 to restart from the initial weights, or withdraw the directive"
        )
    resumed = rb.resume_state(None, directive, 0, 0)
    return ResumePoint(None, 0, 0, resumed, directive, tuple(damaged))
