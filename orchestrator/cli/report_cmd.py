"""`runctl report RUN_DIR`: loss curve PNG with restarts marked, and the goodput summary."""

from __future__ import annotations

import argparse
import json

from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="loss curve (PNG, restarts marked) and goodput of a run")
    report.add_argument("run_dir", help="run directory")
    report.add_argument("--out", help="output folder (default RUN_DIR/reports)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from orchestrator.protocol import RunPaths  # noqa: PLC0415
    from orchestrator.report import write_report  # noqa: PLC0415

    paths = RunPaths.of(args.run_dir)
    if not paths.config.exists():
        raise UsageError(f"{paths.root} is not a run directory (no run.yaml)")
    summary = write_report(paths.root, args.out)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return EXIT_OK
    goodput = summary["goodput"]
    print(
        f"run {paths.root.name}: {summary['steps']} steps, final loss {summary['final_loss']}, "
        f"status {summary['status'] or '?'}"
    )
    if goodput is not None:
        print_goodput(summary)
    for n, incident in enumerate(summary["incidents"], 1):
        print(
            f"  incident {n}: {incident['cause']} in job {incident['failed_job']} -> job {incident['new_job']}; "
            f"detected after {_s(incident['detection_latency_s'])}, training again after "
            f"{_s(incident['failure_to_first_step_s'])}, lost {incident['work_lost_steps']} step(s); "
            f"excluded {incident['excluded'] or 'none'}"
        )
    print(f"loss curve: {summary['loss_png'] or summary.get('loss_png_skipped')}")
    if summary.get("goodput_png"):
        print(f"time breakdown: {summary['goodput_png']}")
    print(f"summary: {summary['summary_json']}")
    return EXIT_OK


def print_goodput(summary: dict) -> None:
    """The whole-run and last-24 h breakdown of wall time (also what `make demo` ends with)."""
    from orchestrator.goodput import format_breakdown  # noqa: PLC0415

    tb = summary["time_breakdown"]
    for title, part in (("whole run", tb["whole_run"]), ("last 24 h", tb["last_24h"])):
        share = f"{part['goodput']:.1%}" if part["goodput"] is not None else "-"
        print(f"goodput ({title}): {share} of {part['wall_seconds'] / 3600:.2f} h wall")
        for line in format_breakdown(part):
            print(f"  {line}")
    print(
        f"  ({summary['restarts']} restart(s); {summary['spent_compute_seconds']:.1f} s of step compute spent)"
    )


def _s(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "?"
