"""The controller's own heartbeat: `<run>/controller.json`, rewritten after every pass.

    write_beat(paths, passes=..., failing_passes=..., status=..., poll_seconds=..., started_at=...)
    beat = read_beat(paths)              # dict or None
    age = beat_file_age(paths)           # seconds since the file changed, by THIS machine's clock

Fields: pid, host, user, started_at and last_pass_time (the controller host's wall clock, for
people), passes (+1 every pass, failed ones included), failing_passes (in a row; > 0 means alive
but every pass raises), status (the run's), poll_seconds (how often it should change).

Who reads it, and how staleness is judged without comparing two machines' clocks:
- `runctl doctor` (cron, any login node) keeps a small file of its own with the last pass count
  it saw and when, by its own clock; the controller is stale when `passes` has not moved for
  longer than the threshold between two of the doctor's looks. Only on the first look (no
  memory yet) does it fall back to the file's mtime against its own clock: login nodes are one
  machine family on NTP, and the margin (minutes) dwarfs their skew.
- `runctl metrics` exports `passes` as a counter (Prometheus' `rate()` needs no clock agreement)
  and the file's age by the exporter's clock.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from typing import Any

from orchestrator.protocol import RunPaths, read_json


def write_beat(
    paths: RunPaths,
    *,
    passes: int,
    failing_passes: int,
    status: str,
    poll_seconds: float,
    started_at: float,
    now: float | None = None,
    node_beat_age: dict[str, float] | None = None,
) -> None:
    """`node_beat_age`: per heartbeat host, seconds since the controller saw its stalest rank's
    beat change (its own monotonic clock): what the dashboard shows, free of node clock skew."""
    _replace_json(
        paths.controller_heartbeat,
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "user": _user(),
            "started_at": started_at,
            "last_pass_time": now if now is not None else time.time(),
            "passes": passes,
            "failing_passes": failing_passes,
            "status": status,
            "poll_seconds": poll_seconds,
            "node_beat_age": {host: round(age, 1) for host, age in (node_beat_age or {}).items()},
        },
    )


def _replace_json(path: os.PathLike[str], data: dict[str, Any]) -> None:
    """Write-and-rename without fsync: readers never see half a file, and a beat lost in a crash
    is worth nothing anyway (the next pass writes another). Three fsyncs a pass would cost more
    than the pass itself on GPFS, and the simulation runs hundreds of thousands of passes."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_beat(paths: RunPaths) -> dict[str, Any] | None:
    try:
        beat = read_json(paths.controller_heartbeat)
    except (OSError, ValueError):
        return None
    return beat if isinstance(beat, dict) else None


def beat_file_age(paths: RunPaths, now: float | None = None) -> float | None:
    """Seconds since controller.json last changed, by this machine's clock (None: no file)."""
    try:
        mtime = os.stat(paths.controller_heartbeat).st_mtime
    except OSError:
        return None
    return max(0.0, (now if now is not None else time.time()) - mtime)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
