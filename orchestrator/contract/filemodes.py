"""How the owner's processes make files and folders: one umask, folders made then chmodded, and
the check of an owner-only folder before anything in it is trusted (docs/security.md, "Modes").

    with owner_umask(): ...        every owner entry point, around everything it does: the CLI
                                   (and so the controller, `runctl watch`), the demo,
                                   trainer.health, trainer.standby. 027: the operators' group may
                                   read what the owner writes inside the 2750 run root, nobody may
                                   write it, and other users get nothing. What must be
                                   group-writable (control/) or wider (0644 state files, a metrics
                                   textfile for node-exporter) gets its mode explicitly.
    make_dirs(path, mode)          mkdir -p, then fchmod each folder it made to `mode` (never
                                   relying on the umask, never chmodding a folder it did not make)
    private_dir(path)              a folder only this user may enter (0700: a job's folder, the
                                   exclude list's lock): made, or checked to be this user's real
                                   folder, then fchmodded
    verify_private(path, ...)      before loading (unpickling) a file: it and its folders are the
                                   owner's alone (owner, mode, one link, no symlink)

Why 027 rather than 077: operators run `runctl status`/`events` as themselves and read state.json,
heartbeats and metrics through the group; 077 would also make an operator's own `runctl kill`
request 0600, which the owner's controller could then not read. Owner-only files (aux jobs,
quarantine/, health/) get 0700/0600 explicitly or run under PRIVATE_UMASK.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OWNER_UMASK = 0o027
PRIVATE_UMASK = 0o077  # aux jobs: their folder holds pickles and the exported environment


@contextmanager
def owner_umask() -> Iterator[None]:
    """The owner's umask while the entry point runs; the previous one afterwards (an entry point
    called in-process, by a test say, leaves its caller's umask as it was)."""
    previous = os.umask(OWNER_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def make_dirs(path: Path, mode: int) -> list[Path]:
    """Create `path` and its missing parents; each folder made here gets `mode` by fchmod through
    a descriptor opened without following links (the umask plays no part; setgid is kept only if
    `mode` has it). Existing folders are left as they are. Returns the folders made."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    made = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue  # made by someone else meanwhile: not ours to chmod
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        made.append(folder)
    return made


class NotPrivateError(Exception):
    """A file or folder that should be the owner's alone is not; the message says how to fix it."""


def private_dir(path: Path) -> None:
    """`path` (its parent must exist) as a folder of this user's with mode 0700: made when missing;
    an existing one must be a real folder (not a link) of this user, and is fchmodded through its
    own descriptor, so that a path swapped meanwhile is never the one changed. NotPrivateError
    otherwise."""
    path = Path(path)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise NotPrivateError(
            f"{path} is not a folder (or is a symbolic link): remove it ({exc.strerror})"
        ) from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise NotPrivateError(f"{path} belongs to uid {info.st_uid}, not to {os.geteuid()}: remove it")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def verify_private(path: Path, directory: bool) -> os.stat_result:
    """lstat `path` and raise NotPrivateError unless it is a folder (`directory`) or a regular
    file with a single link, not a symbolic link, owned by this user, with no permission bit for
    group or others. A file that passes can be changed by nobody but this user (and root) as long
    as its folders pass too."""
    path = Path(path)
    info = os.lstat(path)
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        raise NotPrivateError(f"{path} is a symbolic link: refusing to follow it; remove it")
    if directory and not stat.S_ISDIR(mode):
        raise NotPrivateError(f"{path} is not a folder: remove it")
    if not directory and not stat.S_ISREG(mode):
        raise NotPrivateError(f"{path} is not a regular file: remove it")
    if info.st_uid != os.geteuid():
        raise NotPrivateError(f"{path} belongs to uid {info.st_uid}, not to {os.geteuid()}: remove it")
    if not directory and info.st_nlink != 1:
        raise NotPrivateError(f"{path} has {info.st_nlink} hard links (another name shares it): remove it")
    if stat.S_IMODE(mode) & 0o077:
        raise NotPrivateError(
            f"{path} is mode {stat.S_IMODE(mode):04o}, open to group or others: "
            f"chmod {'700' if directory else '600'} {path}, and check it was not changed"
        )
    return info
