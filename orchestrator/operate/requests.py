"""What an operator asks of a run: kill, resume, roll back, clear excluded nodes.

Any configured operator may ask, not only the owner: a request is a file in the group-writable
control/ directory, and the controller (running as the owner) authenticates it by the file's
owner, records it in audit.jsonl and carries it out (controller/requests.py). The rules that can
be checked before dropping the file are checked here, so that a request that cannot do anything
is refused with the reason and the fix, and never waits in control/ to surprise a later pass:
- only an operator of the run may ask (contract.operators.require_operator);
- a kill of a run that has stopped is refused: it would stop the run's next resume;
- a resume or a rollback withdraws a pending kill, and names it in its own audit record;
- a rollback needs a complete checkpoint at or before its step, and a run that has not finished.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.contract import (
    KILL_REQUEST,
    NODES_CLEAR_REQUEST,
    RESUME_REQUEST,
    ROLLBACK_REQUEST,
    RequestBody,
    RollbackAsk,
    RunPaths,
    UntrustedFileError,
    atomic_write_json,
)
from orchestrator.contract.checkpoints import list_checkpoints
from orchestrator.contract.controller_lock import lock_holder
from orchestrator.contract.files import loads_bounded, read_untrusted
from orchestrator.contract.operators import User, cannot_write_control, group_name, require_operator
from orchestrator.contract.requests import MAX_REQUEST_BYTES, bad_node_names
from orchestrator.contract.state import RunStatus, load_state
from orchestrator.contract.textsafe import cap, for_terminal
from orchestrator.errors import PermissionDeniedError, UsageError
from orchestrator.operate.runs import load_run_config

# Why a stopped run stopped, for the refusal of a kill.
STOPPED_BECAUSE = {
    RunStatus.FINISHED: "it trained all its samples",
    RunStatus.KILLED: "it was killed already",
    RunStatus.CRASH_LOOP: "the controller stopped it after repeated failures",
    RunStatus.CONFIG_ERROR: "the trainer refused its config",
    RunStatus.PAUSED: "the controller paused it for training health (`runctl health`)",
}


@dataclass(frozen=True)
class Requested:
    """A request dropped in control/: who asked, the controller that will carry it out (its lock
    record: pid, host; None when none runs), and the kill it withdrew, if any."""

    user: User
    controller: dict[str, Any] | None
    withdrawn: str = ""
    owner_uid: int = -1

    @property
    def asked_by_owner(self) -> bool:
        return self.user.uid == self.owner_uid


def open_run(run_dir: str) -> tuple[RunPaths, Any]:
    """The run's paths and config, with the fix when this user may not read them."""
    paths = RunPaths.of(run_dir)
    try:
        with open(paths.config, "rb"):
            pass
    except PermissionError:
        raise PermissionDeniedError(
            f"you cannot read {paths.config}: the run is readable by its owner and group "
            f"{group_name(paths.root.stat().st_gid)} only (docs/security.md). If you are on call for it, "
            f"ask the owner to add you to operators.group (and the group), then log in again."
        ) from None
    except FileNotFoundError:
        pass  # load_run_config says what is missing
    return paths, load_run_config(paths.root)


def request_kill(paths: RunPaths, cfg: Any, reason: str, now: bool) -> Requested:
    _require_reason(reason)
    user = require_operator(paths, cfg.operators, "kill --now" if now else "kill")
    refuse_a_stopped_run(paths)
    _drop(paths, cfg, user, KILL_REQUEST, RequestBody(reason=reason, now=now).to_dict())
    return _requested(paths, user)


def request_resume(paths: RunPaths, cfg: Any, reason: str) -> Requested:
    user = require_operator(paths, cfg.operators, "resume")
    withdrawn = withdraw_kill(paths, cfg, user)
    said = f"{reason}; {withdrawn}" if withdrawn else reason
    _drop(paths, cfg, user, RESUME_REQUEST, RequestBody(reason=said).to_dict())
    return _requested(paths, user, withdrawn)


