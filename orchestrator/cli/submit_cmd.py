"""`runctl submit CONFIG`, `runctl status [RUN_DIR]`, `runctl cancel RUN_DIR`.

The scheduler is RUNCTL_SCHEDULER=slurm|mock (default slurm; the mock only when asked for). The
library does the work (`orchestrator.runs`); this file parses, calls and prints.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from dataclasses import asdict
from pathlib import Path

from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="validate, plan, render and submit a run (optionally a chain of K jobs)",
        description="Validate the config, check that the planner says it fits, create the run directory "
        "(run.yaml, jobs/, control/ ...), render the sbatch script and submit it. --chain K queues K "
        "jobs linked by --dependency=singleton: each starts as soon as the previous one ends. "
        "--dry-run takes the same path and stops before sbatch.",
    )
    submit.add_argument("config", help="run config YAML (see configs/)")
    submit.add_argument("--run-dir", help="run directory (default: runs/<config name>)")
    submit.add_argument(
        "--dry-run", action="store_true", help="everything except the submission; prints the script path"
    )
    submit.add_argument(
        "--chain", type=int, default=1, metavar="K", help="queue K singleton-linked jobs (default 1)"
    )
    submit.add_argument("--json", action="store_true", help="print the result as JSON")
    submit.set_defaults(func=run_submit)

    status = subparsers.add_parser("status", help="the jobs of a run and their states")
    status.add_argument("run_dir", nargs="?", default=".", help="run directory (default: the current one)")
    status.add_argument("--json", action="store_true", help="print the job table as JSON")
    status.set_defaults(func=run_status)

    cancel = subparsers.add_parser(
        "cancel", help="cancel every job of a run (the whole chain), no checkpoint"
    )
    cancel.add_argument("run_dir", help="run directory")
    cancel.add_argument("--json", action="store_true")
    cancel.set_defaults(func=run_cancel)


def run_submit(args: argparse.Namespace) -> int:
    from orchestrator.runs import submit_run
    from orchestrator.slurm import get_scheduler, scheduler_name

    scheduler = None if args.dry_run else get_scheduler()
    result = submit_run(args.config, args.run_dir, scheduler, chain=args.chain, dry_run=args.dry_run)
    result.scheduler = scheduler_name(require_sbatch=False) if scheduler is None else scheduler.name
    if args.json:
        print(json.dumps(asdict(result), indent=2))
        return EXIT_OK
    if result.dry_run:
        print(f"dry run: nothing submitted. Script: {result.script}")
        print(f"run directory: {result.run_dir} (run.yaml written); submit for real without --dry-run")
    else:
        chain = (
            f" (chain of {len(result.job_ids)}, --dependency=singleton)" if len(result.job_ids) > 1 else ""
        )
        print(f"submitted job(s) {', '.join(result.job_ids)}{chain} to {result.scheduler}")
        print(f"run directory: {result.run_dir}\nscript: {result.script}")
        print(f"follow with: runctl status {result.run_dir}")
    return EXIT_OK


def _when(stamp: float | None) -> str:
    if not stamp:
        return "-"
    return datetime.datetime.fromtimestamp(stamp).strftime("%m-%d %H:%M:%S")


def format_job_table(rows: list[dict]) -> str:
    """The plain-text job table (also used by other commands' views)."""
    from orchestrator.slurm.hostlist import compress_hostlist

    header = ["JOB", "STATE", "EXIT", "OUTCOME", "NODES", "SUBMITTED", "STARTED", "ENDED", "WHY", "REASON"]
    table = [header]
    for r in rows:
        state = r["state"] + ("?" if r.get("stale") else "")
        exit_code = "-" if r["exit_code"] is None else str(r["exit_code"])
        table.append([
            r["job_id"], state, exit_code, r["outcome"] or "-", compress_hostlist(r["nodes"]) if r["nodes"] else "-",
            _when(r["submitted_at"]), _when(r["started_at"]), _when(r["ended_at"]), r["submit_reason"] or "-",
            r["reason"] or "-",
        ])  # fmt: skip
    from orchestrator.textsafe import for_terminal  # reasons may come from other users

    table = [[for_terminal(c) for c in row] for row in table]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    )


