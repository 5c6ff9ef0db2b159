"""`runctl submit CONFIG`, `runctl cancel RUN_DIR` (`runctl status`: status_cmd.py).

The scheduler is RUNCTL_SCHEDULER=slurm|mock (default slurm; the mock only when asked for). The
library does the work (`orchestrator.operate.runs`); this file parses, calls and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK, UsageError
from orchestrator.slurm import get_scheduler, scheduler_name


def register(subparsers: argparse._SubParsersAction) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="validate, plan, check this host, render and submit a run (optionally a chain of K jobs)",
        description="Validate the config; check that the planner says it fits, time budget included "
        "(exit 3 if not); check on this host that the data, the tokenizer and cluster.python exist, that "
        "operators.group exists and that the checkpoint disk holds keep_last + 1 checkpoints (exit 2 if "
        "not); run the probe job on one node (exit 2 if the nodes cannot run the trainer); then create the run directory (run.yaml, jobs/, control/ ...), render the sbatch script "
        "and submit it. --chain K queues K jobs linked by --dependency=singleton on the run's job name: "
        "each starts when the one before it ends. --dry-run takes the same path, writes nothing and "
        "prints the script instead of submitting it.",
    )
    submit.add_argument("config", help="run config YAML (see configs/)")
    submit.add_argument("--run-dir", help="run directory (default: runs/<config name>)")
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="every check, then print the script and the chain: nothing is written or submitted",
    )
    submit.add_argument(
        "--skip-host-checks",
        action="store_true",
        help="skip the checks of this host's files, group and disk (to review a config away from its "
        "cluster); the planner's checks still run",
    )
    submit.add_argument(
        "--skip-probe",
        action="store_true",
        help="submit without the probe job (one node runs the interpreter, the set-up and the container, "
        "imports the trainer, torch and DeepSpeed, counts GPUs, checks the run dir and the data)",
    )
    submit.add_argument(
        "--probe-timeout", type=float, default=900.0, metavar="S",
        help="how long the probe job may take, queue time included (default 900 s)",
    )  # fmt: skip
    submit.add_argument(
        "--chain", type=int, default=1, metavar="K", help="queue K singleton-linked jobs (default 1)"
    )
    submit.add_argument("--json", action="store_true", help="print the result as JSON")
    submit.set_defaults(func=run_submit)

    cancel = subparsers.add_parser(
        "cancel",
        help="cancel every job of a run (the whole chain), no checkpoint",
        description="Cancel (scancel) every job of the run that has not ended, the queued ones of the chain "
        "first. No checkpoint is saved: the graceful stop is `runctl kill`.",
    )
    cancel.add_argument("run_dir", help="run directory")
    cancel.add_argument("--json", action="store_true")
    cancel.set_defaults(func=run_cancel)


def run_submit(args: argparse.Namespace) -> int:
    from orchestrator.operate.runs import submit_run  # noqa: PLC0415 - lazy: +41 ms on every runctl start

    scheduler = None if args.dry_run else get_scheduler()
    result = submit_run(
        args.config, args.run_dir, scheduler, chain=args.chain, dry_run=args.dry_run,
        host_checks=not args.skip_host_checks, probe=not args.skip_probe, probe_timeout=args.probe_timeout,
        say=None if args.json else lambda message: print(message, file=sys.stderr, flush=True),
    )  # fmt: skip
    result.scheduler = scheduler_name(require_sbatch=False) if scheduler is None else scheduler.name
    if args.json:
        print(json.dumps(asdict(result), indent=2))
        return EXIT_OK
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if result.dry_run:
        print(
            f"dry run: nothing was written or submitted (the run directory {result.run_dir} is not created)"
        )
        for line in [*result.probe, *describe_chain(result.chain, result.job_name)]:
            print(line)
        print("the job's launcher will run these srun steps (nodes as SLURM allocates them):")
        for line in result.srun_lines:
            print(f"  {for_terminal(line)}")
        print(f"--- the script of job 1 (the others are the same) ---\n{result.script_text.rstrip()}")
        print("--- end of the script; submit for real without --dry-run")
        return EXIT_OK
    for line in result.probe:
        print(f"probe: {for_terminal(line)}")
    chain = f" (a chain of {len(result.job_ids)}, --dependency=singleton)" if len(result.job_ids) > 1 else ""
    print(f"submitted job(s) {', '.join(result.job_ids)}{chain} to {result.scheduler} as {result.job_name}")
    print(f"run directory: {result.run_dir}\nscript: {result.script}")
    print(f"follow with: runctl status {result.run_dir}")
    return EXIT_OK


def describe_chain(count: int, job_name: str) -> list[str]:
    """How the K jobs of `--chain K` follow each other, in words."""
    if count == 1:
        return [
            f"would submit 1 job named {job_name} (--dependency=singleton: it waits for any other job of this run)"
        ]
    return [
        f"would submit {count} jobs, all named {job_name}, each with --dependency=singleton (SLURM runs one job",
        "of a name and user at a time):",
        "  job 1 starts when SLURM gives it the nodes;",
        *(
            f"  job {k} starts when job {k - 1} ends, and resumes from the newest checkpoint;"
            for k in range(2, count + 1)
        ),
        f"together up to {count} x the time limit; `runctl cancel` cancels the jobs still queued.",
    ]


def run_cancel(args: argparse.Namespace) -> int:
    from orchestrator.operate.runs import cancel_run, load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start

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
