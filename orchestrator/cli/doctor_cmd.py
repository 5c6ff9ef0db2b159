"""`runctl doctor RUN_DIR`: is the run supervised? For cron on any login node (docs/oncall.md).

Exit 0 when the controller beats and its passes succeed, a job is queued or running and the disk
holds the next checkpoint; 1 (and a notification, once per new problem) otherwise. `--restart-controller`
starts `runctl watch RUN_DIR --detach` when the controller is missing or stale and the caller
owns the run. The checks and why they are judged as they are: orchestrator/views/doctor.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from orchestrator.cli import watch_cmd
from orchestrator.contract import RunPaths
from orchestrator.contract.controller_lock import lock_holder
from orchestrator.contract.severity import Notice
from orchestrator.errors import EXIT_FAILURE, EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    doctor = subparsers.add_parser(
        "doctor",
        help="for cron: is the controller alive, a job queued or running, the disk ok? (exit 1 if not)",
        description="Check that the run is supervised: its controller runs (its pid is alive or it holds the "
        "run's lock), its heartbeat moves and its passes do not keep failing, a job is queued or running "
        "while the run should train, and "
        "the checkpoint disk holds the next save. Exit 1 and a notification (once per new problem) when "
        "not; --restart-controller starts a missing controller for the owner. Writes nothing in the run.",
    )
    doctor.add_argument("run_dir", help="run directory")
    doctor.add_argument(
        "--stale-after", type=float, default=None, metavar="S",
        help="seconds without a controller pass that count as dead (default max(600, 10 x watchdog.poll_seconds))",
    )  # fmt: skip
    doctor.add_argument(
        "--grace", type=float, default=600.0, metavar="S",
        help="seconds a run may be between jobs before it counts as jobless (default 600)",
    )  # fmt: skip
    doctor.add_argument(
        "--restart-controller", action="store_true",
        help="start `runctl watch --detach` when the controller is missing or stale (owner only)",
    )  # fmt: skip
    doctor.add_argument(
        "--state-dir", help="where the doctor remembers its last look (default ~/.local/state/runctl)"
    )
    doctor.add_argument("--quiet", action="store_true", help="print only problems (cron mails any output)")
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    doctor.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from orchestrator.controller.notify import notify  # noqa: PLC0415 - lazy: +118 ms on every runctl start
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start
    from orchestrator.views import doctor  # noqa: PLC0415 - lazy: +5 ms on every runctl start

    paths = RunPaths.of(args.run_dir)
    if not paths.config.exists():
        raise UsageError(f"{paths.root} is not a run directory (no run.yaml)")
    cfg = load_run_config(paths.root)
    stale_after = (
        args.stale_after if args.stale_after is not None else max(600.0, 10 * cfg.watchdog.poll_seconds)
    )
    findings, memory, where = doctor.diagnose(
        paths.root, cfg, watch_cmd.scheduler_for_run(paths.root), stale_after=stale_after, grace=args.grace,
        state_dir=args.state_dir,
    )  # fmt: skip
    controller = findings[0]
    if args.restart_controller and not controller.ok:
        findings.append(_restart(paths.root))
    problems = [f for f in findings if not f.ok]
    if doctor.should_notify(findings, memory):
        message = "; ".join(f"{f.check}: {f.message}" for f in problems)
        for failure in notify(
            cfg.notifications,
            cfg.name,
            Notice.DOCTOR,
            f"runctl doctor: {message}",
            {"run_dir": str(paths.root)},
        ):
            print(f"notification failed: {failure}", file=sys.stderr)
    try:
        doctor.save_memory(where, memory)
    except OSError as exc:  # without memory the next look falls back to the file's mtime
        print(f"runctl doctor: cannot write {where}: {exc}", file=sys.stderr)
    if args.json:
        print(
            json.dumps({"run_dir": str(paths.root), "ok": not problems, "findings": doctor.as_json(findings)})
        )
    else:
        for finding in findings:
            if finding.ok and args.quiet:
                continue
            print(f"{'ok     ' if finding.ok else 'PROBLEM'} {finding.check}: {finding.message}")
    return EXIT_FAILURE if problems else EXIT_OK


def _restart(run_root):
    from orchestrator.views.doctor import DoctorFinding  # noqa: PLC0415 - lazy: +5 ms on every runctl start

    if os.geteuid() != run_root.stat().st_uid:
        return DoctorFinding("restart", False, "not restarted: only the run's owner may start its controller")
    holder = lock_holder(run_root)
    if holder:
        return DoctorFinding(
            "restart", False,
            f"not restarted: pid {holder.get('pid')} on {holder.get('host')} still holds the run's lock "
            "(a hung controller): kill it there, then run the doctor again",
        )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", "watch", str(run_root), "--detach"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        return DoctorFinding(
            "restart", False, f"`runctl watch --detach` failed: {(proc.stderr or proc.stdout).strip()[:300]}"
        )
    return DoctorFinding("restart", True, f"controller restarted: {proc.stdout.strip()}")