def run_status(args: argparse.Namespace) -> int:
    from orchestrator.runs import job_table, load_run_config
    from orchestrator.slurm import get_scheduler

    run_dir = Path(args.run_dir)
    cfg = load_run_config(run_dir)
    from orchestrator.dashboard import dashboard_data, render_dashboard

    rows = job_table(run_dir, get_scheduler())
    dashboard = dashboard_data(run_dir)
    stragglers = straggler_scores(run_dir)
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(run_dir.resolve()),
                    "name": cfg.name,
                    "jobs": rows,
                    "dashboard": dashboard,
                    "stragglers": stragglers,
                },
                indent=2,
                default=str,
            )
        )
        return EXIT_OK
    print(f"run {cfg.name} in {run_dir.resolve()}")
    if not rows:
        print("no jobs submitted yet")
    else:
        print(format_job_table(rows))
        if any(r.get("stale") for r in rows):
            print("(? = last state seen; the scheduler no longer reports this job)")
    from rich.console import Console

    Console().print(render_dashboard(run_dir, dashboard))
    for line in format_straggler_table(stragglers):
        print(line)
    return EXIT_OK


def straggler_scores(run_dir: Path) -> dict:
    """The controller's last per-node straggler scores (state.json, controller/stragglers.py)."""
    from orchestrator.controller.state import load_state
    from orchestrator.protocol import RunPaths

    return load_state(RunPaths.of(run_dir)).stragglers or {}


def format_straggler_table(scores: dict) -> list[str]:
    """Slowest nodes first: score = compute time per step over its peers' median (vs_median) or
    its own history (vs_history), whichever is larger; STRAGGLER once it stayed past the threshold."""
    nodes = scores.get("nodes") or {}
    if not isinstance(nodes, dict) or not nodes:
        return []
    from orchestrator.textsafe import for_terminal

    def key(item):
        score = item[1].get("score") if isinstance(item[1], dict) else None
        return -score if isinstance(score, (int, float)) else 0.0

    flagged = [n for n, v in nodes.items() if isinstance(v, dict) and v.get("straggler")]
    lines = [
        f"stragglers (job {for_terminal(scores.get('job_id'))}, step {scores.get('step')}, threshold "
        f"{scores.get('threshold')}x): {', '.join(for_terminal(n) for n in flagged) or 'none'}",
        "  NODE          SCORE  VS_MEDIAN  VS_HISTORY  COMPUTE_S  SLOW_FOR_S",
    ]
    for node, v in sorted(nodes.items(), key=key)[:10]:
        if not isinstance(v, dict):
            continue
        cells = [
            v.get(k) for k in ("score", "vs_median", "vs_history", "compute_seconds", "slow_for_seconds")
        ]
        text = "  ".join(f"{c:>9.3f}" if isinstance(c, (int, float)) else f"{'-':>9}" for c in cells)
        mark = "  STRAGGLER" if v.get("straggler") else ""
        lines.append(f"  {for_terminal(node)[:12]:<12}{text}{mark}")
    if len(nodes) > 10:
        lines.append(f"  ... {len(nodes) - 10} more node(s) (--json for all)")
    return lines


def run_cancel(args: argparse.Namespace) -> int:
    from orchestrator.runs import cancel_run, load_run_config
    from orchestrator.slurm import get_scheduler

    load_run_config(args.run_dir)  # refuses a folder that is not a run directory
    if not os.path.isdir(args.run_dir):
        raise UsageError(f"{args.run_dir} is not a directory")
    cancelled = cancel_run(args.run_dir, get_scheduler())
    if args.json:
        print(json.dumps({"cancelled": cancelled}))
    elif cancelled:
        print(f"cancelled {', '.join(cancelled)}")
    else:
        print("nothing to cancel: every job of this run has already ended")
    return EXIT_OK
