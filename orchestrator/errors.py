"""Errors the CLI maps to exit codes. Library code raises these with a message that says what was
wrong and what to do; the CLI prints the message and exits with the code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad config or arguments
EXIT_DOES_NOT_FIT = 3  # the planner says the layout does not fit
EXIT_SCHEDULER = 4  # SLURM refused or answered something we cannot parse
EXIT_PERMISSION = 5  # not an operator of this run
EXIT_BUSY = 6  # another controller holds the run's lock


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
