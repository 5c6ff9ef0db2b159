"""`runctl health`, `runctl rollback`, `runctl sdc-check`: training health by hand (docs/oncall.md,
"The loss spiked").

- health: the findings of the run's training-health rules on the end of metrics.jsonl, what the
  controller did about them, and the loss curve around them as a PNG. Read-only, any operator.
- rollback: like kill, a request any operator drops into control/, which the controller
  authenticates by the file's owner and records in the audit trail (controller/requests.py); it
  stops the job gracefully, writes the directive (accepted/rollback) and submits again.
- sdc-check: replays steps of a checkpoint at the run's own layout (python -m trainer.replay) as an
  auxiliary job, owner-only like the others, and compares them with what the run recorded.
"""

from __future__ import annotations

import argparse
import json
import os

from orchestrator.cli import watch_cmd
from orchestrator.contract import DirectiveError, RollbackAsk
from orchestrator.errors import EXIT_FAILURE, EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    health = subparsers.add_parser(
        "health",
        help="training health: loss spikes, divergence, NaN storms, rollbacks; the loss curve as a PNG",
        description="The findings of the run's training-health rules (the `health:` thresholds of its "
        "run.yaml) on the end of metrics.jsonl, what the controller did about them (pauses, rollbacks), and "
        "a PNG of the loss curve around them. Reads the run directory only; any operator may.",
    )
    health.add_argument("run_dir", help="run directory")
    health.add_argument(
        "--png", metavar="FILE", help="where to write the plot (default ./<run name>-health.png)"
    )
    health.add_argument("--no-png", action="store_true", help="no plot")
    health.add_argument(
        "--around", type=int, default=50, metavar="N", help="steps shown either side of a finding"
    )
    health.add_argument("--json", action="store_true", help="print the findings and events as JSON")
    health.set_defaults(func=run_health)

    rollback = subparsers.add_parser(
        "rollback",
        help="go back to an earlier checkpoint, skip samples, optionally cut the LR",
        description="Ask the run's controller to roll back: the trainer saves and stops, then the run resumes "
        "from the newest verified checkpoint at or before --to-step, never trains on the --skip-samples ranges "
        "(positions A:B of the global sample order, B excluded: the unit of consumed_samples in metrics.jsonl), "
        "and scales the LR by --lr-scale for --for-steps steps. Any operator of the run may; the controller "
        "checks who asked and records it in the audit trail. A pending kill is withdrawn (named in the audit "
        "record). On a stopped run (killed, paused) it goes on at once; on a finished one it is refused.",
    )
    rollback.add_argument("run_dir", help="run directory")
    rollback.add_argument(
        "--to-step", type=int, required=True, metavar="S", help="resume at or before step S"
    )
    rollback.add_argument(
        "--skip-samples",
        action="append",
        default=[],
        metavar="A:B",
        help="never train on samples A..B-1 of the global order (repeatable; `runctl health` shows the onset)",
    )
    rollback.add_argument("--lr-scale", type=float, default=1.0, metavar="X", help="LR factor in (0, 1]")
    rollback.add_argument(
        "--for-steps", type=int, default=0, metavar="N", help="how many steps the LR cut lasts"
    )
    rollback.add_argument("--reason", required=True, help="why (goes to the audit trail and notifications)")
    rollback.set_defaults(func=run_rollback)

    sdc = subparsers.add_parser(
        "sdc-check",
        help="replay steps of a checkpoint and compare with metrics.jsonl (silent data corruption)",
        description="Load checkpoint --step at the run's own layout, replay --steps steps on the same samples, "
        "RNG states and LR (python -m trainer.replay), and compare the loss, grad norm, evaluation loss and each "
        "DP replica's loss with what the run recorded: bitwise on CPU, within a tolerance on GPU. A SLURM job on "
        "the run's partition (one node: the layout's ranks must fit on it), or here with --local. Exits 1 when a "
        "step differs, naming it (and the DP replica, when the run recorded per-replica losses). Owner only.",
    )
    sdc.add_argument("run_dir", help="run directory")
    sdc.add_argument("--step", type=int, required=True, metavar="S", help="the checkpoint to replay from")
    sdc.add_argument("--steps", type=int, default=1, metavar="K", help="how many steps to replay (default 1)")
    sdc.add_argument(
        "--local", action="store_true", help="run on this host (a subprocess, same files and events)"
    )
    sdc.add_argument("--time-min", type=int, default=60, help="the job's time limit in minutes (default 60)")
    sdc.add_argument("--reason", default="", help="why (goes to the event and the audit trail)")
    sdc.add_argument("--json", action="store_true", help="print the result as JSON")
    sdc.set_defaults(func=run_sdc_check)


# -- health ---------------------------------------------------------------------------------------
def run_health(args: argparse.Namespace) -> int:
    from orchestrator.operate.requests import open_run  # noqa: PLC0415 - lazy: +58 ms on every runctl start
    from orchestrator.views.health_report import describe, read_health  # noqa: PLC0415 - lazy: +12 ms on every runctl start

    if args.around < 1:
        raise UsageError(f"--around {args.around}: give a number of steps >= 1")
    paths, cfg = open_run(args.run_dir)
    view = read_health(paths.root, cfg)
    png = None
    if not args.no_png:
        from orchestrator.views.health_plot import plot_health  # noqa: PLC0415 - lazy: +13 ms on every runctl start

        target = args.png or os.path.join(os.getcwd(), f"{cfg.name}-health.png")
        written = plot_health(view, target, around=args.around, title=f"{cfg.name}: status {view.status}")
        png = str(written) if written else None
        if written is None and not args.json:
            print("no plot: matplotlib is not installed (pip install matplotlib)")
    if args.json:
        print(json.dumps({**view.to_dict(), "png": png}, default=str))
        return EXIT_OK
    for line in describe(view):
        print(line)
    if png:
        print(f"loss curve: {png}")
    return EXIT_OK


