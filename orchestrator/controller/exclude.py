"""The run's exclude list: nodes that failed or hung, kept out of every later job of the run.

It lives in control/excluded-nodes.json, so that an on-call operator (group-writable control/)
can clear a node that was repaired with `runctl nodes RUN_DIR --clear NODE` while the controller
(the owner) adds nodes. Read-modify-write happens under an flock so that neither loses the other's
change; the lock is waited for at most LOCK_TIMEOUT_SECONDS (a holder stuck on a hung filesystem
must not freeze the controller), then ExcludeLockTimeout says who to look for.

The file sits in a folder other users can write, so it is read like any untrusted file
(orchestrator.protocol.read_untrusted: no symlink, no FIFO, bounded size); a file that is not a
JSON object of nodes reads as an empty list (and the controller's request intake quarantines a
non-regular one).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from orchestrator.config.schema import SLURM_NODE_NAME
from orchestrator.errors import RunBusyError
from orchestrator.protocol import RunPaths, UntrustedFileError, atomic_write_json, read_untrusted

EXCLUDE_FILE = "excluded-nodes.json"
_LOCK_FILE = ".excluded-nodes.lock"
LOCK_TIMEOUT_SECONDS = 30.0
MAX_EXCLUDE_BYTES = 1 << 20


class ExcludeLockTimeout(RunBusyError):
    """Somebody holds the exclude list's lock for longer than LOCK_TIMEOUT_SECONDS."""


def exclude_path(paths: RunPaths):
    return paths.control / EXCLUDE_FILE


def read_excluded(paths: RunPaths) -> dict[str, dict[str, Any]]:
    """node -> {"since", "reason", "by"}."""
    try:
        raw, _ = read_untrusted(exclude_path(paths), MAX_EXCLUDE_BYTES)
        data = json.loads(raw)
    except (FileNotFoundError, UntrustedFileError, ValueError):
        return {}
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        return {}
    return {str(n): (v if isinstance(v, dict) else {}) for n, v in nodes.items()}


def excluded_nodes(paths: RunPaths) -> list[str]:
    """The names to pass to `sbatch --exclude`: only well-formed SLURM node names (an operator's
    typo, or a planted entry, must not make every later submission fail to render)."""
    return sorted(node for node in read_excluded(paths) if re.fullmatch(SLURM_NODE_NAME, node))


@contextmanager
def _locked(paths: RunPaths, timeout: float | None = None):
    timeout = LOCK_TIMEOUT_SECONDS if timeout is None else timeout
    paths.control.mkdir(parents=True, exist_ok=True)
    lock = paths.control / _LOCK_FILE
    fd = _open_lock(paths, lock)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ExcludeLockTimeout(
                        f"the exclude list's lock {lock} has been held for more than {timeout:.0f} s "
                        f"(a `runctl nodes --clear` or a controller stuck on the filesystem?). Find the holder "
                        f"with `fuser -v {lock}` on each login node and stop it; the list itself is unchanged"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _open_lock(paths: RunPaths, lock) -> int:
    """The lock file, never through a link; something else planted there is quarantined first."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o660)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            fd = None
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        if fd is not None:
            os.close(fd)
        from orchestrator.operators import quarantine  # noqa: PLC0415 - operators imports no controller code

        quarantine(paths, lock, "the exclude list's lock must be a regular file")
    raise ExcludeLockTimeout(f"{lock} is not a regular file and cannot be moved away: remove it")


def _update(
    paths: RunPaths, change: Callable[[dict[str, dict[str, Any]]], None]
) -> dict[str, dict[str, Any]]:
    with _locked(paths):
        nodes = read_excluded(paths)
        change(nodes)
        atomic_write_json(exclude_path(paths), {"nodes": nodes}, mode=0o660)
        return nodes


def add_excluded(paths: RunPaths, nodes: list[str], reason: str, by: str) -> dict[str, dict[str, Any]]:
    def change(current: dict[str, dict[str, Any]]) -> None:
        for node in nodes:
            current.setdefault(node, {"since": time.time(), "reason": reason, "by": by})

    return _update(paths, change)


def clear_excluded(paths: RunPaths, nodes: list[str] | None) -> list[str]:
    """Remove the given nodes (None: all); returns the nodes that were removed."""
    removed: list[str] = []

    def change(current: dict[str, dict[str, Any]]) -> None:
        for node in list(current) if nodes is None else nodes:
            if current.pop(node, None) is not None:
                removed.append(node)

    _update(paths, change)
    return removed
