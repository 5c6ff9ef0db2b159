"""TEST-ONLY fault injection: env TRAINER_FAULT makes a rank fail on purpose at a given step.

    TRAINER_FAULT=nan@step5,hang@step7:rank1        KIND@stepN[:rankR|:NODE], comma-separated

A fault aimed at a node (`hang@step6:node02`) hits the rank running there (SLURMD_NODENAME) and
nobody once the node is left out: a bad node, not a bad rank.

Kinds (what happens at the start of step N, on every rank or only on rank R):
    nan      the loss (hence every gradient) of step N is NaN: the step must be skipped and logged
    hang     sleep for ever (the heartbeat thread keeps beating; progress stands still)
    crash    os._exit(1) (no checkpoint, no cleanup, like a segfault)
    raise    raise RuntimeError (a bug: the rank prints its traceback and exits 1)
    oom      raise MemoryError (out of memory: the rank exits 21, the controller blames no node)
    sigkill  SIGKILL itself
    sigusr1  send itself SIGUSR1 (the pre-timeout signal)
    slow     from step N on, burn SLOW_BUSY_CPU_SECONDS of busy CPU before every step (a straggler:
             its compute time per step rises, its peers wait for it in the collectives)
    slowmicro  steps N, N+1, N+2: burn SLOW_MICRO_CPU_SECONDS of busy CPU before each micro-batch's
             forward and backward (a slow rank whose micro-batches keep moving: not a hang)

Kinds for the save of step N (sync or async; called after each chunk a checkpoint writer writes,
trainer/progress_io.py):
    slowsave   sleep SLOW_SAVE_CHUNK_SECONDS after each chunk (a slow save whose bytes keep moving)
    hangsave   block for ever after the first chunk (a save whose writer blocks: a hang)

Kinds for training health (orchestrator/contract/training_health.py, trainer/probe.py):
    spike        the training loss (hence every gradient) of step N is multiplied by SPIKE_FACTOR: a
                 loss spike that comes back whenever step N is trained again (e.g. after a rollback)
    poison       poison@samplesA-B: every sample at a position in [A, B) of the global sample order is
                 marked (its last token becomes POISON_TOKEN) and the loss of a micro-batch holding
                 one is multiplied by SPIKE_FACTOR: a spike caused by data, which a rollback that
                 skips [A, B) removes for good
    corruptmaster  at the save of step N, after its probe was computed and before anything is written,
                 add 1.0 to the first CORRUPT_ELEMENTS fp32 master weights (a bit flip in memory before
                 the write: the files and their hashes agree, the probe at load does not)

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

from orchestrator.contract import ExitCode

KINDS = ("nan", "hang", "crash", "raise", "oom", "sigkill", "sigusr1", "killsnapshot", "killwrite", "slowwrite", "slow", "spike",
         "poison", "corruptmaster", "slowmicro", "slowsave", "hangsave")
SAVE_KINDS = ("slowsave", "hangsave")
SLOW_MICRO_STEPS = 3
# Tuned on the demo model (tests/controller/test_hang_slurm.py measures the factors): its 16
# micro-batches a step at global batch 32 take ~1.1 s, these make such a step ~5x as long; its save
# (~0.18 s) writes ~400 chunks, these make it ~10x as long. A test that needs other factors sets
# TRAINER_SLOW_MICRO_SECONDS / TRAINER_SLOW_SAVE_CHUNK_SECONDS.
SLOW_MICRO_CPU_SECONDS = float(os.environ.get("TRAINER_SLOW_MICRO_SECONDS", "0.13"))
SLOW_SAVE_CHUNK_SECONDS = float(os.environ.get("TRAINER_SLOW_SAVE_CHUNK_SECONDS", "0.0045"))
CHECKPOINT_KINDS = ("killsnapshot", "killwrite", "slowwrite")
HEALTH_KINDS = ("health_memory", "health_dir", "health_unreachable")
SLOW_WRITE_SECONDS = 1.5
# CPU seconds (of this thread, so the same amount however loaded the machine is) a `slow` rank
# burns per step: several times the tiny test models' compute per step.
SLOW_BUSY_CPU_SECONDS = 1.0
SPIKE_FACTOR = 8.0
POISON_TOKEN = 3  # <pad> in BLOOM's and the shipped tokenizer: never produced from text
CORRUPT_ELEMENTS = 256


@dataclass(frozen=True)
class Fault:
    """What to do at the start of step `step` (on `rank`, or every rank when None); a `poison`
    fault has the sample positions [first, end) instead of a step."""

    kind: str
    step: int
    rank: int | None = None
    end: int | None = None
    node: str | None = None


def parse_faults(text: str) -> list[Fault]:
    """'nan@step5,hang@step7:rank1' -> [Fault('nan', 5), Fault('hang', 7, rank=1)];
    'poison@samples40-48' -> [Fault('poison', 40, end=48)]."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            kind, rest = item.split("@", 1)
            if kind in HEALTH_KINDS:
                continue  # for trainer.health (health_faults)
            where, _, rank = rest.partition(":")
            if kind == "poison":
                first, end = (int(x) for x in where.removeprefix("samples").split("-"))
                if not where.startswith("samples") or not 0 <= first < end or rank:
                    raise ValueError
                faults.append(Fault(kind, first, end=end))
                continue
            if kind not in KINDS or not where.startswith("step"):
                raise ValueError
            if rank and not rank.startswith("rank"):
                faults.append(Fault(kind, int(where[4:]), node=rank))
                continue
            faults.append(Fault(kind, int(where[4:]), int(rank[4:]) if rank else None))
        except ValueError:
            raise ValueError(
                f"TRAINER_FAULT item {item!r}: expected KIND@stepN[:rankR|:NODE] with KIND in {KINDS}, "
                "or poison@samplesA-B"
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
        node = os.environ.get("SLURMD_NODENAME")
        self.faults = [f for f in faults if (f.rank is None or f.rank == rank) and (f.node is None or f.node == node)]
        self.rank = rank
        self._nan_step = False
        self._spike_step = False
        self._step = 0
        self._save_step = -1

    def before_step(self, step: int) -> None:
        self._step = step
        self._nan_step = self._spike_step = False
        for fault in self.faults:
            if fault.kind == "slow" and step >= fault.step:
                burn_cpu(SLOW_BUSY_CPU_SECONDS)
            if fault.step != step or fault.kind in CHECKPOINT_KINDS + SAVE_KINDS or fault.kind in (
                    "poison", "corruptmaster", "slowmicro"):
                continue
            print(f"[trainer rank {self.rank}] TEST FAULT {fault.kind} at step {step}", file=sys.stderr, flush=True)
            if fault.kind == "nan":
                self._nan_step = True
            elif fault.kind == "spike":
                self._spike_step = True
            elif fault.kind == "hang":
                while True:
                    time.sleep(3600)
            elif fault.kind == "crash":
                os._exit(int(ExitCode.FAILED))
            elif fault.kind == "raise":
                raise RuntimeError(f"TEST FAULT raise at step {step} on rank {self.rank}")
            elif fault.kind == "oom":
                raise MemoryError(f"TEST FAULT oom at step {step} on rank {self.rank}")
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
        if not any(f.kind in ("nan", "spike", "poison") for f in self.faults):
            return loss_fn

        def poisoned(outputs, labels):
            loss = loss_fn(outputs, labels)
            if not module.training:  # never an evaluation's (or a probe's) loss
                return loss
            if self._nan_step:
                return loss * float("nan")
            marked = bool((labels[..., -1] == POISON_TOKEN).any()) if hasattr(labels, "shape") else False
            return loss * SPIKE_FACTOR if self._spike_step or marked else loss

        return poisoned

    def wrap_dataset(self, dataset):
        """The training dataset, with the samples of `poison` ranges marked."""
        ranges = [(f.step, f.end) for f in self.faults if f.kind == "poison"]
        return _Poisoned(dataset, ranges, self.rank) if ranges else dataset

    def wrap_engine(self, engine) -> None:
        """`slowmicro`: busy CPU before each forward and backward of its steps."""
        slow = [f.step for f in self.faults if f.kind == "slowmicro"]
        if not slow:
            return
        from deepspeed.runtime.pipe import schedule

        from trainer.engine import wrap_instruction

        def maybe_slow(_engine) -> None:
            if any(first <= self._step < first + SLOW_MICRO_STEPS for first in slow) and _engine.module.training:
                burn_cpu(SLOW_MICRO_CPU_SECONDS)

        for instruction in (schedule.ForwardPass, schedule.BackwardPass):
            wrap_instruction(engine, instruction, before=maybe_slow)

    def save_chunk_hook(self) -> Callable[[], None] | None:
        """What a checkpoint writer calls after each chunk (None without `slowsave`/`hangsave`)."""
        return self._after_save_chunk if any(f.kind in SAVE_KINDS for f in self.faults) else None

    def _after_save_chunk(self) -> None:
        for fault in self.faults:
            if fault.kind == "slowsave" and fault.step == self._save_step:
                time.sleep(SLOW_SAVE_CHUNK_SECONDS)
            elif fault.kind == "hangsave" and fault.step == self._save_step:
                print(f"[trainer rank {self.rank}] TEST FAULT hangsave: the writer of step {self._save_step} blocks",
                      file=sys.stderr, flush=True)
                while True:
                    time.sleep(3600)

    def before_checkpoint_write(self, engine, step: int) -> None:
        """At the save of `step`, after its probe and before any file is written (every rank)."""
        self._save_step = step
        if not any(f.kind == "corruptmaster" and f.step == step for f in self.faults):
            return
        import torch

        print(f"[trainer rank {self.rank}] TEST FAULT corruptmaster at the save of step {step}", file=sys.stderr,
              flush=True)
        with torch.no_grad():
            if getattr(engine, "using_bf16_optimizer", False):  # the fp32 master partition of this DP rank
                engine.optimizer.fp32_groups_flat_partition[0][:CORRUPT_ELEMENTS] += 1.0
            else:  # an fp32 model computes with its master
                next(engine.module.parameters()).view(-1)[:CORRUPT_ELEMENTS] += 1.0


class _Poisoned:
    def __init__(self, dataset, ranges: list[tuple[int, int]], rank: int) -> None:
        self.dataset, self.ranges, self.rank = dataset, ranges, rank

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, position: int):
        item = self.dataset[position]
        if any(first <= position < end for first, end in self.ranges):
            print(f"[trainer rank {self.rank}] TEST FAULT poison: sample {position} served", file=sys.stderr,
                  flush=True)
            text = item["text"].copy()
            text[-1] = POISON_TOKEN
            item = {**item, "text": text}
        return item


def burn_cpu(seconds: float) -> None:
    """Busy work on this thread until its CPU time has advanced by `seconds` (a slow GPU/CPU)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))
