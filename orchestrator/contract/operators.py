"""Who may kill, resume or change a run; the modes that make it hold; the audit trail.

An operator is the run's owner (the owner of the run directory), a user listed in
`operators.users`, or a member of `operators.group` (primary or supplementary). The threat model
is docs/security.md; in short, the owner's processes (controller, trainer, the owner's CLI) are
the only writers of everything the controller trusts, and operators only drop request files.

Modes set by `prepare_permissions` (the controller calls it at start):

    <run_dir>/         2750  operators' group: operators read and traverse, nobody else
    run.yaml           0640  holds cluster.env and the notification URLs: never world-readable
    jobs/*/job.sbatch  0750  same secrets (the exported env)
    state.json,
    events.jsonl,
    audit.jsonl        0644  (within the 2750 root: operators read them; only the owner writes)
    control/           2770  operators' group: the drop box for kill, resume and nodes-clear
                             requests; setgid so a request belongs to the group. Without a usable
                             operators.group it is 0700: only the owner may drop requests (never
                             the owner's whole primary group). Nothing in it is ever chmodded.
    accepted/          0755  requests the controller authenticated (see controller/requests.py)
    quarantine/        0700  what the controller refused or could not read safely, kept as evidence
Made owner-only by others: jobs/<id>/ 0700 (runs.submit_job, the job script, the launcher),
.private/ 0700 and excluded-nodes.json 0644 (contract/exclude.py).

A non-operator cannot read the run at all (the root is 2750), so there is nothing to attempt and
nothing for such a user to write: the audit trail holds what the controller authenticated.

Nothing here follows a symbolic link: an entry another user planted is skipped (and the
controller's request intake quarantines it), never chowned or chmodded.
`check_trust` is the StrictModes check: the controller refuses to start while a file it trusts is
writable by someone who is not the owner, and says the exact chmod/chown that fixes it.
"""

from __future__ import annotations

import getpass
import grp
import os
import pwd
import secrets
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import (
    RunPaths,
)
from orchestrator.contract import events as ev
from orchestrator.contract.audit import AuditRecord, write_audit
from orchestrator.contract.audit import read_audit as read_audit_file
from orchestrator.contract.textsafe import cap, for_terminal
from orchestrator.errors import PermissionDeniedError

