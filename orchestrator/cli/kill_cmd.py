"""`runctl kill`, `runctl resume`, `runctl nodes --clear`: the team's controls of a run.

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
        "kill",
        help="stop a run: the trainer saves a checkpoint and exits; no restart",
        description="Ask the run's controller to stop the run: the trainer saves a checkpoint and exits "
        "(17), queued jobs of the chain are cancelled, nothing restarts until `runctl resume`. --now cancels "
        "the job at once, without a checkpoint. Any operator of the run may (owner, operators.users, "
        "operators.group); the controller checks who asked and records it in the audit trail. A run that "
        "has already stopped (finished, killed, crash loop, config error) cannot be killed.",
    )
    kill.add_argument("run_dir", help="run directory")
    kill.add_argument("--reason", required=True, help="why (goes to the audit trail and notifications)")
    kill.add_argument("--now", action="store_true", help="no checkpoint: cancel the job at once (scancel)")
    kill.set_defaults(func=run_kill)

    resume = subparsers.add_parser(
        "resume",
        help="undo a kill (or a crash-loop stop) and submit again from the last checkpoint",
        description="Withdraw a pending kill request and ask the controller to go on: after a kill, a crash "
        "loop or a config error it submits the next job, which resumes from the newest good checkpoint. "
        "The withdrawn kill is named in the resume's audit record. Without a running controller, the "
        "owner's resume runs one supervision pass at once; anyone else's waits for the controller.",
    )
    resume.add_argument("run_dir", help="run directory")
    resume.add_argument("--reason", default="resume", help="why (goes to the audit trail)")
    resume.set_defaults(func=run_resume)

    nodes = subparsers.add_parser(
        "nodes",
        help="show or clear the run's excluded nodes",
        description="List the nodes the controller excluded (why, when, by whom, when the probation "
        "expires), or ask the controller to clear some or all of them once repaired: --clear/--all drop a "
        "request in control/, which the controller authenticates (by the file's owner), records in the "
        "audit trail and carries out at its next pass; queued jobs get the new exclude list.",
    )
    nodes.add_argument("run_dir", help="run directory")
    which = nodes.add_mutually_exclusive_group()
    which.add_argument("--clear", action="append", metavar="NODE", help="take NODE off the list (repeatable)")
    which.add_argument("--all", action="store_true", help="clear the whole list")
    nodes.add_argument("--reason", default="node repaired", help="why (audit trail)")
    nodes.add_argument("--json", action="store_true")
    nodes.set_defaults(func=run_nodes)


def _run(run_dir: str):
    from orchestrator.contract import RunPaths  # noqa: PLC0415
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415

    paths = RunPaths.of(run_dir)
    try:
        paths.config.stat()
        with open(paths.config, "rb"):
            pass
    except PermissionError:
        from orchestrator.contract.operators import group_name  # noqa: PLC0415
        from orchestrator.errors import PermissionDeniedError  # noqa: PLC0415

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
    from orchestrator.contract import atomic_write_json  # noqa: PLC0415
    from orchestrator.contract.operators import cannot_write_control  # noqa: PLC0415

    try:
        atomic_write_json(paths.control_request(name), body, mode=0o660)
    except PermissionError as exc:
        raise cannot_write_control(paths, cfg.operators, user, exc) from None


def run_kill(args: argparse.Namespace) -> int:
    from orchestrator.contract import KILL_REQUEST, RequestBody  # noqa: PLC0415
    from orchestrator.contract.controller_lock import lock_holder  # noqa: PLC0415
    from orchestrator.contract.operators import require_operator  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    if not args.reason.strip():
        raise UsageError("--reason must say why (it goes to the audit trail)")
    user = require_operator(paths, cfg.operators, "kill --now" if args.now else "kill")
    _refuse_a_stopped_run(paths)
    _drop_request(paths, cfg, user, KILL_REQUEST, RequestBody(reason=args.reason, now=args.now).to_dict())
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


def _refuse_a_stopped_run(paths) -> None:
    """A kill of a run that has stopped would sit in control/ and stop the run's next resume: refused."""
    from orchestrator.contract.state import load_state  # noqa: PLC0415

    status = load_state(paths).status
    if status.stopped:
        after = {
            "finished": "it trained all its samples",
            "killed": "it was killed already",
            "crash_loop": "the controller stopped it after repeated failures",
            "config_error": "the trainer refused its config",
            "paused_for_health": "the controller paused it for training health (`runctl health`)",
        }[status.value]
        raise UsageError(
            f"the run has already stopped ({status.value}: {after}); no job of it runs and nothing restarts "
            f"it, so there is nothing to kill. `runctl status {paths.root}` shows its jobs"
            + ("" if status.value == "finished" else f"; `runctl resume {paths.root}` starts it again")
        )