def request_rollback(paths: RunPaths, cfg: Any, ask: RollbackAsk, reason: str) -> Requested:
    _require_reason(reason)
    user = require_operator(paths, cfg.operators, "rollback")
    if load_state(paths).status == RunStatus.FINISHED:
        raise UsageError(
            f"the run has finished training: nothing to roll back (`runctl status {paths.root}`)"
        )
    _check_rollback_target(RunPaths.for_config(paths.root, cfg), ask.to_step)
    withdrawn = withdraw_kill(paths, cfg, user)
    said = f"{reason}; {withdrawn}" if withdrawn else reason
    body = RequestBody(reason=said, rollback=ask).to_dict()
    if len(json.dumps(body)) > MAX_REQUEST_BYTES:
        raise UsageError(
            f"{len(ask.skip_samples)} --skip-samples ranges make a request bigger than {MAX_REQUEST_BYTES} bytes: "
            "merge neighbouring ranges"
        )
    _drop(paths, cfg, user, ROLLBACK_REQUEST, body)
    return _requested(paths, user, withdrawn)


def request_node_clear(
    paths: RunPaths, cfg: Any, nodes: list[str], every_node: bool, reason: str
) -> Requested:
    """The controller checks who asked, audits it and clears the nodes (only the owner's
    processes write the exclude list)."""
    bad = bad_node_names(nodes)
    if bad:
        raise UsageError(
            f"--clear {bad[0]!r} is not a SLURM node name (letters, digits, '-' and '_'; one node each)"
        )
    _require_reason(reason)
    user = require_operator(paths, cfg.operators, "nodes --clear")
    body = RequestBody(reason=reason, nodes=tuple(nodes), all_nodes=every_node)
    _drop(paths, cfg, user, NODES_CLEAR_REQUEST, body.to_dict())
    return _requested(paths, user)


def refuse_a_stopped_run(paths: RunPaths) -> None:
    """A kill of a run that has stopped would sit in control/ and stop the run's next resume."""
    status = load_state(paths).status
    if status.stopped:
        raise UsageError(
            f"the run has already stopped ({status.value}: {STOPPED_BECAUSE[status]}); no job of it runs and "
            f"nothing restarts it, so there is nothing to kill. `runctl status {paths.root}` shows its jobs"
            + ("" if status == RunStatus.FINISHED else f"; `runctl resume {paths.root}` starts it again")
        )


def withdraw_kill(paths: RunPaths, cfg: Any, user: User) -> str:
    """Remove a pending control/kill; returns what it said, for the audit trail, or "" when there
    was none. The file is another user's: read bounded, without following links."""
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


def _check_rollback_target(paths: RunPaths, to_step: int) -> None:
    """A checkpoint to go back to must exist (else the trainer would refuse to start: exit 19)."""
    complete = [c.step for c in list_checkpoints(paths.checkpoints) if c.complete]
    if to_step > 0 and not [s for s in complete if s <= to_step]:
        have = ", ".join(str(s) for s in complete[-8:]) or "none"
        raise UsageError(
            f"--to-step {to_step}: no complete checkpoint at or before step {to_step} in {paths.checkpoints} "
            f"(there: {have}); --to-step 0 starts again from the initial weights"
        )


def _require_reason(reason: str) -> None:
    if not reason.strip():
        raise UsageError("--reason must say why (it goes to the audit trail)")


def _drop(paths: RunPaths, cfg: Any, user: User, name: str, body: dict[str, Any]) -> None:
    """Write control/<name> as `user`; an operator the kernel does not let in gets the fix."""
    try:
        atomic_write_json(paths.control_request(name), body, mode=0o660)
    except PermissionError as exc:
        raise cannot_write_control(paths, cfg.operators, user, exc) from None


def _requested(paths: RunPaths, user: User, withdrawn: str = "") -> Requested:
    return Requested(user, lock_holder(paths.root), withdrawn, owner_uid=paths.root.stat().st_uid)
