"""One entry of the run's exclude list (excluded-nodes.json, `RunPaths.exclude_list`): a node
kept out of the run's later jobs, on probation until `until` (the controller's clock). The list
is {"nodes": {name: entry}}; an entry written before probations existed has no `until` and never
expires by itself (`runctl nodes --clear` takes it off). Read from a file the operators' group can
read, so every field is checked, never trusted: a wrong type reads as absent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .values import number_or_none


@dataclass(frozen=True)
class Exclusion:
    node: str
    since: float | None  # controller clock (epoch seconds) when it was excluded
    until: float | None  # probation ends then; None: until cleared
    reason: str = ""
    by: str = ""
    cause: str = ""  # dead_rank, hang, repeated_stalls, straggler, ...
    job_id: str = ""

    @classmethod
    def from_entry(cls, node: str, raw: Any) -> Exclusion:
        raw = raw if isinstance(raw, dict) else {}

        def text(key: str) -> str:
            value = raw.get(key)
            return value[:500] if isinstance(value, str) else ""

        return cls(
            node, number_or_none(raw.get("since")), number_or_none(raw.get("until")),
            text("reason"), text("by"), text("cause"), text("job_id"),
        )  # fmt: skip

    def to_entry(self) -> dict[str, Any]:
        return {
            "since": self.since, "until": self.until, "reason": self.reason, "by": self.by,
            "cause": self.cause, "job_id": self.job_id,
        }  # fmt: skip

    def expired(self, now: float) -> bool:
        return self.until is not None and now >= self.until

    def expires_in(self, now: float) -> float | None:
        return None if self.until is None else self.until - now
