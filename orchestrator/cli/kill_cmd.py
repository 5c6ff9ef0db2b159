"""`runctl kill`, `runctl resume`, `runctl nodes --clear`: the team's controls of a run (the
rules are operate/requests.py's; a kill needs a running controller, and `runctl kill` says so when
none runs)."""

from __future__ import annotations

import argparse
import json
import time

from orchestrator.cli import watch_cmd
from orchestrator.contract.exclude import read_exclusions
from orchestrator.contract.textsafe import for_terminal
from orchestrator.errors import EXIT_OK


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


def run_kill(args: argparse.Namespace) -> int:
    from orchestrator.operate.requests import open_run, request_kill  # noqa: PLC0415 - lazy: +58 ms on every runctl start

    paths, cfg = open_run(args.run_dir)
    asked = request_kill(paths, cfg, args.reason, args.now)
    if asked.controller is None:
        print(
            f"kill requested by {asked.user.name}, but NO CONTROLLER IS RUNNING for this run: nothing stops the "
            f"job until one does. The trainer obeys only a kill the controller has checked, so the owner "
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
        f"kill requested by {asked.user.name}; the controller (pid {asked.controller.get('pid')} on "
        f"{asked.controller.get('host')}) checks it at its next pass: {how}; queued jobs are cancelled; no restart "
        "until `runctl resume`."
    )
    return EXIT_OK


def _owner(paths) -> str:
    from orchestrator.contract.operators import run_owner  # noqa: PLC0415 - lazy: +6 ms on every runctl start

    return run_owner(paths)


def run_resume(args: argparse.Namespace) -> int:
    from orchestrator.operate.requests import open_run, request_resume  # noqa: PLC0415 - lazy: +58 ms on every runctl start

    paths, cfg = open_run(args.run_dir)
    asked = request_resume(paths, cfg, args.reason)
    if asked.withdrawn:
        print(f"{asked.withdrawn}: recorded with the resume in the audit trail")
    if asked.controller is not None:
        print(f"resume requested; the controller (pid {asked.controller.get('pid')}) submits the next job.")
        return EXIT_OK
    if not asked.asked_by_owner:
        print(
            "resume requested; no controller is running: it is submitted when the owner "
            f"({_owner(paths)}) starts `runctl watch {paths.root}`."
        )
        return EXIT_OK
    result = watch_cmd.one_pass_now(paths.root)
    print(
        f"resumed: {'; '.join(result.actions) or 'nothing to do (the run was not stopped)'}. "
        f"Start `runctl watch {paths.root} --detach` to supervise it."
    )
    return EXIT_OK


def run_nodes(args: argparse.Namespace) -> int:
    from orchestrator.operate.requests import open_run  # noqa: PLC0415 - lazy: +58 ms on every runctl start

    paths, cfg = open_run(args.run_dir)
    if args.clear or args.all:
        return _request_clear(paths, cfg, args)
    exclusions = read_exclusions(paths)
    if args.json:
        print(
            json.dumps(
                {node: entry.to_entry() for node, entry in exclusions.items()}, indent=2, sort_keys=True
            )
        )
    elif not exclusions:
        print("no excluded nodes")
    else:
        now = time.time()
        for node, entry in sorted(exclusions.items()):
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
    from orchestrator.operate.requests import request_node_clear  # noqa: PLC0415 - lazy: +58 ms on every runctl start

    nodes = [] if args.all else list(args.clear)
    asked = request_node_clear(paths, cfg, nodes, args.all, args.reason)
    what = "every node" if args.all else ", ".join(nodes)
    if asked.controller is None:
        print(
            f"clearing {what} requested by {asked.user.name}; no controller is running: the owner's next "
            f"`runctl watch {paths.root}` checks the request, records it and clears the nodes."
        )
    else:
        print(
            f"clearing {what} requested by {asked.user.name}; the controller (pid {asked.controller.get('pid')}) "
            "checks it at its next pass, records it and gives queued jobs the new exclude list."
        )
    return EXIT_OK
