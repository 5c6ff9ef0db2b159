"""`runctl report RUN_DIR`: loss curve PNG with restarts marked, and the goodput summary."""

from __future__ import annotations

import argparse
import json

from orchestrator.contract import RunPaths
from orchestrator.contract.state import load_state
from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser(
        "report",
        help="loss curve (PNG, restarts marked) and goodput of a run",
        description="Summarise a run: steps, final loss, status; goodput (useful training / wall time) and "
        "where the rest went, for the whole run and the last 24 h; every incident with its detection and "
        "recovery times and the work it lost. Writes reports/loss.png, reports/goodput.png and "
        "reports/summary.json in the run directory (or --out).",
    )
    report.add_argument("run_dir", help="run directory")
    report.add_argument("--out", help="output folder (default RUN_DIR/reports)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from orchestrator.operate.runs import run_name  # noqa: PLC0415 - lazy: +41 ms on every runctl start
    from orchestrator.views.report import write_report  # noqa: PLC0415 - lazy: +7 ms on every runctl start

    paths = RunPaths.of(args.run_dir)
    if not paths.config.exists():
        raise UsageError(f"{paths.root} is not a run directory (no run.yaml)")
    summary = write_report(paths.root, args.out)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return EXIT_OK
    goodput = summary["goodput"]
    loss = summary["final_loss"]
    status = summary["status"] or (
        load_state(paths).status.value if paths.state.exists() else "never supervised"
    )
    print(
        f"run {for_terminal(run_name(paths))}: {summary['steps']} steps, final loss "
        f"{f'{loss:.4f}' if isinstance(loss, (int, float)) else '-'}, status {status}"
    )
    print(f"run directory: {paths.root}")
    if goodput is not None:
        print_goodput(summary)
    for n, incident in enumerate(summary["incidents"], 1):
        for line in describe_incident(n, incident):
            print(for_terminal(line))
    print(f"loss curve: {summary['loss_png'] or summary.get('loss_png_skipped')}")
    if summary.get("goodput_png"):
        print(f"time breakdown: {summary['goodput_png']}")
    print(f"summary: {summary['summary_json']}")
    return EXIT_OK


def print_goodput(summary: dict) -> None:
    """The whole-run and last-24 h breakdown of wall time (also what `make demo` ends with)."""
    from orchestrator.views.event_text import duration  # noqa: PLC0415 - lazy: +10 ms on every runctl start
    from orchestrator.views.goodput import format_breakdown  # noqa: PLC0415 - lazy: +5 ms on every runctl start

    tb = summary["time_breakdown"]
    parts = [("whole run", tb["whole_run"]), ("last 24 h", tb["last_24h"])]
    if tb["last_24h"]["wall_seconds"] >= tb["whole_run"]["wall_seconds"]:
        parts = [("whole run, all of it in the last 24 h", tb["whole_run"])]  # the same numbers: once
    for title, part in parts:
        share = f"{part['goodput']:.1%}" if part["goodput"] is not None else "-"
        print(f"goodput ({title}): {share} of {part['wall_seconds'] / 3600:.2f} h wall")
        for line in format_breakdown(part):
            print(f"  {line}")
    spent = summary["spent_compute_seconds"]
    print(f"  ({summary['restarts']} restart(s); {duration(spent)} of step compute spent)")


def describe_incident(number: int, incident: dict) -> list[str]:
    """A report's incident (summary["incidents"], not an event) in words, on short lines."""
    from orchestrator.views.event_text import duration, hosts  # noqa: PLC0415 - lazy: +10 ms on every runctl start

    i = incident  # not a beat or event: the report's incident
    where = (
        "inside the job" if i["in_allocation"] else f"as job {i['new_job']}"
    )  # not a beat or event: the report's incident
    lines = [
        f"  incident {number}: {i['cause']} in job {i['failed_job']}; restarted {where} from step "
        f"{i['resume_step']}",  # not a beat or event: the report's incident
        f"    detected after {duration(i['detection_latency_s'])}; training again after "
        f"{duration(i['failure_to_first_step_s'])}; {i['work_lost_steps']} step(s) lost",  # not a beat or event: the report's incident
    ]
    if i["excluded"]:
        lines.append(f"    excluded: {hosts(i['excluded'])}")
    return lines
