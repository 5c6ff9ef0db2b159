"""The base of every events.jsonl record: `Event` (its kind, its time, how a line reads back as
its type) and the registry of kinds, which each kind joins when its class is defined. The kinds
themselves are in events.py (the controller's own) and by subject (failure_events,
health_events, pool_events); events.py imports them all, so whoever reads events through it
knows every kind, and a rank that only writes its beat loads none of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .files import check_version
from .values import number_or_none

EVENT_VERSION = 1
_KINDS: dict[str, type[Event]] = {}
E = TypeVar("E", bound="Event")


@dataclass(frozen=True, kw_only=True)
class Event:
    KIND: ClassVar[str] = ""
    time: float | None = None  # stamped by the writer's clock when None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.KIND:
            if cls.KIND in _KINDS:
                raise TypeError(f"event kind {cls.KIND!r} defined twice")
            _KINDS[cls.KIND] = cls

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"event": self.KIND, "version": EVENT_VERSION, **_plain(data)}

    def details(self) -> dict[str, Any]:
        """The event's own fields (no kind, time or version), as JSON holds them: for people."""
        data = self.to_dict()
        for key in ("event", "time", "version"):
            data.pop(key, None)
        return data

    def stamped(self: E, now: float) -> E:
        return self if self.time is not None else dataclasses.replace(self, time=now)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        check_version(data, "an events.jsonl line", EVENT_VERSION)
        kind = data.get("event")
        event_type = _KINDS.get(kind) if isinstance(kind, str) else None
        stamp = data.get("time")
        stamp = number_or_none(stamp)
        if event_type is None:
            return UnknownEvent(
                time=stamp, name=str(kind), fields={k: v for k, v in data.items() if k != "event"}
            )
        values: dict[str, Any] = {"time": stamp}
        for spec in dataclasses.fields(event_type):
            if spec.name == "time":
                continue
            if spec.name in data:
                values[spec.name] = data[spec.name]
            elif spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                values[spec.name] = None  # written before this field existed
        return event_type(**values)


def _plain(value: Any) -> Any:
    """Tuples to lists, enums to their values: what JSON holds."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and isinstance(value.value, (str, int)):
        return value.value
    return value


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A line of a kind this code does not know (written by a newer runctl, or by hand)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.fields, "event": self.name, "time": self.time}
