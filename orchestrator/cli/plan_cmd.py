"""`runctl plan CONFIG`: does the layout fit, how long, what cost, how often to checkpoint."""

from __future__ import annotations

import argparse
import json
import math
import sys

from orchestrator.errors import EXIT_DOES_NOT_FIT, EXIT_OK, UsageError
from orchestrator.plan.config import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="check that a config fits and estimate memory, time, GPU-hours and checkpoint interval",
        description="Plan a run: parameters, memory per GPU per pipeline stage, FLOPs and time per "
        "iteration, GPU-hours (spare nodes included), pipeline bubble, failures and spares per job, and "
        "the goodput-optimal checkpoint interval; and the time budget: a job's time limit against init, "
        "saves and the pre-timeout margin, every phase against its timeout. Exits 3 when the config does "
        "not fit. The flags replace the config's values (checked as the config's are: positive, finite).",
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
        "--snapshot-gb-per-second",
        type=float,
        help="one GPU's device-to-host copy rate in an async save (default: checkpoint.snapshot_gb_per_second)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.plan.planner import plan_run  # noqa: PLC0415 - lazy: +11 ms on every runctl start

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
        snapshot_gb_per_second=args.snapshot_gb_per_second,
    )
    if args.json:
        print(json.dumps(plan.flat(), indent=2))
    else:
        from orchestrator.cli.plan_view import print_plan  # noqa: PLC0415 - lazy: +37 ms on every runctl start

        print_plan(cfg.name, plan)
    if not plan.fits:
        if args.json:
            for problem in plan.problems:
                print(f"does not fit: {problem}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    return EXIT_OK


# flag -> (attribute, smallest allowed, is the bound allowed, what to give)
OVERRIDES = {
    "--tflops": ("tflops", 0.0, False, "achieved TFLOPs per GPU > 0 (BLOOM measured ~150 on A100)"),
    "--train-tokens": ("train_tokens", 0.0, False, "tokens > 0, e.g. 350e9"),
    "--gpu-mtbf-hours": ("gpu_mtbf_hours", 0.0, False, "hours > 0 between failures of one GPU"),
    "--save-seconds": ("save_seconds", 0.0, False, "seconds > 0 for one checkpoint save"),
    "--spare-nodes": ("spare_nodes", 0, True, "0 or more spare nodes"),
    "--in-allocation-restart-minutes": ("in_allocation_restart_minutes", 0.0, False, "minutes > 0"),
    "--snapshot-gb-per-second": ("snapshot_gb_per_second", 0.0, False, "GB/s > 0 (5.7 measured on one H200)"),
}


def _check_overrides(args: argparse.Namespace) -> None:
    """Each flag as the config's schema checks the value it replaces: a zero, a negative, NaN or
    infinity is refused with the flag named (never silently replaced by the config's value)."""
    for flag, (attr, lowest, inclusive, allowed) in OVERRIDES.items():
        value = getattr(args, attr)
        if value is None:
            continue
        finite = math.isfinite(value)
        in_range = value >= lowest if inclusive else value > lowest
        if not finite or not in_range:
            raise UsageError(f"{flag} {value}: give {allowed}")
