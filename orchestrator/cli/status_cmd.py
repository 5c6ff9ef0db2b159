"""`runctl status [RUN_DIR] [--json] [--follow]`: the run at a glance, for anyone who can read the
run directory (no controller needed, nothing written but the owner's cache of job states).

The facts come from orchestrator.views.dashboard.status_data, the words and layout from
orchestrator.views.status_screen; --follow redraws the same screen in place (rich Live) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import EXIT_OK, SchedulerError, UsageError
from orchestrator.slurm import get_scheduler

if TYPE_CHECKING:
    from orchestrator.views.status_view import StatusView

FOLLOW_SECONDS = 5.0  # one squeue and one read of the run directory per redraw


def register(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser(
        "status",
        help="the run at a glance: jobs, training, heartbeats, warnings, recent events",
        description="The run at a glance, in words and within 80 columns: one table of its jobs (states asked "
        "from the scheduler, remembered for jobs it forgot) with why each exists and what its end meant; "
        "training progress and checkpoints; which nodes' heartbeats are late and by how much; warnings; "
        "recent events as sentences; straggler scores. Anyone who can read the run directory may run it. "
        "--follow redraws it every few seconds until Ctrl-C (a read-only live view: no controller needed).",
    )
    status.add_argument("run_dir", nargs="?", default=".", help="run directory (default: the current one)")
    status.add_argument("--json", action="store_true", help="print the same facts as JSON")
    status.add_argument("--follow", "-f", action="store_true", help="redraw the screen until Ctrl-C")
    status.add_argument(
        "--every",
        type=float,
        default=FOLLOW_SECONDS,
        metavar="SECONDS",
        help=f"with --follow: seconds between redraws (default {FOLLOW_SECONDS:g}, at least 0.5)",
    )
    status.set_defaults(func=run_status)


def gather(run_dir: Path) -> StatusView:
    """status_data with the scheduler when it can be asked; when not, why (the screen says so)."""
    from orchestrator.views.dashboard import status_data  # noqa: PLC0415 - lazy: +25 ms on every runctl start

    try:
        scheduler = get_scheduler()
    except UsageError as exc:  # e.g. SLURM's tools are not on PATH here: show what is known
        return status_data(run_dir, None, scheduler_problem=str(exc))
    try:
        return status_data(run_dir, scheduler)
    except SchedulerError as exc:
        return status_data(run_dir, None, scheduler_problem=f"it did not answer: {exc}")


def run_status(args: argparse.Namespace) -> int:
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start

    run_dir = Path(args.run_dir)
    load_run_config(run_dir)  # refuses a folder that is not a run directory, or a broken config
    if args.json and args.follow:
        raise UsageError("--json and --follow do not go together: use `runctl events --follow --json`")
    if args.every < 0.5:
        raise UsageError(f"--every {args.every}: give 0.5 seconds or more")
    if args.json:
        print(json.dumps(gather(run_dir).to_json(), indent=2, default=str))
        return EXIT_OK
    from rich.console import Console  # noqa: PLC0415 - lazy: +17 ms on every runctl start

    from orchestrator.views.status_screen import render_status  # noqa: PLC0415 - lazy: +44 ms on every runctl start

    if not args.follow:
        Console().print(render_status(gather(run_dir)))
        return EXIT_OK
    return follow(args.every, lambda: render_status(gather(run_dir)))


def follow(every: float, screen) -> int:
    """Redraw `screen()` in place every `every` seconds; Ctrl-C ends it, with exit 0."""
    from rich.live import Live  # noqa: PLC0415 - lazy: +19 ms on every runctl start

    try:
        with Live(screen(), auto_refresh=False, vertical_overflow="visible") as live:
            while True:
                time.sleep(every)
                live.update(screen(), refresh=True)
    except KeyboardInterrupt:
        return EXIT_OK
