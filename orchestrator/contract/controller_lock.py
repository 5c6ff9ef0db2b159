"""One controller per run: an flock(2) on <run_dir>/controller.lock, held for the controller's
lifetime. The kernel drops it when the process dies (even by SIGKILL), so a stale lock never
blocks a restarted controller. The file also says who holds it (pid, host), for the error message.

Across login nodes this is only as good as the filesystem's lock coherence (docs/security.md,
"Locks"): GPFS and Lustre mounted with `flock` (not `localflock`) and NFSv4 make flock(2) a
cluster-wide lock; Lustre with `localflock` or `noflock`, NFSv3 without lockd, and some FUSE
filesystems do not, and two controllers on two login nodes would then both "hold" it. Where the
site cannot promise coherent flock, run controllers of a run on one designated login node only;
the holder's host in the file is there to spot a violation (`runctl status` shows it).
Only the owner runs a controller (`runctl watch` refuses anyone else), so the lock file lives in
the owner-only run root and is opened without following links.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from orchestrator.contract import loads_bounded
from orchestrator.errors import RunBusyError

LOCK_NAME = "controller.lock"


class ControllerLock:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> ControllerLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunBusyError(
                f"another controller is already watching {self.path.parent} ({holder}); "
                "stop it first (its pid is in the lock file) or just read its view with `runctl status`"
            ) from None
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.write(fd, json.dumps(info).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ControllerLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder_record(fd: int) -> dict:
    """What the holder wrote in the lock file ({} when unreadable or not an object)."""
    try:
        data = loads_bounded(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_holder(fd: int) -> str:
    data = _holder_record(fd)
    return f"pid {data.get('pid')} on {data.get('host')}" if data else "holder unknown"


def lock_holder(run_dir: Path) -> dict | None:
    """Who holds the lock now, or None when no controller is running (checked with a probe lock)."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_record(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
