"""`runctl` entry point. Each command group lives in its own module with a `register(subparsers)`
function; this file only wires them up and maps library errors to exit codes.

Imports stay light (no torch; rich only when printing) so that `runctl --help` answers at once.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from orchestrator import __version__
from orchestrator.cli import manual
from orchestrator.contract.filemodes import owner_umask
from orchestrator.errors import EXIT_INTERRUPTED, EXIT_USAGE, RunctlError

# Modules under orchestrator.cli that add subcommands, in --help order.
COMMAND_MODULES = [
    "plan_cmd",
    "submit_cmd",
    "check_env_cmd",
    "status_cmd",
    "ls_cmd",
    "logs_cmd",
    "cluster_cmd",
    "watch_cmd",
    "events_cmd",
    "kill_cmd",
    "health_cmd",
    "report_cmd",
    "doctor_cmd",
    "metrics_cmd",
    "aux_cmd",
    "completion_cmd",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="runctl",
        description="Plan, submit, watch, kill and resume BLOOM-scale training runs on SLURM. "
        "`runctl COMMAND --help` shows each command's examples and exit codes.",
    )
    parser.add_argument("--version", action="version", version=f"runctl {__version__} (bloomctl)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"orchestrator.cli.{name}").register(subparsers)
    manual.attach(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.parser = parser  # `runctl completion` generates from the whole parser
    warnings.showwarning = _say_warning
    with owner_umask():  # before anything is created (docs/security.md, "Modes")
        return _run(args)


def _say_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    """A warning as a line of runctl's own (a retired config key), not Python's source excerpt."""
    print(f"runctl: warning: {message}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except RunctlError as exc:
        print(f"runctl {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except ValueError as exc:  # e.g. a ConfigError from the library
        print(f"runctl {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
