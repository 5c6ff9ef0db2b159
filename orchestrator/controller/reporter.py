"""What the controller says: events.jsonl (stamped with its clock) and notifications. A full disk
loses a line (logged), never the controller; a notification that fails is itself an event."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator.contract import RunPaths
from orchestrator.contract import events as ev
from orchestrator.contract.events import write_event
from orchestrator.controller.notify import destinations, notify

log = logging.getLogger("runctl.controller")


class Reporter:
    def __init__(self, paths: RunPaths, cfg: Any, clock: Callable[[], float]):
        self.paths, self.cfg, self.clock = paths, cfg, clock

    def emit(self, event: ev.Event) -> ev.Event | None:
        try:
            stamped = write_event(self.paths.events, event, now=self.clock())
        except OSError as exc:
            log.error("cannot write events.jsonl (%s); lost event %s", exc, str(event)[:300])
            return None
        log.info("%s %s", event.KIND, str(stamped.details())[:300])
        return stamped

    def notify(self, kind: str, message: str, details: dict[str, Any]) -> None:
        settings = self.cfg.notifications
        problems = notify(settings, self.cfg.name, kind, message, details)
        for problem in problems:
            log.warning("notification failed: %s", problem)
            self.emit(ev.NotificationFailed(kind=kind, problem=problem))
        if not problems and kind in (settings.events or []) and destinations(settings, kind):
            self.emit(ev.Notified(kind=kind))
