"""`runctl ls ROOT`: the runs under a folder, with their state.

A run is a folder with a run.yaml, at ROOT itself or up to MAX_DEPTH levels below it (e.g.
/gpfs/runs/<user>/<run>). What a line says of a run (orchestrator.views.run_list.RunSummary) comes
from its state.json, its submissions ledger and its lock (whether a controller supervises it
now). Nothing is written.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from orchestrator.contract.paths import MAX_DEPTH, MAX_RUNS, find_runs
from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    ls = subparsers.add_parser(
        "ls",
        help="the runs under a folder, with their state",
        description=f"List the run directories under ROOT (ROOT itself and up to {MAX_DEPTH} levels "
        "below it): the run's name, the controller's status from state.json, its jobs, whether a "
        "controller supervises it now, and when the controller last wrote its state.",
    )
    ls.add_argument("root", help="a folder that holds run directories, e.g. /gpfs/runs")
    ls.add_argument("--json", action="store_true", help="one JSON list")
    ls.set_defaults(func=run_ls)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def run_ls(args: argparse.Namespace) -> int:
    from orchestrator.views.run_list import describe_run  # noqa: PLC0415 - lazy: +43 ms on every runctl start

    root = Path(args.root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder: give the folder that holds the run directories")
    runs, truncated = find_runs(root)
    now = time.time()
    rows = [describe_run(run, now) for run in runs]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        print(f"no run directories (folders with a run.yaml) under {root}, {MAX_DEPTH} levels deep")
        return EXIT_OK
    table = [["NAME", "STATUS", "JOBS", "CONTROLLER", "UPDATED", "RUN DIR"]]
    for r in rows:
        jobs = f"{r.live_jobs} live / {r.jobs}"
        table.append([for_terminal(r.name), r.status, jobs, "running" if r.controller else "none",
                      _age(r.state_age_seconds), for_terminal(r.run_dir)])  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if truncated:
        print(f"... stopped after {MAX_RUNS} runs: give a deeper ROOT")
    return EXIT_OK
