"""Operator requests: read what operators dropped in control/, authenticate it, publish what is
allowed to accepted/, where the trainer looks. Called once per pass by the controller, which runs
as the run's owner.

    intake = read_requests(paths, cfg.operators, clock)
    intake.requests   {"kill": OperatorRequest, "resume": ..., "nodes-clear": ..., "rollback": ...}:
                      the authenticated requests in control/ now (a kill stays while its file
                      stays; `runctl resume` removes it; a resume, a nodes-clear or a rollback is
                      consumed once acted upon)
    intake.events     events for events.jsonl: request_accepted, request_refused, quarantined
                      (each is said once, on the pass it happened)
    consume(paths, name)      remove control/<name> after acting on it (a resume, a nodes-clear,
                              a rollback)
Publishing to accepted/ and withdrawing from it are the contract's (contract.requests).

Rules, in the order they are applied to control/kill, control/resume, control/nodes-clear and
control/rollback:
- The file is opened with O_NOFOLLOW | O_NONBLOCK and must be a regular file of at most
  MAX_REQUEST_BYTES with one link (a hard link to a file of the owner would otherwise pass as the
  owner's request and leak its first bytes into the audit trail). Anything else is quarantined.
- Who asked is the opened file's st_uid (fstat), never the JSON's "user". That user must be an
  operator (orchestrator.contract.operators.operator_basis); otherwise the request is refused and the file
  quarantined.
- The file's content is only the reason, the `now` flag and, for nodes-clear, the nodes, for a
  rollback what it asks (contract.RequestBody). An empty file (`touch control/kill`), non-JSON,
  a JSON list, ... is still a kill or a resume, with reason "(none given)"; a nodes-clear that
  names no node, or something that is not a SLURM node name, is refused and quarantined, and so
  is a rollback that does not say what it asks (contract.directive.RollbackAsk: every field
  checked; the error names the field). Reasons are made one printable line
  (orchestrator.contract.textsafe) and capped.
- Every accepted or refused request is written to audit.jsonl here, once: the controller is the
  only writer of the audit trail.
- Each file is handled once: the fingerprint (device, inode, size, mtime, ctime, uid) of every
  request already handled is kept in accepted/.intake.json, so a request that stays in control/
  is not re-read, re-audited or re-announced on every pass, nor after a controller restart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract import (
    KILL_REQUEST,
    NODES_CLEAR_REQUEST,
    ROLLBACK_REQUEST,
    DirectiveError,
    OperatorRequest,
    RequestBody,
    RunPaths,
    UntrustedFileError,
)
from orchestrator.contract import events as ev
from orchestrator.contract.audit import AuditRecord, write_audit
from orchestrator.contract.files import atomic_write_json, loads_bounded, read_untrusted, read_untrusted_json
from orchestrator.contract.operators import User, operator_basis, quarantine
from orchestrator.contract.requests import MAX_REQUEST_BYTES, NO_REASON, REQUEST_NAMES
from orchestrator.contract.textsafe import cap, for_terminal


@dataclass
class RequestIntake:
    requests: dict[str, OperatorRequest] = field(default_factory=dict)
    events: list[ev.Event] = field(default_factory=list)


def _fingerprint(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_uid]


def _load_state(paths: RunPaths) -> dict[str, Any]:
    try:
        state, _ = read_untrusted_json(paths.intake_state, 1 << 20)
    except (OSError, UntrustedFileError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(paths: RunPaths, state: dict[str, Any]) -> None:
    atomic_write_json(paths.intake_state, state, mode=0o644)


def _parse(data: bytes) -> tuple[str, RequestBody]:
    """(the reason, made printable and capped; the body) from a request's bytes; anything
    unexpected still means the request."""
    try:
        body = RequestBody.parse(loads_bounded(data))
    except ValueError:
        body = RequestBody()
    reason = cap(for_terminal(body.reason)).strip()
    return reason or NO_REASON, body


def _audit(paths: RunPaths, clock: Callable[[], float], **record: Any) -> None:
    write_audit(paths.audit, AuditRecord(time=clock(), **record))


def read_requests(paths: RunPaths, operators: Any, clock: Callable[[], float] = time.time) -> RequestIntake:
    """One pass over control/; see the module docstring."""
    intake = RequestIntake()
    paths.accepted.mkdir(mode=0o755, exist_ok=True)
    state = _load_state(paths)
    changed = False
    for name in REQUEST_NAMES:
        path = paths.control_request(name)
        try:
            seen_info = os.lstat(path)
        except FileNotFoundError:
            changed |= state.pop(name, None) is not None
            continue
        known = state.get(name)
        if isinstance(known, dict) and known.get("fingerprint") == _fingerprint(seen_info):
            if isinstance(known.get("request"), dict):
                intake.requests[name] = OperatorRequest.from_dict(known["request"])
            continue  # handled on an earlier pass (accepted, or refused and left in place)
        # New (or changed) file: judge it now.
        request, handled = _take(paths, operators, name, path, seen_info, intake.events, clock)
        if request is not None:
            intake.requests[name] = request
        if os.path.lexists(path):  # accepted, or refused and not movable: remember it
            state[name] = {"fingerprint": _fingerprint(handled), "request": request and request.to_dict()}
        else:
            state.pop(name, None)
        changed = True
    if changed:
        _save_state(paths, state)
    return intake


def _take(
    paths: RunPaths,
    operators: Any,
    name: str,
    path: Path,
    seen_info: os.stat_result,
    events: list[ev.Event],
    clock: Callable[[], float],
) -> tuple[OperatorRequest | None, os.stat_result]:
    """Authenticate one new request file; audit it; quarantine it when refused. Returns the request
    (None: refused or gone) and the stat of the file that was judged."""
    try:
        data, info = read_untrusted(path, MAX_REQUEST_BYTES)
        if info.st_nlink != 1:
            raise UntrustedFileError(path, f"has {info.st_nlink} hard links (a request is a file of its own)")
    except FileNotFoundError:
        return None, seen_info
    except UntrustedFileError as exc:
        writer = User.of_uid(seen_info.st_uid)
        _audit(
            paths,
            clock,
            user=writer.name,
            uid=writer.uid,
            action=name,
            reason=f"(unreadable: {exc.reason})",
            allowed=False,
            via=f"control/{name}",
        )
        events.append(quarantine(paths, path, exc.reason, clock))
        return None, seen_info
    writer = User.of_uid(info.st_uid)
    basis = operator_basis(operators, paths, writer)
    reason, body = _parse(data)
    now = body.now and name == KILL_REQUEST
    problem = body.nodes_problem if name == NODES_CLEAR_REQUEST else ""
    ask, details = None, _nodes_details(name, body)
    if name == ROLLBACK_REQUEST:
        try:
            ask = body.rollback_ask()
            details = ask.to_dict()
        except DirectiveError as exc:
            problem = cap(for_terminal(str(exc)))
    why_refused = "not an operator of this run" if basis is None else problem
    _audit(
        paths,
        clock,
        user=writer.name,
        uid=writer.uid,
        action=_action_name(name, body),
        reason=reason if not problem else f"{reason} (refused: {problem})",
        allowed=not why_refused,
        basis=basis,
        via=f"control/{name}",
        details=details,
    )
    if why_refused:
        events.append(ev.RequestRefused(request=name, user=writer.name, uid=writer.uid, why=why_refused))
        events.append(quarantine(paths, path, f"{name} request by {writer.name}: {why_refused}"[:300], clock))
        return None, info
    request = OperatorRequest(
        name=name, user=writer.name, uid=writer.uid, reason=reason, now=now, time=info.st_mtime,
        nodes=body.nodes if name == NODES_CLEAR_REQUEST else (),
        all_nodes=body.all_nodes and name == NODES_CLEAR_REQUEST,
        rollback=ask,
    )  # fmt: skip
    events.append(
        ev.RequestAccepted(
            request=name, user=writer.name, uid=writer.uid, reason=reason, now=now, basis=basis
        )
    )
    return request, info


def _action_name(name: str, body: RequestBody) -> str:
    """The audit trail's name for what was asked, as the CLI spells it."""
    if name == KILL_REQUEST:
        return "kill --now" if body.now else "kill"
    if name == NODES_CLEAR_REQUEST:
        return "nodes --clear"
    return name


def _nodes_details(name: str, body: RequestBody) -> dict[str, Any]:
    """The nodes a nodes-clear named, for the audit line (what was refused too, made inert)."""
    if name != NODES_CLEAR_REQUEST:
        return {}
    named = body.nodes or body.bad_nodes
    return {"nodes": "all" if body.all_nodes else [cap(for_terminal(n), 60) for n in named[:32]]}


def consume(paths: RunPaths, name: str) -> None:
    """Remove control/<name> once acted upon (a resume): the next one is a new request."""
    paths.control_request(name).unlink(missing_ok=True)
