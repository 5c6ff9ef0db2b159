"""`runctl watch RUN_DIR`: run the controller of one run (foreground live view, `--detach` daemon,
`--once` one pass). What it saw and did: `runctl events RUN_DIR` (events_cmd.py).

Why a daemon on the login node and not a SLURM job: the controller exists to notice when SLURM
jobs die or hang; a controller that is itself a SLURM job would need its own controller (and
would queue behind the very allocation it watches). A detached process on the login node
(double fork + setsid, pid file and log in the run directory) is restarted by cron or by hand
(`runctl watch --detach` again is safe: the run lock refuses a second controller, and state.json
lets a new one pick up where the last one stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from orchestrator.contract import RunPaths
from orchestrator.contract.controller_lock import lock_holder
from orchestrator.contract.events import read_events
from orchestrator.errors import EXIT_OK, PermissionDeniedError, RunBusyError, UsageError
from orchestrator.slurm import BACKENDS, get_scheduler

PID_FILE = "controller.pid"
LOG_FILE = "controller.log"


def register(subparsers: argparse._SubParsersAction) -> None:
    watch = subparsers.add_parser(
        "watch",
        help="supervise a run: detect dead/hung ranks, restart, obey the kill switch",
        description="Run the controller of a run (only its owner may): it watches every rank's heartbeat "
        "and the jobs, restarts from the last good checkpoint after a failure or a hang, excludes bad "
        "nodes, carries out operators' kill and resume requests, and keeps the job chain going. In the "
        "foreground with a live view, or --detach as a daemon (pid and log in the run directory).",
    )
    watch.add_argument("run_dir", help="run directory (made by `runctl submit`)")
    mode = watch.add_mutually_exclusive_group()
    mode.add_argument(
        "--detach", action="store_true", help="run in the background (pid and log in the run directory)"
    )
    mode.add_argument("--once", action="store_true", help="one supervision pass, then exit (tests, cron)")
    watch.add_argument(
        "--stay", action="store_true", help="keep watching after the run stops (wait for `runctl resume`)"
    )
    watch.add_argument("--plain", action="store_true", help="log lines instead of the live view")
    watch.add_argument("--json", action="store_true", help="with --once: print the pass result as JSON")
    watch.set_defaults(func=run_watch)


def scheduler_for_run(run_dir: Path):
    """The backend the run was submitted with (from the submission ledger), else the default."""
    from orchestrator.contract.ledger import read_submissions  # noqa: PLC0415 - lazy: +2 ms on every runctl start

    ledger = read_submissions(RunPaths.of(run_dir).submissions)
    name = ledger[-1].scheduler if ledger else None
    if os.environ.get("RUNCTL_SCHEDULER") or name not in BACKENDS:
        name = None
    return get_scheduler(name)


def make_controller(run_dir: Path, scheduler=None):
    from orchestrator.controller import Controller  # noqa: PLC0415 - lazy: +122 ms on every runctl start
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415 - lazy: +41 ms on every runctl start

    cfg = load_run_config(run_dir)
    return Controller(run_dir, cfg, scheduler or scheduler_for_run(run_dir))


def one_pass_now(run_dir: Path):
    """The owner asked for something (resume, rollback) and no controller runs: one pass now, so
    the request is carried out at once; its PassResult."""
    controller = make_controller(run_dir)
    controller.start()
    try:
        return controller.tick()
    finally:
        controller.stop()


def refuse_non_owner(run_dir: Path) -> None:
    """Only the run's owner runs its controller: it submits jobs (they would run as whoever runs
    it) and is the only writer of state, events and the audit trail (docs/security.md)."""
    owner_uid = run_dir.stat().st_uid
    if os.geteuid() == owner_uid:
        return
    from orchestrator.contract.operators import User, run_owner  # noqa: PLC0415 - lazy: +6 ms on every runctl start

    raise PermissionDeniedError(
        f"only the owner of {run_dir} ({run_owner(RunPaths.of(run_dir))}) may run its controller; you are "
        f"{User.current().name}. To follow the run use `runctl status {run_dir}` or `runctl events {run_dir}`; "
        f"to stop it `runctl kill`; if no controller is running, ask the owner to start "
        f"`runctl watch {run_dir} --detach`."
    )


def run_watch(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir).resolve()
    if not (run_dir / "run.yaml").exists():
        raise UsageError(
            f"{run_dir} is not a run directory (no run.yaml): give the directory `runctl submit` made"
        )
    refuse_non_owner(run_dir)
    if args.detach:
        return detach(run_dir, stay=args.stay)
    controller = make_controller(run_dir)
    controller.start()
    try:
        if args.once:
            result = controller.tick()
            if args.json:
                a = result.assessment
                print(
                    json.dumps(
                        {
                            "status": result.status,
                            "actions": result.actions,
                            "findings": [f.as_dict() for f in a.findings] if a else [],
                            "ranks_seen": a.ranks_seen if a else 0,
                        }
                    )
                )
            else:
                _print_dashboard(run_dir)
            return EXIT_OK
        if args.plain or not sys.stdout.isatty():
            status = controller.run(on_pass=_plain_logger(run_dir), stay=args.stay)
        else:
            status = _live(controller, run_dir, args.stay)
        print(f"run {controller.cfg.name}: {status}")
        return EXIT_OK
    finally:
        controller.stop()


def _plain_logger(run_dir: Path):
    from orchestrator.views.event_text import clock, sentence  # noqa: PLC0415 - lazy: +10 ms on every runctl start

    seen = {"n": len(read_events(RunPaths.of(run_dir).events))}

    def on_pass(result) -> None:
        events = read_events(RunPaths.of(run_dir).events)
        for event in events[seen["n"] :]:
            try:
                print(f"[watch] {clock(event.time)} {sentence(event)}", flush=True)
            except OSError as exc:  # stdout on a full disk: these lines again next pass
                _say_on_stderr(f"[watch] cannot write to stdout ({exc}); retrying next pass")
                return
            seen["n"] += 1

    return on_pass


def _say_on_stderr(line: str) -> None:
    """Best effort: stderr may sit on the same full disk."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def _screen(run_dir: Path):
    """The `runctl status` screen, from the controller's own records (it asks SLURM every pass)."""
    from orchestrator.views.dashboard import status_data  # noqa: PLC0415 - lazy: +25 ms on every runctl start
    from orchestrator.views.status_screen import render_status  # noqa: PLC0415 - lazy: +44 ms on every runctl start

    return render_status(status_data(run_dir))


