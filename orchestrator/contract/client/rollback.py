"""The trainer's side of a rollback directive (orchestrator/contract/directive.py): which checkpoint
to resume from, and the bookkeeping every later checkpoint carries in its trainer_state.json.

A directive (accepted/rollback, written by the owner's controller) is applied at most once: the
ids of the directives a run applied are part of every later checkpoint's state. At start:
- no directive, or its id is among those the checkpoint considered has applied: that checkpoint
  is an ordinary candidate (the newest verified one first, as always);
- otherwise a checkpoint newer than `to_step` is passed over (it belongs to the history being
  abandoned), and the newest verified checkpoint with step <= to_step is resumed with the
  directive applied. None: the trainer refuses to start (exit CONFIG_ERROR) rather than go back to
  the initial weights, unless to_step is 0.
The state resumed with (`RollbackState`):
- applied ids: the checkpoint's, the directive's, and those of the checkpoints passed over;
- skips: the checkpoint's ranges (skipped in its history), plus the directive's and the passed-over
  checkpoints' ranges from the checkpoint's data position on (positions below it were trained on
  in this history, and the sampler counts kept samples from the start). A skip list only grows:
  data once judged bad is never served again by this run;
- LR: with the directive, x lr_scale for the steps (checkpoint step, + lr_scale_steps]; without,
  the checkpoint's window.
So a later resume, from any later checkpoint, with or without the file still in place, keeps the
skips and the LR window, and never rolls back twice (tests/trainer/test_training_health_runs.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from orchestrator.contract.client.skips import SampleSkips
from orchestrator.contract.directive import CheckpointState, Rollback


@dataclass(frozen=True)
class RollbackState:
    applied: tuple[str, ...] = ()
    skips: SampleSkips = field(default_factory=SampleSkips)
    lr_scale: float = 1.0
    lr_scale_last_step: int = 0  # steps up to and including this one run at lr_scale

    def lr_factor(self, step: int) -> float:
        """The LR multiplier of optimizer step `step` (1-based: the step being taken)."""
        return self.lr_scale if step <= self.lr_scale_last_step else 1.0

    @classmethod
    def of(cls, state: CheckpointState | None) -> RollbackState:
        if state is None:  # a checkpoint from before trainer_state.json
            return cls()
        return cls(
            state.applied_directives,
            SampleSkips(state.skip_samples),
            state.lr_scale,
            state.lr_scale_last_step,
        )

    def checkpoint_state(
        self, step: int, consumed_samples: int, lr_samples: int, skipped_total: int, global_batch: int
    ) -> CheckpointState:
        return CheckpointState(
            step=step,
            consumed_samples=consumed_samples,
            lr_samples=lr_samples,
            skipped_total=skipped_total,
            global_batch=global_batch,
            applied_directives=self.applied,
            skip_samples=self.skips.ranges,
            lr_scale=self.lr_scale,
            lr_scale_last_step=self.lr_scale_last_step,
        )


def has_applied(state: CheckpointState | None, directive: Rollback) -> bool:
    return state is not None and directive.id in state.applied_directives


def passed_over(directive: Rollback | None, step: int, state: CheckpointState | None) -> bool:
    """True: a checkpoint of the history the directive abandons (newer than its target, not applied)."""
    return directive is not None and not has_applied(state, directive) and step > directive.to_step


def resume_state(
    state: CheckpointState | None,
    directive: Rollback | None,
    step: int,
    consumed_samples: int,
    passed: Iterable[CheckpointState | None] = (),
) -> RollbackState:
    """The rollback state to resume checkpoint (`step`, `consumed_samples`, `state`) with."""
    current = RollbackState.of(state)
    if directive is None or has_applied(state, directive):
        return current
    abandoned = [s for s in passed if s is not None]
    ahead = SampleSkips([*directive.skip_samples, *(r for s in abandoned for r in s.skip_samples)])
    applied = list(current.applied)
    for ident in [*(i for s in abandoned for i in s.applied_directives), directive.id]:
        if ident not in applied:
            applied.append(ident)
    lr_window = (
        (directive.lr_scale, step + directive.lr_scale_steps) if directive.lr_scale_steps else (1.0, 0)
    )
    return RollbackState(
        tuple(applied), current.skips.union(ahead.from_position(consumed_samples)), *lr_window
    )


def describe(directive: Rollback, step: int, resumed: RollbackState) -> str:
    cut = (
        f", LR x{resumed.lr_scale:g} to step {resumed.lr_scale_last_step}"
        if resumed.lr_scale_last_step > step
        else ""
    )
    return (
        f"rollback {directive.id} applied: resumed from step {step} (asked: <= {directive.to_step}), "
        f"skipping samples {resumed.skips.as_lists()}{cut} ({directive.reason or 'no reason given'}, by "
        f"{directive.requested_by or '?'})"
    )