def _withdraw_kill(paths, cfg, user) -> str:
    """Remove a pending control/kill; returns what it said, for the resume's reason (so that the
    audit trail keeps it), or "" when there was none. The file is another user's: read bounded,
    without following links."""
    from orchestrator.contract import KILL_REQUEST, RequestBody, UntrustedFileError  # noqa: PLC0415
    from orchestrator.contract.files import loads_bounded, read_untrusted  # noqa: PLC0415
    from orchestrator.contract.operators import User, cannot_write_control  # noqa: PLC0415
    from orchestrator.contract.requests import MAX_REQUEST_BYTES  # noqa: PLC0415
    from orchestrator.contract.textsafe import cap, for_terminal  # noqa: PLC0415

    path = paths.control_request(KILL_REQUEST)
    try:
        data, info = read_untrusted(path, MAX_REQUEST_BYTES)
    except FileNotFoundError:
        return ""
    except UntrustedFileError as exc:
        said, who = f"unreadable: {exc.reason}", "?"
    else:
        try:
            body = RequestBody.parse(loads_bounded(data))
        except ValueError:  # `touch control/kill`: a request with no reason
            body = RequestBody()
        said, who = f"reason: {cap(for_terminal(body.reason), 200)}", User.of_uid(info.st_uid).name
    try:
        path.unlink(missing_ok=True)
    except PermissionError as exc:
        raise cannot_write_control(paths, cfg.operators, user, exc) from None
    return f"withdrew the pending kill request of {who} ({said})"


def _owner(paths) -> str:
    from orchestrator.contract.operators import run_owner  # noqa: PLC0415

    return run_owner(paths)


def run_resume(args: argparse.Namespace) -> int:
    from orchestrator.cli.watch_cmd import one_pass_now  # noqa: PLC0415
    from orchestrator.contract import RESUME_REQUEST, RequestBody  # noqa: PLC0415
    from orchestrator.contract.controller_lock import lock_holder  # noqa: PLC0415
    from orchestrator.contract.operators import User, require_operator, run_owner  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    user = require_operator(paths, cfg.operators, "resume")
    withdrawn = _withdraw_kill(paths, cfg, user)
    reason = f"{args.reason}; {withdrawn}" if withdrawn else args.reason
    _drop_request(paths, cfg, user, RESUME_REQUEST, RequestBody(reason=reason).to_dict())
    if withdrawn:
        print(f"{withdrawn}: recorded with the resume in the audit trail")
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
    result = one_pass_now(paths.root)
    print(
        f"resumed: {'; '.join(result.actions) or 'nothing to do (the run was not stopped)'}. "
        f"Start `runctl watch {paths.root} --detach` to supervise it."
    )
    return EXIT_OK


def run_nodes(args: argparse.Namespace) -> int:
    from orchestrator.contract.exclude import read_excluded, read_exclusions  # noqa: PLC0415
    from orchestrator.contract.textsafe import for_terminal  # noqa: PLC0415

    paths, cfg = _run(args.run_dir)
    if args.clear or args.all:
        return _request_clear(paths, cfg, args)
    excluded = read_excluded(paths)
    if args.json:
        print(json.dumps(excluded, indent=2, sort_keys=True))
    elif not excluded:
        print("no excluded nodes")
    else:
        now = time.time()
        for node, entry in sorted(read_exclusions(paths).items()):
            since = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.since or 0))
            left = entry.expires_in(now)
            expiry = (
                "until cleared"
                if left is None
                else f"expires in {_duration(left)}"
                if left > 0
                else "expired"
            )
            print(
                f"{for_terminal(node)}  since {since}  {expiry}  by {for_terminal(entry.by)}  "
                f"({for_terminal(entry.reason)})"
            )
    return EXIT_OK


def _duration(seconds: float) -> str:
    hours, minutes = divmod(int(seconds) // 60, 60)
    return f"{hours // 24}d {hours % 24}h" if hours >= 24 else f"{hours}h {minutes:02d}m"


def _request_clear(paths, cfg, args: argparse.Namespace) -> int:
    """Drop control/nodes-clear: the controller checks who asked, audits it and clears the nodes
    (only the owner's processes write the exclude list)."""
    from orchestrator.contract import NODES_CLEAR_REQUEST, RequestBody  # noqa: PLC0415
    from orchestrator.contract.controller_lock import lock_holder  # noqa: PLC0415
    from orchestrator.contract.operators import require_operator  # noqa: PLC0415
    from orchestrator.contract.requests import bad_node_names  # noqa: PLC0415

    nodes = [] if args.all else list(args.clear)
    bad = bad_node_names(nodes)
    if bad:
        raise UsageError(
            f"--clear {bad[0]!r} is not a SLURM node name (letters, digits, '-' and '_'; one node each)"
        )
    if not args.reason.strip():
        raise UsageError("--reason must say why (it goes to the audit trail)")
    user = require_operator(paths, cfg.operators, "nodes --clear")
    body = RequestBody(reason=args.reason, nodes=tuple(nodes), all_nodes=args.all)
    _drop_request(paths, cfg, user, NODES_CLEAR_REQUEST, body.to_dict())
    what = "every node" if args.all else ", ".join(nodes)
    holder = lock_holder(paths.root)
    if holder is None:
        print(
            f"clearing {what} requested by {user.name}; no controller is running: the owner's next "
            f"`runctl watch {paths.root}` checks the request, records it and clears the nodes."
        )
    else:
        print(
            f"clearing {what} requested by {user.name}; the controller (pid {holder.get('pid')}) checks it "
            "at its next pass, records it and gives queued jobs the new exclude list."
        )
    return EXIT_OK
