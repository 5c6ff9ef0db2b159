"""Decisions to stop or checkpoint, agreed by every rank before anyone acts.

Three local observations, made each step by each rank:
- the kill switch: `accepted/kill` exists (shared filesystem: ranks see it at slightly different
  steps). Only the controller writes accepted/, after authenticating the operator who dropped
  `control/kill` (orchestrator/controller/requests.py); a file in control/ itself is never obeyed,
  so a kill needs a running controller;
- the time budget: `checkpoint.exit_duration_minutes` since the job started has passed, or SLURM's
  pre-timeout signal (`cluster.pre_timeout_signal`, e.g. `--signal=USR1@600`) arrived; the signal
  handler only sets a flag (nothing else is safe in a handler);
- a time-based checkpoint is due (`checkpoint.interval_hours`, or with `adaptive_interval: apply`
  the controller's accepted/checkpoint_interval, taken after each save): only rank 0's clock
  counts, so that ranks with drifting clocks cannot disagree.

They are packed into a few ints and all-reduced with MAX over the whole world (torch.distributed's
all_reduce, or the loop's own, passed as a callable): if any rank
saw a flag, every rank acts on it at the same step, and a rank that did not see it yet cannot be
left waiting in a collective the others skipped. The all-reduce is one 3-int collective per
step, next to a step's gigabytes.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.contract import KILL_REQUEST, OperatorRequest, RunPaths
from orchestrator.contract.directive import DirectiveError
from orchestrator.contract.interval import bounded_interval, read_interval_directive
from orchestrator.contract.requests import read_accepted

# A loop's all-reduce of a few ints with MAX over every rank (the flags are 0 or 1).
AllReduceMax = Callable[[list[int]], list[int]]

# Set by the pre-timeout signal handler; read by Controls. Module-level so that the handler can be
# installed at process start (a signal during a long init must not kill the process).
_signal_received: list[str] = []


def install_signal_flag(name: str | None) -> None:
    """Catch SIG<name> (e.g. USR1) by setting a flag; nothing else is safe in a handler."""
    if not name:
        return

    def handler(received, _frame):
        _signal_received.append(signal.Signals(received).name)

    signal.signal(getattr(signal, f"SIG{name}"), handler)


def torch_all_reduce_max(device=None) -> AllReduceMax:
    """The agreement over torch.distributed's default group (a no-op outside one, or alone)."""

    def reduce(flags: list[int]) -> list[int]:
        # The loop's own torch, never imported here: a process group exists only in a loop that
        # imported torch, and the orchestrator package stays importable without it.
        torch = sys.modules.get("torch")
        tdist = getattr(torch, "distributed", None)
        if tdist is None or not (
            tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1
        ):
            return flags
        tensor = torch.tensor(flags, dtype=torch.int32, device=device)
        tdist.all_reduce(tensor, op=tdist.ReduceOp.MAX)
        return [int(v) for v in tensor.tolist()]

    return reduce


@dataclass(frozen=True)
class Agreement:
    """What every rank agreed after a step (`Controls.agree`): stop for a kill or the time budget,
    or save now. Not the controller's launch decision (contract.allocation.Decision)."""

    kill: bool = False
    time_budget: bool = False
    checkpoint_due: bool = False

    @property
    def stop(self) -> bool:
        return self.kill or self.time_budget


