"""`runctl plan CONFIG`: does the layout fit, how long, what cost, how often to checkpoint."""

from __future__ import annotations

import argparse
import json

from orchestrator.config import load_config
from orchestrator.errors import EXIT_DOES_NOT_FIT, EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="check that a config fits and estimate memory, time, GPU-hours and checkpoint interval",
        description="Plan a run: parameters, memory per GPU per pipeline stage, FLOPs and time per "
        "iteration, GPU-hours (spare nodes included), pipeline bubble, failures and spares per job, and "
        "the goodput-optimal checkpoint interval. "
        "Exits 3 when the config does not fit.",
    )
    parser.add_argument("config", help="run config YAML (see configs/)")
    parser.add_argument("--json", action="store_true", help="print one flat JSON object")
    parser.add_argument("--tflops", type=float, help="achieved TFLOPs per GPU (default: the config's)")
    parser.add_argument(
        "--train-tokens", type=float, help="tokens to train on instead of the config's (e.g. 350e9)"
    )
    parser.add_argument("--gpu-mtbf-hours", type=float, help="mean hours between failures of one GPU")
    parser.add_argument("--save-seconds", type=float, help="time to save one checkpoint")
    parser.add_argument("--spare-nodes", type=int, help="spare nodes per job (default: cluster.spare_nodes)")
    parser.add_argument(
        "--in-allocation-restart-minutes",
        type=float,
        help="failure to training again on a spare inside the job (default: the config's watchdog value)",
    )
    parser.add_argument(
        "--async-stall-fraction",
        type=float,
        help="training stall of an async save / save time (default: checkpoint.async_stall_fraction)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.planner import plan_run

    _check_overrides(args)
    cfg = load_config(args.config)
    plan = plan_run(
        cfg,
        achieved_tflops_per_gpu=args.tflops,
        train_tokens=args.train_tokens,
        gpu_mtbf_hours=args.gpu_mtbf_hours,
        checkpoint_save_seconds=args.save_seconds,
        spare_nodes=args.spare_nodes,
        in_allocation_restart_minutes=args.in_allocation_restart_minutes,
        async_stall_fraction=args.async_stall_fraction,
    )
    if args.json:
        print(json.dumps(plan.flat(), indent=2))
    else:
        from orchestrator.cli.plan_view import print_plan

        print_plan(cfg.name, plan)
    if not plan.fits:
        if args.json:
            import sys

            for problem in plan.problems:
                print(f"does not fit: {problem}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


def _check_overrides(args: argparse.Namespace) -> None:
    """The model's ranges, as the config's schema has them (a negative spare count would plan fewer nodes)."""
    if args.spare_nodes is not None and args.spare_nodes < 0:
        raise UsageError(f"--spare-nodes {args.spare_nodes}: give 0 or more spare nodes")
    if args.in_allocation_restart_minutes is not None and args.in_allocation_restart_minutes <= 0:
        raise UsageError(
            f"--in-allocation-restart-minutes {args.in_allocation_restart_minutes}: give minutes > 0"
        )
    if args.async_stall_fraction is not None and not 0 < args.async_stall_fraction <= 1:
        raise UsageError(f"--async-stall-fraction {args.async_stall_fraction}: give a fraction in (0, 1]")
