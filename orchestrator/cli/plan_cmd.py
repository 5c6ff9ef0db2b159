"""`runctl plan CONFIG`: does the layout fit, how long, what cost, how often to checkpoint."""

from __future__ import annotations

import argparse
import json

from orchestrator.config import load_config
from orchestrator.errors import EXIT_DOES_NOT_FIT, EXIT_OK


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="check that a config fits and estimate memory, time, GPU-hours and checkpoint interval",
        description="Plan a run: parameters, memory per GPU per pipeline stage, FLOPs and time per "
        "iteration, GPU-hours, pipeline bubble, and the goodput-optimal checkpoint interval. "
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.planner import plan_run

    cfg = load_config(args.config)
    plan = plan_run(
        cfg,
        achieved_tflops_per_gpu=args.tflops,
        train_tokens=args.train_tokens,
        gpu_mtbf_hours=args.gpu_mtbf_hours,
        checkpoint_save_seconds=args.save_seconds,
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