# -- rollback -------------------------------------------------------------------------------------
def _ranges(values: list[str]) -> list[list[int]]:
    ranges = []
    for text in values:
        start, sep, end = text.partition(":")
        try:
            if not sep:
                raise ValueError
            ranges.append([int(start), int(end)])
        except ValueError:
            raise UsageError(
                f"--skip-samples {text!r}: give A:B, sample positions A (first skipped) and B (first kept after)"
            ) from None
    return sorted(ranges)


def run_rollback(args: argparse.Namespace) -> int:
    from orchestrator.operate.requests import open_run, request_rollback  # noqa: PLC0415 - lazy: +58 ms on every runctl start

    paths, cfg = open_run(args.run_dir)
    try:
        ask = RollbackAsk(args.to_step, _ranges(args.skip_samples), args.lr_scale, args.for_steps)
    except DirectiveError as exc:
        flags = {"to_step": "--to-step", "skip_samples": "--skip-samples", "lr_scale_steps": "--for-steps",
                 "lr_scale": "--lr-scale"}  # fmt: skip
        named = next((flag for key, flag in flags.items() if f".{key}" in str(exc)), "the rollback")
        raise UsageError(f"{named}: {exc}") from None
    asked = request_rollback(paths, cfg, ask, args.reason)
    return _after_request(paths, asked, "rollback")


def _after_request(paths, asked, what: str) -> int:
    """Who carries the request out: the running controller, or (the owner's) one pass now."""
    from orchestrator.contract.operators import run_owner  # noqa: PLC0415 - lazy: +6 ms on every runctl start

    if asked.controller is not None:
        print(
            f"{what} requested by {asked.user.name}; the controller (pid {asked.controller.get('pid')}) checks it at "
            "its next pass: the trainer saves and stops, then the run goes on from the checkpoint asked for."
        )
        return EXIT_OK
    if not asked.asked_by_owner:
        print(
            f"{what} requested by {asked.user.name}; NO CONTROLLER IS RUNNING: it is carried out when the owner "
            f"({run_owner(paths)}) starts `runctl watch {paths.root} --detach`."
        )
        return EXIT_OK
    result = watch_cmd.one_pass_now(paths.root)
    print(
        f"{what}: {'; '.join(result.actions) or 'requested'} (status {result.status}). "
        f"Start `runctl watch {paths.root} --detach` to supervise it."
    )
    return EXIT_OK


# -- sdc-check ------------------------------------------------------------------------------------
def run_sdc_check(args: argparse.Namespace) -> int:
    from orchestrator.operate.auxjobs import run_aux  # noqa: PLC0415 - lazy: +7 ms on every runctl start
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start

    if args.step < 0 or args.steps < 1:
        raise UsageError(f"--step {args.step} --steps {args.steps}: give a step >= 0 and at least 1 step")
    cfg = load_run_config(args.run_dir)
    if cfg.cluster.accelerator == "cuda" and cfg.world_size > cfg.cluster.gpus_per_node:
        raise UsageError(
            f"sdc-check replays on one node: the run's {cfg.world_size} ranks need more than its "
            f"{cfg.cluster.gpus_per_node} GPUs (a replay across nodes is not implemented)"
        )

    def submitted(aux) -> None:
        if not args.json:
            where = "here (--local)" if aux.where == "local" else "on SLURM"
            print(f"sdc-check: job {aux.job_id} {where}; log {aux.log}", flush=True)

    kwargs = {"run_dir": os.path.abspath(args.run_dir), "step": args.step, "steps": args.steps}
    outcome = run_aux(
        args.run_dir, "sdc-check", kwargs, local=args.local, time_minutes=args.time_min, reason=args.reason,
        on_submitted=submitted,
    )  # fmt: skip
    result = outcome.result or {}
    if args.json:
        print(json.dumps(result, default=str))
    else:
        print(describe_replay(result))
    return EXIT_OK if result.get("match") else EXIT_FAILURE


def describe_replay(result: dict) -> str:
    """One paragraph for a person from trainer.aux_tasks.sdc_check's result."""
    steps = result.get("steps_replayed") or []
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
    head = f"sdc-check of {result.get('checkpoint')} ({span}, {result.get('comparison')}): "
    if result.get("match"):
        return head + f"MATCH: every step computes what the run recorded. Report: {result.get('report')}"
    first = result.get("first_mismatch") or {}
    lines = [head + "MISMATCH"]
    if first:
        lines.append(
            f"  first differing step: {first.get('step')} ({', '.join(first.get('differ') or []) or 'per replica'})"
        )
        for replica in first.get("dp_replicas") or []:
            lines.append(
                f"  DP replica {replica.get('dp_replica')} (global ranks {replica.get('ranks')}) differs"  # not a beat or event: the replay's result
            )
    if result.get("probe_problems"):
        lines.append(f"  the checkpoint's probe: {'; '.join(result['probe_problems'][:3])}")
    lines.append(f"  mismatched steps: {result.get('mismatched_steps')}; report: {result.get('report')}")
    return "\n".join(lines)
