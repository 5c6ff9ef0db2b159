"""Operator requests: read what operators dropped in control/, authenticate it, publish what is
allowed to accepted/, where the trainer looks. Called once per pass by the controller, which runs
as the run's owner.

    intake = read_requests(paths, cfg.operators, clock)
    intake.requests   {"kill": OperatorRequest, "resume": ...}: the authenticated requests in
                      control/ now (a kill stays while its file stays; `runctl resume` removes it)
    intake.events     dicts for events.jsonl: request_accepted, request_refused, quarantined,
                      exclude_list_changed (each is said once, on the pass it happened)
    publish(paths, request)   accepted/<name>, atomically, 0644 in the owner-only accepted/
    withdraw(paths, name)     remove accepted/<name> (the kill was withdrawn or resumed)
    consume(paths, name)      remove control/<name> after acting on it (a resume)

Rules, in the order they are applied to control/kill and control/resume:
- The file is opened with O_NOFOLLOW | O_NONBLOCK and must be a regular file of at most
  MAX_REQUEST_BYTES with one link (a hard link to a file of the owner would otherwise pass as the
  owner's request and leak its first bytes into the audit trail). Anything else is quarantined.
- Who asked is the opened file's st_uid (fstat), never the JSON's "user". That user must be an
  operator (orchestrator.operators.operator_basis); otherwise the request is refused and the file
  quarantined.
- The file's content is only the reason and the `now` flag. An empty file (`touch control/kill`),
  non-JSON, a JSON list, ... is still a request, with reason "(none given)". Reasons are made one
  printable line (orchestrator.textsafe) and capped.
- Every accepted or refused request is written to audit.jsonl here, once: the controller is the
  only writer of the audit trail.
- Each file is handled once: the fingerprint (device, inode, size, mtime, ctime, uid) of every
  request already handled is kept in accepted/.intake.json, so a request that stays in control/
  is not re-read, re-audited or re-announced on every pass, nor after a controller restart.
- control/excluded-nodes.json (operators clear nodes there) must be a regular file; a change
  written by a user other than the owner is audited as `nodes --clear` by that user.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.operators import User, merge_inbox, operator_basis, quarantine
from orchestrator.protocol import (
    KILL_REQUEST,
    RESUME_REQUEST,
    RunPaths,
    UntrustedFileError,
    append_jsonl,
    atomic_write_json,
    read_untrusted,
)
from orchestrator.textsafe import cap, for_terminal

REQUEST_NAMES = (KILL_REQUEST, RESUME_REQUEST)
MAX_REQUEST_BYTES = 4096
NO_REASON = "(none given)"
INTAKE_STATE = ".intake.json"  # in accepted/: fingerprints of the requests already handled
EXCLUDE_FILE = "excluded-nodes.json"  # orchestrator.controller.exclude.EXCLUDE_FILE


@dataclass(frozen=True)
class OperatorRequest:
    name: str  # "kill" or "resume"
    user: str  # from the file's st_uid
    uid: int
    reason: str  # sanitised, capped
    now: bool  # kill --now: cancel at once, no checkpoint
    time: float  # the file's mtime

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RequestIntake:
    requests: dict[str, OperatorRequest] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)


def _fingerprint(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_uid]


def _load_state(paths: RunPaths) -> dict[str, Any]:
    try:
        data, _ = read_untrusted(paths.accepted / INTAKE_STATE, 1 << 20)
        state = json.loads(data)
    except (OSError, UntrustedFileError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(paths: RunPaths, state: dict[str, Any]) -> None:
    atomic_write_json(paths.accepted / INTAKE_STATE, state, mode=0o644)


def _parse(data: bytes) -> tuple[str, bool]:
    """(reason, now) from a request's bytes; anything unexpected still means the request."""
    try:
        body = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return NO_REASON, False
    reason = body.get("reason")
    reason = cap(for_terminal(reason)).strip() if isinstance(reason, str) else ""
    return reason or NO_REASON, body.get("now") is True


