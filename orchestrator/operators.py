"""Who may kill, resume or change a run, and the audit trail of who did.

An operator is the run's owner (the owner of the run directory), a user listed in
`operators.users`, or a member of `operators.group` (primary or supplementary). Every action, and
every refused attempt, goes to <run_dir>/audit.jsonl with user, time, action, reason, allowed.

Permissions that make this hold on a shared filesystem (GPFS, NFS):
- control/ is owned by the operators' group, mode 2775: group-writable so any operator can drop a
  request, setgid so every file created in it belongs to that group, nothing world-writable.
- audit.jsonl is group-writable (0664, operators' group): operators append, others read.
- A non-operator cannot write either. Their refused attempt is dropped as one file in
  audit-inbox/ (mode 1733: like /tmp, sticky, others can create but not list, read or delete), and
  the controller, running as the owner, moves it into audit.jsonl on its next pass.
"""

from __future__ import annotations

import getpass
import grp
import json
import os
import pwd
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import PermissionDeniedError
from orchestrator.protocol import RunPaths, append_jsonl, read_jsonl

CONTROL_DIR_MODE = 0o2775
AUDIT_FILE_MODE = 0o664
INBOX_NAME = "audit-inbox"
INBOX_MODE = 0o1733


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    groups: frozenset[str]

    @classmethod
    def current(cls) -> User:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = getpass.getuser()
        groups = set()
        for gid in {os.getegid(), *os.getgroups()}:
            try:
                groups.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        return cls(name=name, uid=uid, groups=frozenset(groups))


def run_owner(paths: RunPaths) -> str:
    uid = paths.root.stat().st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def operator_basis(operators: Any, paths: RunPaths, user: User) -> str | None:
    """Why `user` is an operator of this run (for the audit line), or None if not."""
    if user.name == run_owner(paths):
        return "owner of the run"
    if user.name in (operators.users or []):
        return "listed in operators.users"
    group = operators.group
    if group:
        if group in user.groups:
            return f"member of group {group}"
        try:
            if user.name in grp.getgrnam(group).gr_mem:
                return f"member of group {group}"
        except KeyError:
            pass
    return None


def audit(paths: RunPaths, user: User, action: str, reason: str, allowed: bool, **extra: Any) -> None:
    record = {
        "time": time.time(),
        "user": user.name,
        "uid": user.uid,
        "host": socket.gethostname(),
        "action": action,
        "reason": reason,
        "allowed": allowed,
        **extra,
    }
    try:
        append_jsonl(paths.audit, record)
        return
    except PermissionError:
        pass
    # Not allowed to write the audit log: leave the record in the drop box for the controller.
    inbox = paths.root / INBOX_NAME
    name = f"{int(record['time'] * 1000)}-{user.name}-{secrets.token_hex(4)}.json"
    try:
        fd = os.open(inbox / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise PermissionDeniedError(
            f"cannot record this attempt in {paths.audit} or {inbox}: {exc}"
        ) from None
    with os.fdopen(fd, "w") as handle:
        json.dump({**record, "via": "audit-inbox"}, handle)


def require_operator(paths: RunPaths, operators: Any, action: str, reason: str, **extra: Any) -> User:
    """Audit the attempt; raise PermissionDeniedError (EXIT_PERMISSION) for a non-operator."""
    user = User.current()
    basis = operator_basis(operators, paths, user)
    audit(paths, user, action, reason, allowed=basis is not None, basis=basis, **extra)
    if basis is None:
        who = ", ".join(operators.users or []) or "nobody"
        raise PermissionDeniedError(
            f"user {user.name!r} is not an operator of this run and may not {action} it. "
            f"Operators: the owner ({run_owner(paths)}), users [{who}], group {operators.group or '(none)'}. "
            f"This attempt was audited. Ask the owner to add you to operators in the run config."
        )
    return user


def merge_inbox(paths: RunPaths) -> int:
    """Move refused attempts dropped in audit-inbox/ into audit.jsonl (run as the owner)."""
    inbox = paths.root / INBOX_NAME
    try:
        names = sorted(os.listdir(inbox))
    except OSError:
        return 0
    moved = 0
    for name in names:
        path = inbox / name
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        append_jsonl(paths.audit, record)
        path.unlink(missing_ok=True)
        moved += 1
    return moved


def read_audit(paths: RunPaths) -> list[dict[str, Any]]:
    return read_jsonl(paths.audit)


def prepare_permissions(paths: RunPaths, operators: Any) -> list[str]:
    """Create control/, audit.jsonl and audit-inbox/ with the modes above; returns warnings (e.g.
    the operators' group does not exist here), never raises for a chgrp the owner cannot do."""
    warnings: list[str] = []
    gid = -1
    if operators.group:
        try:
            gid = grp.getgrnam(operators.group).gr_gid
        except KeyError:
            warnings.append(f"operators.group {operators.group!r} does not exist on this host: control/ keeps the owner's group")
    paths.control.mkdir(parents=True, exist_ok=True)
    inbox = paths.root / INBOX_NAME
    inbox.mkdir(exist_ok=True)
    if not paths.audit.exists():
        os.close(os.open(paths.audit, os.O_WRONLY | os.O_CREAT, AUDIT_FILE_MODE))
    for path, mode in ((paths.control, CONTROL_DIR_MODE), (paths.audit, AUDIT_FILE_MODE), (inbox, INBOX_MODE)):
        try:
            if gid >= 0 and path != inbox:
                os.chown(path, -1, gid)
            os.chmod(path, mode)
        except PermissionError as exc:
            warnings.append(f"cannot set owner/mode of {path}: {exc}")
    # Operators must read the frozen config (it says who the operators are) and the controller's
    # state; a temp-file-and-rename writer leaves mkstemp's 0600 on them.
    for readable in (paths.config, paths.state, paths.events):
        try:
            if readable.exists() and (readable.stat().st_mode & 0o044) != 0o044:
                os.chmod(readable, readable.stat().st_mode | 0o044)
        except PermissionError as exc:
            warnings.append(f"cannot make {readable} readable by operators: {exc}")
    # Files already in control/ (e.g. the exclude list): group-writable, never world-writable.
    for child in paths.control.iterdir():
        try:
            if gid >= 0:
                os.chown(child, -1, gid)
            os.chmod(child, 0o664)
        except PermissionError:
            continue
    return warnings


def world_writable(paths: RunPaths) -> list[str]:
    """Paths under control/ that anybody may write (must be empty)."""
    bad = []
    for path in [paths.control, *paths.control.rglob("*")]:
        if path.stat().st_mode & 0o002:
            bad.append(str(path))
    return bad
