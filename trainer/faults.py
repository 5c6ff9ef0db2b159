"""TEST-ONLY fault injection: env TRAINER_FAULT makes a rank fail on purpose at a given step.

    TRAINER_FAULT=nan@step5,hang@step7:rank1        KIND@stepN[:rankR], comma-separated

Kinds (what happens at the start of step N, on every rank or only on rank R):
    nan      the loss (hence every gradient) of step N is NaN: the step must be skipped and logged
    hang     sleep for ever (the heartbeat thread keeps beating; progress stands still)
    crash    os._exit(1) (no checkpoint, no cleanup, like a segfault)
    sigkill  SIGKILL itself
    sigusr1  send itself SIGUSR1 (the pre-timeout signal)

Kinds for the asynchronous checkpoint of step N (trainer.async_checkpoint calls
`at_checkpoint(stage, step)`; stage "snapshot" = the host copy in the training thread, "write" =
before each file the background writer persists):
    killsnapshot  SIGKILL itself during the snapshot of step N's save
    killwrite     SIGKILL itself in the writer after step N's first file is on disk
    slowwrite     the writer sleeps SLOW_WRITE_SECONDS before the first file of every save from step N on
                  (makes "the process exits while a write is in flight" deterministic)

The training loop knows one hook, `FaultInjector.before_step(step)`, called before each step, and
wraps its loss function once (`wrap_loss`); without TRAINER_FAULT both do nothing. Kept out of the
loop so that production code reads without it (as nvidia-resiliency-ext keeps its injector apart).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.protocol import ExitCode

KINDS = ("nan", "hang", "crash", "sigkill", "sigusr1", "killsnapshot", "killwrite", "slowwrite")
CHECKPOINT_KINDS = ("killsnapshot", "killwrite", "slowwrite")
SLOW_WRITE_SECONDS = 1.5


@dataclass(frozen=True)
class Fault:
    """What to do at the start of step `step` (on `rank`, or every rank when None)."""

    kind: str
    step: int
    rank: int | None = None


def parse_faults(text: str) -> list[Fault]:
    """'nan@step5,hang@step7:rank1' -> [Fault('nan', 5), Fault('hang', 7, rank=1)]."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            kind, rest = item.split("@", 1)
            where, _, rank = rest.partition(":")
            if kind not in KINDS or not where.startswith("step") or (rank and not rank.startswith("rank")):
                raise ValueError
            faults.append(Fault(kind, int(where[4:]), int(rank[4:]) if rank else None))
        except ValueError:
            raise ValueError(
                f"TRAINER_FAULT item {item!r}: expected KIND@stepN[:rankR] with KIND in {KINDS}"
            ) from None
    return faults


class FaultInjector:
    """The faults of one rank. `before_step` acts on them; `wrap_loss` poisons the training loss
    of a `nan` step (never an evaluation's: the module is in eval mode then)."""

    def __init__(self, faults: list[Fault], rank: int):
        self.faults = [f for f in faults if f.rank is None or f.rank == rank]
        self.rank = rank
        self._nan_step = False

    def before_step(self, step: int) -> None:
        self._nan_step = False
        for fault in self.faults:
            if fault.step != step or fault.kind in CHECKPOINT_KINDS:
                continue
            print(f"[trainer rank {self.rank}] TEST FAULT {fault.kind} at step {step}", file=sys.stderr, flush=True)
            if fault.kind == "nan":
                self._nan_step = True
            elif fault.kind == "hang":
                while True:
                    time.sleep(3600)
            elif fault.kind == "crash":
                os._exit(int(ExitCode.FAILED))
            elif fault.kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.kind == "sigusr1":
                os.kill(os.getpid(), signal.SIGUSR1)

    def at_checkpoint(self, stage: str, step: int, files_written: int = 0) -> None:
        """Called by trainer.async_checkpoint: stage "snapshot" (once per save) or "write" (before
        each file the writer persists, with how many it has persisted already)."""
        for fault in self.faults:
            hit = (fault.kind == "killsnapshot" and stage == "snapshot" and fault.step == step) or (
                fault.kind == "killwrite" and stage == "write" and fault.step == step and files_written == 1)
            if hit:
                print(f"[trainer rank {self.rank}] TEST FAULT {fault.kind} at the save of step {step}",
                      file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if fault.kind == "slowwrite" and stage == "write" and step >= fault.step and files_written == 0:
                time.sleep(SLOW_WRITE_SECONDS)

    def wrap_loss(self, module: Any, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        if not any(f.kind == "nan" for f in self.faults):
            return loss_fn

        def poisoned(outputs, labels):
            loss = loss_fn(outputs, labels)
            return loss * float("nan") if self._nan_step and module.training else loss

        return poisoned
