"""Virtual time for the simulation: one clock, three views of it.

- `wall()`: the login node's wall clock (the controller's `clock`: event timestamps, job times);
- `monotonic()`: the controller's monotonic clock (durations and liveness), offset from wall so
  that code mixing the two is caught;
- `node_wall(skew)`: a compute node's clock, `skew` seconds off the login node's (heartbeats).

`sleep(seconds)` advances virtual time and lets the simulated world catch up (SLURM starts and
ends jobs, ranks step, save, beat): a controller that sleeps inside a pass (stack dumps, backoff)
sees the world move on exactly as it would on a cluster. Cost: nothing; time moves only when the
harness or the controller asks it to.
"""

from __future__ import annotations

from collections.abc import Callable

WALL_BASE = 1_800_000_000.0  # 2027-01-15: any fixed epoch; never compared with real time
MONOTONIC_BASE = 50_000.0


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0  # seconds since the simulation began
        self._listeners: list[Callable[[float], None]] = []

    def on_advance(self, listener: Callable[[float], None]) -> None:
        """`listener(t)` runs whenever time moves forward to t (the world catching up)."""
        self._listeners.append(listener)

    def wall(self) -> float:
        return WALL_BASE + self.t

    def monotonic(self) -> float:
        return MONOTONIC_BASE + self.t

    def node_wall(self, skew: float) -> float:
        return WALL_BASE + self.t + skew

    def to_wall(self, t: float) -> float:
        return WALL_BASE + t

    def from_wall(self, wall: float) -> float:
        return wall - WALL_BASE

    def sleep(self, seconds: float) -> None:
        self.advance_to(self.t + max(0.0, float(seconds)))

    def advance_to(self, t: float) -> None:
        if t <= self.t:
            return
        for listener in self._listeners:
            listener(t)
        self.t = t