ROOT_MODE = 0o2750
CONTROL_DIR_MODE = 0o2770
CONTROL_DIR_MODE_NO_GROUP = 0o700
ACCEPTED_DIR_MODE = 0o755
QUARANTINE_DIR_MODE = 0o700
TRUSTED_FILE_MODE = 0o644  # state.json, events.jsonl, audit.jsonl
SECRET_FILE_MODE = 0o640  # run.yaml
SECRET_SCRIPT_MODE = 0o750  # jobs/*/job.sbatch
QUARANTINE_MAX_ENTRIES = 200  # beyond this, a refused entry is deleted and only its record kept
TRUST_MAX_ENTRIES = 20000  # check_trust walks at most this many entries (a start-up cost on GPFS)


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

    @classmethod
    def of_uid(cls, uid: int) -> User:
        """Who owns a file: the name and groups of `uid` from the user database (not from the file)."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return cls(name=str(uid), uid=uid, groups=frozenset())
        groups = set()
        for gid in os.getgrouplist(entry.pw_name, entry.pw_gid):
            try:
                groups.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        return cls(name=entry.pw_name, uid=uid, groups=frozenset(groups))


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


def _is_owner(paths: RunPaths) -> bool:
    return os.geteuid() == paths.root.stat().st_uid


def audit(paths: RunPaths, user: User, action: str, reason: str, allowed: bool, **extra: Any) -> None:
    """Record an action taken by the owner's own CLI (the owner's processes are the only writers of
    audit.jsonl). Anyone else's request is audited by the controller when it authenticates the
    request file; what a client says about itself is not evidence, so nothing else is written."""
    record = AuditRecord(
        user=user.name,
        uid=user.uid,
        action=action,
        reason=cap(for_terminal(reason)),
        allowed=allowed,
        host=socket.gethostname(),
        via="runctl",
        details=extra,
    )
    if _is_owner(paths):
        write_audit(paths.audit, record)


def require_operator(paths: RunPaths, operators: Any, action: str) -> User:
    """The current user, or PermissionDeniedError (EXIT_PERMISSION) for a non-operator. This check
    only spares a non-operator a confusing failure; what enforces the rule is the kernel (the root
    is 2750, control/ 2770) and the controller's check of the owner of each request file, which is
    also where a kill or resume is audited (orchestrator/controller/requests.py)."""
    user = User.current()
    if operator_basis(operators, paths, user) is None:
        who = ", ".join(operators.users or []) or "nobody"
        raise PermissionDeniedError(
            f"user {user.name!r} is not an operator of this run and may not {action} it. "
            f"Operators: the owner ({run_owner(paths)}), users [{who}], group {operators.group or '(none)'}. "
            f"Ask the owner to add you to operators.group."
        )
    return user


def cannot_write_control(paths: RunPaths, operators: Any, user: User, exc: OSError) -> PermissionDeniedError:
    """The error for an operator the kernel does not let write control/ (e.g. listed in
    operators.users but not a member of operators.group)."""
    group = operators.group
    fix = (
        f"ask the owner ({run_owner(paths)}) to add you to group {group} (then log in again)"
        if group
        else f"ask the owner ({run_owner(paths)}) to set operators.group to a group you are in"
    )
    return PermissionDeniedError(
        f"user {user.name!r} is an operator of this run on paper, but cannot write {paths.control} "
        f"({exc.strerror}): {fix}, or a site admin may grant an ACL "
        f"(setfacl -m u:{user.name}:rwx {paths.control}; see docs/security.md). Nothing was requested."
    )


def quarantine(
    paths: RunPaths, path: Path, why: str, clock=time.time
) -> ev.Quarantined | ev.QuarantineSkipped:
    """Move `path` (never following it) into the owner-only quarantine/, as evidence; when that
    holds QUARANTINE_MAX_ENTRIES already, delete it and keep only the record. Returns the event."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ev.QuarantineSkipped(file=str(path), why="gone before it could be moved")
    writer = User.of_uid(info.st_uid)
    outcome: dict[str, str] = {}
    folder = paths.quarantine
    try:
        folder.mkdir(mode=QUARANTINE_DIR_MODE, exist_ok=True)
        held = len(os.listdir(folder))
        if held < QUARANTINE_MAX_ENTRIES:
            target = folder / f"{int(clock() * 1000)}-{writer.name}-{path.name}-{secrets.token_hex(3)}"
            os.rename(path, target)
            outcome["moved_to"] = str(target)
        else:
            if stat.S_ISDIR(info.st_mode):
                os.rmdir(path)
            else:
                os.unlink(path)
            outcome["deleted"] = f"quarantine/ holds {held} entries already: only this record is kept"
    except OSError as exc:
        outcome["left_in_place"] = (
            f"could not be moved or deleted ({exc.strerror}); it is ignored from now on"
        )
    return ev.Quarantined(
        file=str(path),
        why=why,
        user=writer.name,
        uid=info.st_uid,
        kind=_kind(info.st_mode),
        size=info.st_size,
        **outcome,
    )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISREG, "regular file"),
    ):
        if test(mode):
            return name
    return "unknown"


def read_audit(paths: RunPaths) -> list[AuditRecord]:
    return read_audit_file(paths.audit)


# -- modes -----------------------------------------------------------------------------------------
def operators_gid(operators: Any) -> tuple[int | None, str | None]:
    """(gid of operators.group, None) or (None, why it cannot be used)."""
    if not operators.group:
        return None, "operators.group is not set"
    try:
        return grp.getgrnam(operators.group).gr_gid, None
    except KeyError:
        return None, f"operators.group {operators.group!r} does not exist on this host"


