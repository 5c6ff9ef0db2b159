"""Where a trainer process's start goes, part by part: what `first_step_after_restart` reports.

`PHASES.mark(name)` adds the seconds since the previous mark to `name`. trainer/__main__.py starts
the clock when the process (or the warm standby, at its go: trainer/standby.py) starts the trainer;
the parts are the config, the rendezvous, the model, the engine, the data index, the copies found,
fetched and checked (trainer/restore_order.py), the load and the probe. The first step is not in
it: the controller sees it.
"""

from __future__ import annotations

import time


class StartPhases:
    def __init__(self) -> None:
        self.last = time.time()
        self.seconds: dict[str, float] = {}

    def start(self, when: float) -> None:
        self.last = when
        self.seconds = {}

    def mark(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self.last, 3)
        self.last = now


PHASES = StartPhases()