def _live(controller, run_dir: Path, stay: bool) -> str:
    from rich.live import Live  # noqa: PLC0415 - lazy: +19 ms on every runctl start

    with Live(_screen(run_dir), auto_refresh=False) as live:
        return controller.run(on_pass=lambda _r: live.update(_screen(run_dir), refresh=True), stay=stay)


def _print_dashboard(run_dir: Path) -> None:
    from rich.console import Console  # noqa: PLC0415 - lazy: +17 ms on every runctl start

    Console().print(_screen(run_dir))


def detach(run_dir: Path, stay: bool = False) -> int:
    """Double fork + setsid: the controller survives the login shell; pid/log in the run dir."""

    holder = lock_holder(run_dir)
    if holder:
        raise RunBusyError(
            f"a controller already watches {run_dir}: pid {holder.get('pid')} on {holder.get('host')}"
        )
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid > 0:  # the CLI: wait for the grandchild's pid, print it, return
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            daemon_pid = pipe.read().strip()
        os.waitpid(pid, 0)
        print(
            f"controller for {run_dir.name} running as pid {daemon_pid}; log: {run_dir / LOG_FILE}; "
            f"stop it with `kill {daemon_pid}`"
        )
        return EXIT_OK
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    log = os.open(run_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir("/")
    (run_dir / PID_FILE).write_text(f"{os.getpid()}\n")
    os.write(write_end, str(os.getpid()).encode())
    os.close(write_end)
    code = 1
    try:
        import logging  # noqa: PLC0415 - lazy: +3 ms on every runctl start

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        controller = make_controller(run_dir)
        controller.start()
        try:
            status = controller.run(stay=stay)
            print(f"run {controller.cfg.name}: {status}", flush=True)
            code = 0
        except KeyboardInterrupt:
            print("controller stopped by SIGTERM", flush=True)
            code = 0
        finally:
            controller.stop()
    except Exception as exc:  # the log is the only place a daemon can say why it died
        print(f"controller died: {type(exc).__name__}: {exc}", flush=True)
    finally:
        (run_dir / PID_FILE).unlink(missing_ok=True)
        os._exit(code)