def _set_mode(path: Path, mode: int, gid: int | None, warnings: list[str]) -> None:
    """chgrp (when gid) and chmod `path` through a descriptor opened without following links, and
    only if it is a folder or a single-link regular file the owner owns. Another user's file is
    left alone silently (a request in control/; check_trust reports one anywhere else); a link, a
    FIFO or a hard link is left alone with a warning: a hard link's other name may be the owner's
    ~/.bashrc, which a chmod here would open to the group."""
    skipped = _why_not_set(path, mode, gid, warnings)
    if skipped and not skipped.startswith("owned by"):
        warnings.append(
            f"left {path} as it is ({skipped}): not chmodded nor chowned; the request intake quarantines "
            "it if it is a request in control/, otherwise remove it"
        )


def _why_not_set(path: Path, mode: int, gid: int | None, warnings: list[str]) -> str | None:
    """_set_mode's work; returns why `path` was left alone, None when set (or absent)."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        return None
    kind = _kind(before.st_mode)
    if kind not in ("regular file", "directory"):
        return f"a {kind}"
    if before.st_uid != os.geteuid():
        return f"owned by {User.of_uid(before.st_uid).name}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return "replaced or removed while being checked"
    try:
        info = os.fstat(fd)  # the opened file itself: lstat and open may have seen different ones
        if (info.st_dev, info.st_ino) != (before.st_dev, before.st_ino):
            return "replaced while being checked"
        if stat.S_ISREG(info.st_mode) and info.st_nlink != 1:
            return f"a hard link ({info.st_nlink} names for one file)"
        if gid is not None and info.st_gid != gid:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
    except OSError as exc:
        warnings.append(f"cannot set the group/mode of {path}: {exc.strerror}")
    finally:
        os.close(fd)
    return None


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(mode=0o700, exist_ok=False)
    except FileExistsError:
        pass


def prepare_permissions(paths: RunPaths, operators: Any) -> list[str]:
    """Create control/, accepted/, quarantine/, audit.jsonl and events.jsonl and set
    the modes of the module docstring; returns warnings, never raises for a chgrp the owner cannot
    do. Owner-owned entries only; a symlink or another user's file is left alone for check_trust."""
    warnings: list[str] = []
    gid, why_not = operators_gid(operators)
    if gid is not None:
        try:
            os.chown(paths.root, -1, gid, follow_symlinks=False)
        except OSError as exc:
            warnings.append(
                f"cannot give {paths.root} to group {operators.group} ({exc.strerror}): the owner must be "
                f"a member of it. control/ is owner-only until then"
            )
            gid = None
    if gid is None:
        listed = [u for u in (operators.users or []) if u]
        warnings.append(
            f"{why_not or 'the operators group cannot be used'}: control/ is owner-only (0700), so only the "
            f"owner can request a kill"
            + (f" (listed operators {', '.join(listed)} cannot)" if listed else "")
            + ". Set operators.group to a group of the on-call team (see docs/security.md)"
        )
    for folder in (paths.control, paths.accepted, paths.quarantine):
        _make_dir(folder)
    for file in (paths.audit, paths.events):
        try:
            os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, TRUSTED_FILE_MODE))
        except OSError:
            pass  # a symlink in its place: check_trust refuses the start
    group_gid = gid  # None: keep each entry's group
    _set_mode(paths.root, ROOT_MODE if gid is not None else 0o750, group_gid, warnings)
    _set_mode(
        paths.control, CONTROL_DIR_MODE if gid is not None else CONTROL_DIR_MODE_NO_GROUP, group_gid, warnings
    )
    _set_mode(paths.accepted, ACCEPTED_DIR_MODE, group_gid, warnings)
    _set_mode(paths.quarantine, QUARANTINE_DIR_MODE, None, warnings)
    for file in (paths.state, paths.events, paths.audit):
        _set_mode(file, TRUSTED_FILE_MODE, group_gid, warnings)
    _set_mode(paths.config, SECRET_FILE_MODE if gid is not None else 0o600, group_gid, warnings)
    try:
        scripts = list(paths.jobs.glob("*/job.sbatch")) + list(paths.jobs.glob("pending-*.sbatch"))
    except OSError:
        scripts = []
    for script in scripts:
        _set_mode(script, SECRET_SCRIPT_MODE if gid is not None else 0o700, group_gid, warnings)
    return warnings


