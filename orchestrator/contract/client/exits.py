"""A rank's last words: its exit code (the contract's table, contract.codes.ExitCode) in its last
beat, the beat stopped in the EXITING phase, the output flushed, the process gone.

The code says what the controller does next: FINISHED and KILLED are never restarted,
TIME_BUDGET continues the chain of jobs, CONFIG_ERROR stops the run for a person, anything else
(FAILED, a signal) is a failure, restarted after checks.
"""

from __future__ import annotations

import os
import sys

from orchestrator.contract import ExitCode, Phase

from .beat import HeartbeatWriter


def record_exit(beat: HeartbeatWriter, code: int) -> int:
    """The code and its name in the beat, then the beat's last write (phase EXITING)."""
    beat.note(exit_code=int(code), exit_reason=ExitCode.describe(int(code)))
    beat.stop(Phase.EXITING)
    return int(code)


def exit_now(code: int) -> None:
    """Flush and leave with `code`. os._exit: a collective library's background threads (gloo,
    NCCL, DeepSpeed) must not turn a clean exit code into a hang at interpreter shutdown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))
