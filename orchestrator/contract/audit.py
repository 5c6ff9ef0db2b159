"""audit.jsonl: operator actions, append-only, written only by the owner's processes (the
controller when it authenticates a request, the owner's own CLI). Who acted is always from the
operating system (a request file's st_uid, or the CLI's own uid), never from what a client says.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .files import append_jsonl, read_jsonl
from .values import is_int, number_or_none

AUDIT_VERSION = 1


@dataclass(frozen=True)
class AuditRecord:
    user: str
    uid: int
    action: str  # kill, kill --now, resume, nodes --clear, eval, ...
    reason: str
    allowed: bool
    time: float = field(default_factory=time.time)
    basis: str | None = None  # why the user may (owner, operators.users, group ...)
    via: str | None = None  # control/kill, the CLI, ...
    host: str | None = None
    details: dict[str, Any] = field(default_factory=dict)  # e.g. the job id of an aux job
    version: int = AUDIT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditRecord:
        uid = data.get("uid")
        stamp = data.get("time")
        known = {
            "user",
            "uid",
            "action",
            "reason",
            "allowed",
            "time",
            "basis",
            "via",
            "host",
            "details",
            "version",
        }
        details = data.get("details") if isinstance(data.get("details"), dict) else {}
        details = {**{k: v for k, v in data.items() if k not in known}, **details}  # older lines: flat
        return cls(
            user=str(data.get("user", "?")),
            uid=uid if is_int(uid) else -1,
            action=str(data.get("action", "?")),
            reason=str(data.get("reason", "")),
            allowed=data.get("allowed") is True,
            time=number_or_none(stamp) or 0.0,
            basis=None if data.get("basis") is None else str(data.get("basis")),
            via=None if data.get("via") is None else str(data.get("via")),
            host=None if data.get("host") is None else str(data.get("host")),
            details=details,
        )


def write_audit(path: Path, record: AuditRecord) -> None:
    append_jsonl(path, record.to_dict())


def read_audit(path: Path) -> list[AuditRecord]:
    return [AuditRecord.from_dict(r) for r in read_jsonl(path)]
