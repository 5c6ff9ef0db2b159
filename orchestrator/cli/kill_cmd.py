"""`runctl kill`, `runctl resume`, `runctl nodes`: the team's controls of a run.

Any configured operator may use them, not only the owner: they write requests into the
group-writable control/ directory, and the controller (running as the owner) carries them out.
Every use, allowed or refused, is audited (orchestrator.operators).
"""

from __future__ import annotations

import argparse
import json
import time

from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    kill = subparsers.add_parser("kill", help="stop a run: the trainer saves a checkpoint and exits; no restart")
    kill.add_argument("run_dir", help="run directory")
    kill.add_argument("--reason", required=True, help="why (goes to the audit trail and notifications)")
    kill.add_argument("--now", action="store_true", help="no checkpoint: cancel the job at once (scancel)")
    kill.set_defaults(func=run_kill)

    resume = subparsers.add_parser("resume", help="undo a kill (or a crash-loop stop) and submit again from the last checkpoint")
    resume.add_argument("run_dir", help="run directory")
    resume.add_argument("--reason", default="resume", help="why (goes to the audit trail)")
    resume.set_defaults(func=run_resume)

    nodes = subparsers.add_parser("nodes", help="show or clear the run's excluded nodes")
    nodes.add_argument("run_dir", help="run directory")
    which = nodes.add_mutually_exclusive_group()
    which.add_argument("--clear", action="append", metavar="NODE", help="take NODE off the list (repeatable)")
    which.add_argument("--all", action="store_true", help="clear the whole list")
    nodes.add_argument("--reason", default="node repaired", help="why (audit trail)")
    nodes.add_argument("--json", action="store_true")
    nodes.set_defaults(func=run_nodes)


def _run(run_dir: str):
    from orchestrator.protocol import RunPaths  # noqa: PLC0415
    from orchestrator.runs import load_run_config  # noqa: PLC0415

    paths = RunPaths.of(run_dir)
    return paths, load_run_config(paths.root)


def run_kill(args: argparse.Namespace) -> int:
    from orchestrator.controller.lock import lock_holder  # noqa: PLC0415
    from orchestrator.operators import require_operator  # noqa: PLC0415
    from orchestrator.protocol import KILL_REQUEST, atomic_write_json  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    if not args.reason.strip():
        raise UsageError("--reason must say why (it goes to the audit trail)")
    user = require_operator(paths, cfg.operators, "kill --now" if args.now else "kill", args.reason)
    request = {"user": user.name, "reason": args.reason, "now": args.now, "time": time.time()}
    atomic_write_json(paths.control_request(KILL_REQUEST), request, mode=0o664)
    how = "the job is cancelled at once (no checkpoint)" if args.now else "the trainer saves a checkpoint and stops"
    print(f"kill requested by {user.name}: {how}; queued jobs are cancelled; no restart until `runctl resume`.")
    if lock_holder(paths.root) is None:
        print("warning: no controller is watching this run right now. The trainer still sees the request at its "
              "next step; to cancel queued jobs (and for --now) the owner must run `runctl watch "
              f"{paths.root}` (or `runctl cancel`).")
    return EXIT_OK


def run_resume(args: argparse.Namespace) -> int:
    from orchestrator.cli.watch_cmd import make_controller  # noqa: PLC0415
    from orchestrator.controller.lock import lock_holder  # noqa: PLC0415
    from orchestrator.controller.supervisor import RESUME_REQUEST  # noqa: PLC0415
    from orchestrator.operators import User, require_operator, run_owner  # noqa: PLC0415
    from orchestrator.protocol import KILL_REQUEST, atomic_write_json  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    user = require_operator(paths, cfg.operators, "resume", args.reason)
    paths.control_request(KILL_REQUEST).unlink(missing_ok=True)
    atomic_write_json(paths.control_request(RESUME_REQUEST), {"user": user.name, "reason": args.reason,
                                                              "time": time.time()}, mode=0o664)
    holder = lock_holder(paths.root)
    if holder is not None:
        print(f"resume requested; the controller (pid {holder.get('pid')}) submits the next job.")
        return EXIT_OK
    if User.current().name != run_owner(paths) and User.current().uid != 0:
        print("resume requested; no controller is running: it is submitted when the owner "
              f"({run_owner(paths)}) starts `runctl watch {paths.root}`.")
        return EXIT_OK
    controller = make_controller(paths.root)
    controller.start()
    try:
        result = controller.tick()
    finally:
        controller.stop()
    print(f"resumed: {'; '.join(result.actions) or 'nothing to do (the run was not stopped)'}. "
          f"Start `runctl watch {paths.root} --detach` to supervise it.")
    return EXIT_OK


def run_nodes(args: argparse.Namespace) -> int:
    from orchestrator.controller.exclude import clear_excluded, read_excluded  # noqa: PLC0415
    from orchestrator.operators import require_operator  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    if args.clear or args.all:
        targets = None if args.all else list(args.clear)
        require_operator(paths, cfg.operators, "nodes --clear", args.reason, nodes=targets or "all")
        removed = clear_excluded(paths, targets)
        missing = sorted(set(targets or []) - set(removed))
        print(f"cleared: {', '.join(removed) or 'nothing'}" + (f" (not on the list: {', '.join(missing)})" if missing else ""))
        print("queued jobs keep their exclude list; the next submission or restart uses the new one.")
        return EXIT_OK
    excluded = read_excluded(paths)
    if args.json:
        print(json.dumps(excluded, indent=2, sort_keys=True))
    elif not excluded:
        print("no excluded nodes")
    else:
        for node, info in sorted(excluded.items()):
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.get("since", 0)))
            print(f"{node}  since {since}  by {info.get('by')}  ({info.get('reason')})")
    return EXIT_OK
