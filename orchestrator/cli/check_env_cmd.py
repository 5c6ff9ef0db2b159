"""`runctl check-env CONFIG`: the probe job alone (orchestrator/slurm/env_probe.py), before a run
is submitted: one node of the run's partition, account and QOS, with its set-up commands and
container, runs the configured interpreter and reports each check. Nothing of the run is created."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK, EXIT_USAGE
from orchestrator.plan.config import load_config
from orchestrator.slurm import get_scheduler


def register(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "check-env",
        help="run the probe job: can the nodes run this config's trainer?",
        description="Submit one small job with the run's partition, account, QOS, environment, set-up "
        "commands and container. On its node it starts cluster.python, imports the trainer, torch and "
        "DeepSpeed, counts the GPUs, writes beside the run directory and reads the data and the "
        "tokenizer, then prints a verdict per check. `runctl submit` runs the same probe first.",
    )
    check.add_argument("config", help="run config YAML (see configs/)")
    check.add_argument(
        "--run-dir", help="where the run will live (default: runs/<config name>); the probe writes beside it"
    )
    check.add_argument("--timeout", type=float, default=900.0, metavar="S",
                       help="how long the probe may take, queue time included (default 900 s)")  # fmt: skip
    check.add_argument("--json", action="store_true", help="the report as JSON")
    check.set_defaults(func=run_check_env)


def run_check_env(args: argparse.Namespace) -> int:
    from orchestrator.slurm.env_probe import run_probe  # noqa: PLC0415 - lazy: +30 ms on every runctl start

    cfg = load_config(args.config)
    run_root = (Path(args.run_dir) if args.run_dir else Path("runs") / cfg.name).resolve()

    def say(message: str) -> None:
        if not args.json:
            print(message, file=sys.stderr, flush=True)

    report = run_probe(cfg, get_scheduler(), run_root.parent, timeout_seconds=args.timeout, say=say)
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    else:
        for line in report.lines():
            print(for_terminal(line))
        print(
            "the nodes can run this training"
            if report.ok
            else "the nodes cannot run this training as configured"
        )
    return EXIT_OK if report.ok else EXIT_USAGE
