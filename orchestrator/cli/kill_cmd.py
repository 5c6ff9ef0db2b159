"""`runctl kill`, `runctl resume`, `runctl nodes`: the team's controls of a run.

Any configured operator may use them, not only the owner: they write requests into the
group-writable control/ directory, and the controller (running as the owner) authenticates them by
the file's owner, records them in audit.jsonl and carries them out (controller/requests.py). So a
kill needs a running controller; without one nothing stops the job, and `runctl kill` says so.
"""

from __future__ import annotations

import argparse
import json
import time

from orchestrator.errors import EXIT_OK, UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    kill = subparsers.add_parser(
        "kill", help="stop a run: the trainer saves a checkpoint and exits; no restart"
    )
    kill.add_argument("run_dir", help="run directory")
    kill.add_argument("--reason", required=True, help="why (goes to the audit trail and notifications)")
    kill.add_argument("--now", action="store_true", help="no checkpoint: cancel the job at once (scancel)")
    kill.set_defaults(func=run_kill)

    resume = subparsers.add_parser(
        "resume", help="undo a kill (or a crash-loop stop) and submit again from the last checkpoint"
    )
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
    try:
        paths.config.stat()
        with open(paths.config, "rb"):
            pass
    except PermissionError:
        from orchestrator.errors import PermissionDeniedError  # noqa: PLC0415
        from orchestrator.operators import group_name  # noqa: PLC0415

        raise PermissionDeniedError(
            f"you cannot read {paths.config}: the run is readable by its owner and group "
            f"{group_name(paths.root.stat().st_gid)} only (docs/security.md). If you are on call for it, "
            f"ask the owner to add you to operators.group (and the group), then log in again."
        ) from None
    except FileNotFoundError:
        pass  # load_run_config says what is missing
    return paths, load_run_config(paths.root)


def _drop_request(paths, cfg, user, name: str, body: dict) -> None:
    """Write control/<name> as `user`; an operator the kernel does not let in gets the fix."""
    from orchestrator.operators import cannot_write_control  # noqa: PLC0415
    from orchestrator.protocol import atomic_write_json  # noqa: PLC0415

    try:
        atomic_write_json(paths.control_request(name), body, mode=0o660)
    except PermissionError as exc:
        raise cannot_write_control(paths, cfg.operators, user, exc) from None


def run_kill(args: argparse.Namespace) -> int:
    from orchestrator.controller.lock import lock_holder  # noqa: PLC0415
    from orchestrator.operators import require_operator  # noqa: PLC0415
    from orchestrator.protocol import KILL_REQUEST  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    if not args.reason.strip():
        raise UsageError("--reason must say why (it goes to the audit trail)")
    user = require_operator(paths, cfg.operators, "kill --now" if args.now else "kill")
    request = {"reason": args.reason, "now": args.now, "time": time.time()}
    _drop_request(paths, cfg, user, KILL_REQUEST, request)
    holder = lock_holder(paths.root)
    if holder is None:
        print(
            f"kill requested by {user.name}, but NO CONTROLLER IS RUNNING for this run: nothing stops the job "
            f"until one does. The trainer obeys only a kill the controller has checked, so the owner "
            f"({_owner(paths)}) must start `runctl watch {paths.root} --detach`; it then records the request, "
            f"cancels queued jobs and stops the job. If the job must stop now and the owner cannot be reached: "
            f"ask a SLURM admin to `scancel` it (jobs: `runctl status {paths.root}`)."
        )
        return EXIT_OK
    how = (
        "the job is cancelled at once (no checkpoint)"
        if args.now
        else "the trainer saves a checkpoint and stops"
    )
    print(
        f"kill requested by {user.name}; the controller (pid {holder.get('pid')} on {holder.get('host')}) "
        f"checks it at its next pass: {how}; queued jobs are cancelled; no restart until `runctl resume`."
    )
    return EXIT_OK


def _owner(paths) -> str:
    from orchestrator.operators import run_owner  # noqa: PLC0415

    return run_owner(paths)


def run_resume(args: argparse.Namespace) -> int:
    from orchestrator.cli.watch_cmd import make_controller  # noqa: PLC0415
    from orchestrator.controller.lock import lock_holder  # noqa: PLC0415
    from orchestrator.operators import User, cannot_write_control, require_operator, run_owner  # noqa: PLC0415
    from orchestrator.protocol import KILL_REQUEST, RESUME_REQUEST  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    user = require_operator(paths, cfg.operators, "resume")
    try:
        paths.control_request(KILL_REQUEST).unlink(missing_ok=True)
    except PermissionError as exc:
        raise cannot_write_control(paths, cfg.operators, user, exc) from None
    _drop_request(paths, cfg, user, RESUME_REQUEST, {"reason": args.reason, "time": time.time()})
    holder = lock_holder(paths.root)
    if holder is not None:
        print(f"resume requested; the controller (pid {holder.get('pid')}) submits the next job.")
        return EXIT_OK
    if User.current().uid != paths.root.stat().st_uid:
        print(
            "resume requested; no controller is running: it is submitted when the owner "
            f"({run_owner(paths)}) starts `runctl watch {paths.root}`."
        )
        return EXIT_OK
    controller = make_controller(paths.root)
    controller.start()
    try:
        result = controller.tick()
    finally:
        controller.stop()
    print(
        f"resumed: {'; '.join(result.actions) or 'nothing to do (the run was not stopped)'}. "
        f"Start `runctl watch {paths.root} --detach` to supervise it."
    )
    return EXIT_OK


def run_nodes(args: argparse.Namespace) -> int:
    from orchestrator.controller.exclude import clear_excluded, read_excluded  # noqa: PLC0415
    from orchestrator.operators import audit, require_operator  # noqa: PLC0415
    from orchestrator.textsafe import for_terminal  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    if args.clear or args.all:
        targets = None if args.all else list(args.clear)
        user = require_operator(paths, cfg.operators, "nodes --clear")
        try:
            removed = clear_excluded(paths, targets)
        except PermissionError as exc:
            from orchestrator.operators import cannot_write_control  # noqa: PLC0415

            raise cannot_write_control(paths, cfg.operators, user, exc) from None
        # The owner's own change is audited here; anyone else's by the controller, which sees
        # who rewrote the exclude list (orchestrator/controller/requests.py).
        audit(
            paths, user, "nodes --clear", args.reason, allowed=True, nodes=targets or "all", removed=removed
        )
        missing = sorted(set(targets or []) - set(removed))
        print(
            f"cleared: {', '.join(removed) or 'nothing'}"
            + (f" (not on the list: {', '.join(missing)})" if missing else "")
        )
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
            print(
                f"{for_terminal(node)}  since {since}  by {for_terminal(info.get('by'))}  "
                f"({for_terminal(info.get('reason'))})"
            )
    return EXIT_OK
