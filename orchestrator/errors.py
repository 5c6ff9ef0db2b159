"""Errors the CLI maps to exit codes, and the one table of those codes (`CliExit`): library code
raises these with a message that says what was wrong and what to do; the CLI prints the message
and exits with the code; every command's --help lists its codes from the same table.

(The trainer's exit codes, which the controller reads, are `orchestrator.contract.ExitCode`.)
"""

from __future__ import annotations

import enum


class CliExit(enum.IntEnum):
    """How `runctl` ends. The meanings are what --help prints."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    DOES_NOT_FIT = 3
    SCHEDULER = 4
    PERMISSION = 5
    BUSY = 6
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return MEANINGS[self]


MEANINGS = {
    CliExit.OK: "success",
    CliExit.FAILURE: "the command ran and found a problem, or failed (the message says which)",
    CliExit.USAGE: "bad config, arguments or run directory (the message names the key and the fix)",
    CliExit.DOES_NOT_FIT: "the planner says the run cannot work: memory, pipeline or time budget",
    CliExit.SCHEDULER: "SLURM refused, or answered something that cannot be parsed",
    CliExit.PERMISSION: "you are not an operator of this run",
    CliExit.BUSY: "another controller holds the run's lock",
    CliExit.INTERRUPTED: "interrupted (Ctrl-C)",
}

EXIT_OK = CliExit.OK
EXIT_FAILURE = CliExit.FAILURE
EXIT_USAGE = CliExit.USAGE  # bad config or arguments
EXIT_DOES_NOT_FIT = CliExit.DOES_NOT_FIT  # the planner says the layout does not fit
EXIT_SCHEDULER = CliExit.SCHEDULER  # SLURM refused or answered something we cannot parse
EXIT_PERMISSION = CliExit.PERMISSION  # not an operator of this run
EXIT_BUSY = CliExit.BUSY  # another controller holds the run's lock
EXIT_INTERRUPTED = CliExit.INTERRUPTED


def describe_exit_codes(codes: tuple[CliExit, ...]) -> list[str]:
    """`  2  bad config, ...` lines for --help, in code order."""
    return [f"  {int(code):<3} {code.meaning}" for code in sorted(set(codes))]


class RunctlError(Exception):
    exit_code = EXIT_FAILURE


class UsageError(RunctlError):
    exit_code = EXIT_USAGE


class DoesNotFitError(RunctlError):
    exit_code = EXIT_DOES_NOT_FIT


class SchedulerError(RunctlError):
    exit_code = EXIT_SCHEDULER


class PermissionDeniedError(RunctlError):
    exit_code = EXIT_PERMISSION


class RunBusyError(RunctlError):
    exit_code = EXIT_BUSY