def world_writable(paths: RunPaths) -> list[str]:
    """Paths under control/ that anybody may write (must be empty). Never follows a link."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(paths.control):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            mode = os.lstat(name).st_mode
            if mode & 0o002 and not stat.S_ISLNK(mode):
                bad.append(name)
    return bad


# -- StrictModes -----------------------------------------------------------------------------------
def _private_group(gid: int, owner: str) -> bool:
    """A user-private group (named after the owner, no other members): group write is harmless."""
    try:
        entry = grp.getgrgid(gid)
    except KeyError:
        return False
    return entry.gr_name == owner and set(entry.gr_mem) <= {owner}


def check_trust(paths: RunPaths, operators: Any, checkpoints: Path | None = None) -> list[str]:
    """Problems that must stop the controller from starting (empty: safe), like sshd's StrictModes.

    The run root and every file or folder the controller or the trainer trusts must be owned by
    the owner (or root), not a symbolic link, and writable by nobody else: not by other users, and
    not by a group that has members besides the owner. That is run.yaml, state.json, events/audit,
    the exclude list, .private/, and every folder the owner writes during a run with what is in
    it: jobs/ (each job's folder), heartbeats/, accepted/, the checkpoint folder, aux/, stacks/
    and data_cache/. The controller runs it at start, and again whenever a new job folder appears
    (observer.Observer.trust_problems: an event and a notification then, never a crash). Each
    problem names the path and the command that fixes it. control/ is a drop box
    by design and are checked only for their own mode. Cost: one lstat per entry, at most
    TRUST_MAX_ENTRIES."""
    me = os.geteuid()
    try:
        owner = pwd.getpwuid(me).pw_name
    except KeyError:
        owner = str(me)
    problems: list[str] = []

    def check(path: Path, info: os.stat_result, top: bool = False) -> None:
        if stat.S_ISLNK(info.st_mode):
            if top:
                problems.append(
                    f"{path} is a symbolic link; the run directory must hold the file itself: "
                    f"rm {path} (then restore it from a trusted copy)"
                )
            return  # a link inside a checkpoint or jobs/ is not followed by the check
        if info.st_uid not in (me, 0):
            problems.append(
                f"{path} is owned by {User.of_uid(info.st_uid).name}, not by {owner}: check its "
                f"content, then `chown {owner} {path}` (as root) or remove it"
            )
        mode = info.st_mode
        if mode & 0o002:
            problems.append(f"{path} is writable by every user: chmod o-w {path}")
        if mode & 0o020 and not _private_group(info.st_gid, owner):
            problems.append(f"{path} is writable by group {group_name(info.st_gid)}: chmod g-w {path}")

    try:
        root_info = os.lstat(paths.root)
    except FileNotFoundError:
        return [f"{paths.root} does not exist"]
    check(paths.root, root_info, top=True)
    for path in (paths.config, paths.state, paths.events, paths.audit, paths.exclude_list, paths.private):
        try:
            check(path, os.lstat(path), top=True)
        except FileNotFoundError:
            continue
    for drop_box in (paths.control,):
        try:
            info = os.lstat(drop_box)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode) or info.st_uid not in (me, 0):
            problems.append(
                f"{drop_box} must be a folder owned by {owner}: move it away and restart "
                f"(the controller recreates it)"
            )
        elif drop_box == paths.control and info.st_mode & 0o002:
            problems.append(f"{drop_box} is writable by every user: chmod 2770 {drop_box}")
    seen = 0
    trees = [
        paths.jobs, paths.heartbeats, paths.accepted, checkpoints or paths.checkpoints,
        paths.aux, paths.stacks, paths.data_cache,
    ]  # fmt: skip
    for tree in trees:
        try:
            check(tree, os.lstat(tree), top=True)
        except FileNotFoundError:
            continue
        for dirpath, dirnames, filenames in os.walk(tree):
            for name in dirnames + filenames:
                seen += 1
                if seen > TRUST_MAX_ENTRIES or len(problems) > 20:
                    return _summarise(problems)
                full = Path(dirpath) / name
                try:
                    check(full, os.lstat(full))
                except FileNotFoundError:
                    continue
    return _summarise(problems)


def _summarise(problems: list[str]) -> list[str]:
    return problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
