"""What the controller writes of itself: state.json (fsynced: when something changed, and at
least every STATE_REFRESH_SECONDS so that its last_pass says it is alive) and controller.json (its
own heartbeat, every pass, `runctl doctor` watches it). A full disk never ends supervision: the
state stays in memory and is written again next pass."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import orjson

from orchestrator.contract import RunPaths
from orchestrator.contract import events as ev
from orchestrator.contract.controller_beat import write_beat
from orchestrator.contract.severity import Notice
from orchestrator.contract.state import ControllerState, save_state

from .reporter import Reporter

log = logging.getLogger("runctl.controller")
STATE_REFRESH_SECONDS = 30.0


class Persistence:
    def __init__(self, paths: RunPaths, cfg: Any, reporter: Reporter, clock: Callable[[], float]):
        self.paths, self.cfg, self.reporter, self.clock = paths, cfg, reporter, clock
        self.started_wall = clock()
        self.passes = 0  # every pass, failed ones too: controller.json's counter (runctl doctor)
        self._saved_snapshot: bytes | None = None
        self._saved_at = 0.0
        self._said_not_saved = False

    def save_if_changed(self, state: ControllerState, now: float) -> None:
        snapshot = _fingerprint(state)
        if snapshot != self._saved_snapshot or now - self._saved_at > STATE_REFRESH_SECONDS:
            self.save(state)
            self._saved_snapshot, self._saved_at = snapshot, now

    def save(self, state: ControllerState) -> None:
        """The failure to save is an event (if that can be written) and a notification, once."""
        try:
            save_state(self.paths, state)
        except OSError as exc:
            self._saved_snapshot = None
            self.reporter.emit(ev.StateNotSaved(error=str(exc)))
            if not self._said_not_saved:
                self._said_not_saved = True
                self.reporter.notify(
                    Notice.DISK,
                    f"cannot write {self.paths.state}: {exc}. Free space on the run directory's "
                    "filesystem; the controller keeps supervising from memory",
                    {"error": str(exc)},
                )
        else:
            self._said_not_saved = False

    def beat(self, state: ControllerState, failing_passes: int, node_beat_age: dict[str, float]) -> None:
        """controller.json (contract.controller_beat)."""
        self.passes += 1
        try:
            write_beat(
                self.paths,
                passes=self.passes,
                failing_passes=failing_passes,
                status=state.status.value,
                poll_seconds=self.cfg.watchdog.poll_seconds,
                started_at=self.started_wall,
                now=self.clock(),
                node_beat_age=node_beat_age,
            )
        except OSError as exc:  # a full disk is reported by the pass itself; never stop supervising
            log.warning("cannot write %s: %s", self.paths.controller_heartbeat, exc)


def _fingerprint(state: ControllerState) -> bytes:
    """What state.json says but for the fields that move every pass (last_pass, controller), to
    tell whether anything changed. orjson serialises the dataclasses itself, ~50x cheaper than
    asdict (which deep-copies every job record: a tenth of a simulated month's CPU time)."""
    steady = dataclasses.replace(state, last_pass=None, controller={})
    return orjson.dumps(steady, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