class Controls:
    def __init__(
        self,
        paths: RunPaths,
        rank: int,
        job_start_time: float,
        exit_duration_minutes: float | None,
        checkpoint_interval_hours: float | None,
        pre_timeout_signal: str | None,
        device=None,
        interval_bounds: tuple[float, float] | None = None,
    ):
        self.paths = paths
        self.rank = rank
        self.job_start_time = job_start_time
        self.exit_duration_minutes = exit_duration_minutes
        self.checkpoint_interval_hours = checkpoint_interval_hours
        # checkpoint.adaptive_interval: apply: the controller's interval directive, kept within these
        # (min_interval_hours, max_interval_hours); None: the config's interval, always.
        self.interval_bounds = interval_bounds
        self.device = device
        self.last_checkpoint_time = time.time()
        self.pick_up_interval()
        self.kill_request: OperatorRequest | None = None
        if pre_timeout_signal and signal.getsignal(getattr(signal, f"SIG{pre_timeout_signal}")) in (
            signal.SIG_DFL,
            signal.SIG_IGN,
            None,
        ):
            install_signal_flag(pre_timeout_signal)

    @property
    def signal_received(self) -> str | None:
        return _signal_received[0] if _signal_received else None

    def checkpoint_saved(self) -> None:
        self.last_checkpoint_time = time.time()
        self.pick_up_interval()

    def pick_up_interval(self) -> None:
        """Rank 0 (whose clock alone decides a save is due) takes the controller's applied interval
        from the next save on. The directive is hostile until the contract's reader says the run's
        owner wrote it; a bad one is reported and the interval in force kept."""
        if self.interval_bounds is None or self.rank != 0:
            return
        try:
            directive = read_interval_directive(self.paths)
        except DirectiveError as exc:
            print(f"[rank 0] ignoring the checkpoint-interval directive: {exc}", file=sys.stderr, flush=True)
            return
        if directive is not None:
            hours = bounded_interval(directive.interval_hours, *self.interval_bounds)
            if hours != self.checkpoint_interval_hours:
                print(
                    f"[rank 0] checkpoint interval now {hours:g} h, from the next save on (the controller's "
                    f"directive: {directive.reason})",
                    flush=True,
                )
            self.checkpoint_interval_hours = hours

    # -- local observations ------------------------------------------------------------------
    def kill_requested(self) -> bool:
        """accepted/kill is there (written by the controller only; see the module docstring)."""
        request = read_accepted(self.paths, KILL_REQUEST)
        if request is None:
            return False
        self.kill_request = request
        return True

    def time_budget_reached(self, now: float | None = None) -> bool:
        if self.signal_received is not None:
            return True
        if self.exit_duration_minutes is None:
            return False
        now = time.time() if now is None else now
        return now - self.job_start_time >= self.exit_duration_minutes * 60.0

    def checkpoint_due(self, now: float | None = None) -> bool:
        if self.rank != 0 or self.checkpoint_interval_hours is None:
            return False
        now = time.time() if now is None else now
        return now - self.last_checkpoint_time >= self.checkpoint_interval_hours * 3600.0

    def local_flags(self) -> list[int]:
        return [int(self.kill_requested()), int(self.time_budget_reached()), int(self.checkpoint_due())]

    # -- the agreement -----------------------------------------------------------------------
    def agree(self, local: list[int] | None = None, all_reduce_max: AllReduceMax | None = None) -> Agreement:
        """Collective: every rank must call it at the same step. `all_reduce_max`: the loop's own
        all-reduce (element-wise MAX over every rank) of a short list of ints; torch.distributed's
        when None (the loop's own torch: the client works without one)."""
        flags = self.local_flags() if local is None else local
        reduce = all_reduce_max if all_reduce_max is not None else torch_all_reduce_max(self.device)
        kill, budget, due = (bool(v) for v in reduce(list(flags)))
        return Agreement(kill=kill, time_budget=budget, checkpoint_due=due)

    def describe_stop(self, decision: Agreement) -> str:
        if decision.kill:
            request = self.kill_request
            if request is None:
                return "kill switch (seen by another rank)"
            return f"kill switch (by {request.user}: {request.reason})"
        if self.signal_received:
            return f"time budget: SLURM pre-timeout signal {self.signal_received}"
        if decision.time_budget:
            return f"time budget: exit_duration_minutes={self.exit_duration_minutes} reached (or seen by another rank)"
        return "none"


def adaptive_interval_bounds(checkpoint: Any) -> tuple[float, float] | None:
    """(min, max) hours when the controller's interval is applied (`adaptive_interval: apply`)."""
    if checkpoint.adaptive_interval != "apply":
        return None
    return checkpoint.min_interval_hours, checkpoint.max_interval_hours
