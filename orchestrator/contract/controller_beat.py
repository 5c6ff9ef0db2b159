"""The controller's own heartbeat: `<run>/controller.json` (`ControllerBeat`), rewritten after every pass.

    write_beat(paths, passes=..., failing_passes=..., status=..., poll_seconds=..., started_at=...)
    beat = read_beat(paths)              # ControllerBeat or None
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
from dataclasses import dataclass, field, fields
from typing import Any

from .files import ContractError, check_version, read_json
from .paths import RunPaths
from .values import is_number

CONTROLLER_BEAT_VERSION = 1


@dataclass(frozen=True)
class ControllerBeat:
    pid: int
    host: str
    user: str
    started_at: float
    last_pass_time: float
    passes: int
    failing_passes: int
    status: str
    poll_seconds: float
    # Per heartbeat host: seconds since the controller saw its stalest rank's beat change (its own
    # monotonic clock): what the dashboard shows, free of node clock skew.
    node_beat_age: dict[str, float] = field(default_factory=dict)
    version: int = CONTROLLER_BEAT_VERSION

    @classmethod
    def from_dict(cls, data: Any) -> ControllerBeat:
        if not isinstance(data, dict):
            raise ContractError("controller.json: expected a JSON object")
        check_version(data, "controller.json", CONTROLLER_BEAT_VERSION)

        def number(name: str, kind: type | tuple = (int, float)) -> Any:
            value = data.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ContractError(f"controller.json: {name} {str(value)[:40]!r} is not a {kind}")
            return value

        ages = data.get("node_beat_age") if isinstance(data.get("node_beat_age"), dict) else {}
        return cls(
            pid=number("pid", int),
            host=str(data.get("host", "?")),
            user=str(data.get("user", "?")),
            started_at=float(number("started_at")),
            last_pass_time=float(number("last_pass_time")),
            passes=number("passes", int),
            failing_passes=number("failing_passes", int),
            status=str(data.get("status", "?")),
            poll_seconds=float(number("poll_seconds")),
            node_beat_age={str(h): float(a) for h, a in ages.items() if is_number(a)},
        )


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
    beat = ControllerBeat(
        pid=os.getpid(),
        host=socket.gethostname(),
        user=_user(),
        started_at=started_at,
        last_pass_time=now if now is not None else time.time(),
        passes=passes,
        failing_passes=failing_passes,
        status=status,
        poll_seconds=poll_seconds,
        node_beat_age={host: round(age, 1) for host, age in (node_beat_age or {}).items()},
    )
    # Shallow (asdict copies node_beat_age value by value: 2,048 hosts at 16,384 GPUs, ~5 ms a pass).
    _replace_json(paths.controller_heartbeat, {spec.name: getattr(beat, spec.name) for spec in fields(beat)})


def _replace_json(path: os.PathLike[str], data: dict[str, Any]) -> None:
    """Write-and-rename without fsync: readers never see half a file, and a beat lost in a crash
    is worth nothing anyway (the next pass writes another). Three fsyncs a pass would cost more
    than the pass itself on GPFS, and the simulation runs hundreds of thousands of passes."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(
            json.dumps(data, sort_keys=True)
        )  # one C-encoded string (json.dump writes piece by piece)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_beat(paths: RunPaths) -> ControllerBeat | None:
    """The controller's last beat; None when there is none or it cannot be read."""
    try:
        return ControllerBeat.from_dict(read_json(paths.controller_heartbeat))
    except (OSError, ValueError):  # ContractError is a ValueError
        return None


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
