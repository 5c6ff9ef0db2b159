"""The run's exclude list: nodes that failed or hung, kept out of every later job of the run
while on probation (contract.Exclusion: `until`, on the controller's clock; pool.py releases the
expired ones, and a short pool may release the oldest).

It lives in the run root (`RunPaths.exclude_list`, 0644 inside the 2750 root): only the owner's
processes write it, the operators' group reads it (`runctl nodes`, the dashboard, the metrics).
Operators change it only through an authenticated, audited request (`runctl nodes --clear` drops
control/nodes-clear; the controller's intake checks who asked, and its applier clears the nodes).
Read-modify-write happens under an flock on `RunPaths.exclude_lock`, in the owner-only (0700)
`.private/`, so that nobody else can even open the lock, let alone hold it. The lock is waited for
at most LOCK_TIMEOUT_SECONDS (an owner's process stuck on a hung filesystem must not freeze the
controller), then ExcludeLockTimeout says who to look for; the applier records that as an event
and the restart still goes out.

The list is read with the one bounded reader (no symlink, no FIFO, bounded size and nesting),
and only when the run's owner wrote it: anything else reads as an empty list.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from orchestrator.contract import (
    Exclusion,
    RunPaths,
    UntrustedFileError,
    atomic_write_json,
    read_untrusted_json,
)
from orchestrator.contract.filemodes import NotPrivateError, private_dir
from orchestrator.contract.values import SLURM_NODE_NAME
from orchestrator.errors import RunBusyError

LOCK_TIMEOUT_SECONDS = 30.0
MAX_EXCLUDE_BYTES = 1 << 20
EXCLUDE_LIST_MODE = 0o644  # the operators' group reads it inside the 2750 root


class ExcludeLockTimeout(RunBusyError):
    """Somebody holds the exclude list's lock for longer than LOCK_TIMEOUT_SECONDS."""


def read_excluded(paths: RunPaths) -> dict[str, dict[str, Any]]:
    """node -> {"since", "reason", "by"}; empty when the list is missing, unreadable, or not the
    run owner's."""
    try:
        owner = os.stat(paths.root).st_uid
        data, _ = read_untrusted_json(paths.exclude_list, MAX_EXCLUDE_BYTES, owner_uid=owner)
    except (OSError, UntrustedFileError):
        return {}
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        return {}
    return {str(n): (v if isinstance(v, dict) else {}) for n, v in nodes.items()}


def read_exclusions(paths: RunPaths) -> dict[str, Exclusion]:
    """The list as typed entries (contract.Exclusion), same rules as read_excluded."""
    return {node: Exclusion.from_entry(node, raw) for node, raw in read_excluded(paths).items()}


def excluded_nodes(paths: RunPaths) -> list[str]:
    """The names to pass to `sbatch --exclude`: only well-formed SLURM node names (a planted
    entry must not make every later submission fail to render)."""
    return sorted(node for node in read_excluded(paths) if re.fullmatch(SLURM_NODE_NAME, node))


@contextmanager
def _locked(paths: RunPaths, timeout: float | None = None):
    timeout = LOCK_TIMEOUT_SECONDS if timeout is None else timeout
    lock = paths.exclude_lock
    fd = _open_lock(paths)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ExcludeLockTimeout(
                        f"the exclude list's lock {lock} has been held for more than {timeout:.0f} s (only "
                        f"the owner's processes can open it: a controller or a `runctl` stuck on the "
                        f"filesystem?). Find the holder with `fuser -v {lock}` on each login node and stop "
                        f"it; the list itself is unchanged"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _open_lock(paths: RunPaths) -> int:
    """The lock file in the owner-only .private/ (made 0700, or checked to be), never through a link."""
    try:
        private_dir(paths.private)
    except NotPrivateError as exc:
        raise ExcludeLockTimeout(f"cannot lock the exclude list: {exc}") from None
    lock = paths.exclude_lock
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        raise ExcludeLockTimeout(f"{lock} is not a regular file: remove it") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExcludeLockTimeout(f"{lock} is not a regular file: remove it")
    return fd


def _update(
    paths: RunPaths, change: Callable[[dict[str, dict[str, Any]]], None]
) -> dict[str, dict[str, Any]]:
    with _locked(paths):
        nodes = read_excluded(paths)
        change(nodes)
        atomic_write_json(paths.exclude_list, {"nodes": nodes}, mode=EXCLUDE_LIST_MODE)
        return nodes


def add_excluded(
    paths: RunPaths,
    nodes: list[str],
    reason: str,
    by: str,
    *,
    now: float | None = None,
    until: float | None = None,
    cause: str = "",
    job_id: str = "",
) -> dict[str, dict[str, Any]]:
    """`now`, `until`: the controller's clock (a simulation's is virtual); `until` None: kept
    until cleared. A node already on the list keeps its entry."""
    since = time.time() if now is None else now

    def change(current: dict[str, dict[str, Any]]) -> None:
        for node in nodes:
            entry = Exclusion(node, since, until, reason, by, cause, job_id)
            current.setdefault(node, entry.to_entry())

    return _update(paths, change)


def clear_excluded(paths: RunPaths, nodes: list[str] | None) -> list[str]:
    """Remove the given nodes (None: all); returns the nodes that were removed. The owner's
    processes only: operators ask with `runctl nodes --clear` (a request the controller applies)."""
    removed: list[str] = []

    def change(current: dict[str, dict[str, Any]]) -> None:
        for node in list(current) if nodes is None else nodes:
            if current.pop(node, None) is not None:
                removed.append(node)

    _update(paths, change)
    return removed
