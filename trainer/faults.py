"""TEST-ONLY fault injection: env TRAINER_FAULT makes a rank fail on purpose at a given step.

    TRAINER_FAULT=nan@step5,hang@step7:rank1        KIND@stepN[:rankR], comma-separated

Kinds (what happens at the start of step N, on every rank or only on rank R):
    nan      the loss (hence every gradient) of step N is NaN: the step must be skipped and logged
    hang     sleep for ever (the heartbeat thread keeps beating; progress stands still)
    crash    os._exit(1) (no checkpoint, no cleanup, like a segfault)
    sigkill  SIGKILL itself
    sigusr1  send itself SIGUSR1 (the pre-timeout signal)
    slow     from step N on, burn SLOW_BUSY_CPU_SECONDS of busy CPU before every step (a straggler:
             its compute time per step rises, its peers wait for it in the collectives)

Kinds for the asynchronous checkpoint of step N (trainer.async_checkpoint calls
`at_checkpoint(stage, step)`; stage "snapshot" = the host copy in the training thread, "write" =
before each file the background writer persists):
    killsnapshot  SIGKILL itself during the snapshot of step N's save
    killwrite     SIGKILL itself in the writer after step N's first file is on disk
    slowwrite     the writer sleeps SLOW_WRITE_SECONDS before the first file of every save from step N on
                  (makes "the process exits while a write is in flight" deterministic)

Kinds for the node health check (trainer.health), aimed at a node, not a step: KIND@NODE
(SLURMD_NODENAME), e.g. TRAINER_FAULT=health_memory@node03. The trainer ignores them.
    health_memory       the free-memory check reads MemAvailable as 0
    health_dir          the directory probes fail as on a read-only filesystem
    health_unreachable  the node dials the wrong port of the rendezvous store (cannot join)
Like every fault, only from the environment of the process: nothing in the run directory turns one on.

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

KINDS = ("nan", "hang", "crash", "sigkill", "sigusr1", "killsnapshot", "killwrite", "slowwrite", "slow")
CHECKPOINT_KINDS = ("killsnapshot", "killwrite", "slowwrite")
HEALTH_KINDS = ("health_memory", "health_dir", "health_unreachable")
SLOW_WRITE_SECONDS = 1.5
# CPU seconds (of this thread, so the same amount however loaded the machine is) a `slow` rank
# burns per step: several times the tiny test models' compute per step.
SLOW_BUSY_CPU_SECONDS = 1.0


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
            if kind in HEALTH_KINDS:
                continue  # for trainer.health (health_faults)
            where, _, rank = rest.partition(":")
            if kind not in KINDS or not where.startswith("step") or (rank and not rank.startswith("rank")):
                raise ValueError
            faults.append(Fault(kind, int(where[4:]), int(rank[4:]) if rank else None))
        except ValueError:
            raise ValueError(
                f"TRAINER_FAULT item {item!r}: expected KIND@stepN[:rankR] with KIND in {KINDS}"
            ) from None
    return faults


def health_faults(text: str, node: str) -> set[str]:
    """The health-check fault kinds aimed at `node`: 'health_memory@node03' -> {'health_memory'}
    on node03, set() elsewhere. Other kinds are the trainer's (parse_faults)."""
    kinds = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, target = item.partition("@")
        if kind in HEALTH_KINDS and target == node:
            kinds.add(kind)
    return kinds


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
            if fault.kind == "slow" and step >= fault.step:
                burn_cpu(SLOW_BUSY_CPU_SECONDS)
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


def burn_cpu(seconds: float) -> None:
    """Busy work on this thread until its CPU time has advanced by `seconds` (a slow GPU/CPU)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))