def _audit(paths: RunPaths, clock: Callable[[], float], **record: Any) -> None:
    append_jsonl(paths.audit, {"time": clock(), **record})


def read_requests(paths: RunPaths, operators: Any, clock: Callable[[], float] = time.time) -> RequestIntake:
    """One pass over control/ (and the audit inbox); see the module docstring."""
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
                intake.requests[name] = OperatorRequest(**known["request"])
            continue  # handled on an earlier pass (accepted, or refused and left in place)
        # New (or changed) file: judge it now.
        request, handled = _take(paths, operators, name, path, seen_info, intake.events, clock)
        if request is not None:
            intake.requests[name] = request
        if os.path.lexists(path):  # accepted, or refused and not movable: remember it
            state[name] = {"fingerprint": _fingerprint(handled), "request": request and request.as_dict()}
        else:
            state.pop(name, None)
        changed = True
    changed |= _watch_exclude_list(paths, operators, state, intake.events, clock)
    if changed:
        _save_state(paths, state)
    intake.events += merge_inbox(paths, clock)
    return intake


def _take(
    paths: RunPaths,
    operators: Any,
    name: str,
    path: Path,
    seen_info: os.stat_result,
    events: list[dict[str, Any]],
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
    reason, now = _parse(data)
    action = f"{name} --now" if now and name == KILL_REQUEST else name
    _audit(
        paths,
        clock,
        user=writer.name,
        uid=writer.uid,
        action=action,
        reason=reason,
        allowed=basis is not None,
        basis=basis,
        via=f"control/{name}",
    )
    if basis is None:
        events.append(
            {
                "event": "request_refused",
                "request": name,
                "user": writer.name,
                "uid": writer.uid,
                "why": "not an operator of this run",
            }
        )
        events.append(quarantine(paths, path, f"{name} request by non-operator {writer.name}", clock))
        return None, info
    request = OperatorRequest(
        name=name, user=writer.name, uid=writer.uid, reason=reason, now=now, time=info.st_mtime
    )
    events.append(
        {
            "event": "request_accepted",
            "request": name,
            "user": writer.name,
            "uid": writer.uid,
            "reason": reason,
            "now": now,
            "basis": basis,
        }
    )
    return request, info


def _watch_exclude_list(
    paths: RunPaths,
    operators: Any,
    state: dict[str, Any],
    events: list[dict[str, Any]],
    clock: Callable[[], float],
) -> bool:
    """Quarantine a non-regular exclude list; audit a change made by someone other than the owner."""
    path = paths.control / EXCLUDE_FILE
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return state.pop(EXCLUDE_FILE, None) is not None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        events.append(quarantine(paths, path, "the exclude list must be a regular file of its own", clock))
        return state.pop(EXCLUDE_FILE, None) is not None
    fingerprint = _fingerprint(info)
    if state.get(EXCLUDE_FILE) == fingerprint:
        return False
    state[EXCLUDE_FILE] = fingerprint
    if info.st_uid != os.geteuid():
        writer = User.of_uid(info.st_uid)
        basis = operator_basis(operators, paths, writer)
        _audit(
            paths,
            clock,
            user=writer.name,
            uid=writer.uid,
            action="nodes --clear",
            reason="(exclude list rewritten)",
            allowed=basis is not None,
            basis=basis,
            via=f"control/{EXCLUDE_FILE}",
        )
        events.append(
            {"event": "exclude_list_changed", "user": writer.name, "uid": writer.uid, "basis": basis}
        )
    return True


def publish(paths: RunPaths, request: OperatorRequest) -> None:
    """accepted/<name> for the trainer: written by the owner only, atomically, readable by all."""
    paths.accepted.mkdir(mode=0o755, exist_ok=True)
    atomic_write_json(paths.accepted_request(request.name), request.as_dict(), mode=0o644)


def withdraw(paths: RunPaths, name: str) -> None:
    paths.accepted_request(name).unlink(missing_ok=True)


def consume(paths: RunPaths, name: str) -> None:
    """Remove control/<name> once acted upon (a resume): the next one is a new request."""
    paths.control_request(name).unlink(missing_ok=True)
