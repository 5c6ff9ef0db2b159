"""Drive the real controller (orchestrator.controller.Controller) against the simulated world.

Every pass is a real `Controller.tick()` on a real run directory; only time is virtual. The
controller gets the virtual clock (`clock`, `monotonic`, `sleep`), the simulated SLURM as its
scheduler and the default submitter (the real sbatch rendering of orchestrator.runs).

Pass spacing (what keeps a simulated month under two minutes without changing an outcome):
- dense, one pass per `watchdog.poll_seconds`, around every fault: from `pre` seconds before to
  `pre` after it (pre = one step + one beat + one poll, so the last beat and the last progress
  before the fault are seen at poll resolution), and over the last 2 x pre seconds before its
  detection bound plus a margin (`post`), where detection is due; and for `dense_after` seconds
  after anything happens: a job starts or stops, the trainer changes phase, the controller acts.
  Between the two parts of a fault window passes may be sparse: all the controller can see
  there is beats that change and progress that does not, which it saw at the start. An anomaly
  that must not be acted on (a slow save, a stall, a requeue) is dense from start to end
  (`quiet`): a false positive could come at any pass;
- a pass exactly at each such moment (so each phase, each save included, is seen by a pass);
- otherwise sparse, at most `cap_seconds` apart. In a fault-free stretch every rank beats every
  heartbeat_seconds and progresses every step, far inside dead_after and every phase timeout, so
  no pass there can find anything, whatever the spacing: sparse passes change no outcome.
What stays real: the ranks' files at the instant of each pass, the order of events, the
controller's own sleeps (stack dumps, hashing: see checkpoints.make_hasher) advancing the world.

The harness also stands in for what the files cannot carry: the login node's hashing cost
(`protocol.sha256_file` is replaced while a harness is open), the scratch filesystem's size
(`shutil.disk_usage` answers, for the run directory, a GPFS of `fs_capacity_bytes` holding the
checkpoints' apparent sizes plus whatever a scenario filled) and, where no small filesystem can
be mounted to fill, a full disk (`disk_full`: every fsync under the run directory fails ENOSPC).
"""

from __future__ import annotations

import collections
import errno
import importlib.util
import inspect
import math
import os
import shutil
from pathlib import Path
from typing import Any

import orchestrator.protocol as protocol
from orchestrator.config import dump_config, parse_config
from orchestrator.config.load import load_yaml
from orchestrator.controller import Controller
from orchestrator.controller import exclude as exclude_list
from orchestrator.protocol import KILL_REQUEST, RunPaths, atomic_write_json, read_jsonl
from orchestrator.slurm.base import JobState

from .checkpoints import make_hasher
from .clock import VirtualClock
from .timings import Timings
from .world import World

REPO = Path(__file__).resolve().parents[2]
BLOOM_CONFIG = REPO / "configs" / "bloom-176b.yaml"
DiskUsage = collections.namedtuple("DiskUsage", "total used free")  # shutil.disk_usage's answer
TRIVIAL_EVENTS = {"controller_started", "permissions_warning", "disk", "job_adopted"}


def bloom_config(**overrides: Any):
    """configs/bloom-176b.yaml without notifications or operators (nobody to notify, no group)."""
    data = load_yaml(BLOOM_CONFIG)
    data["notifications"] = {"webhook": None, "email": None}
    data["operators"] = {"group": None, "users": []}
    for section, values in overrides.items():
        data[section].update(values) if isinstance(values, dict) else data.__setitem__(section, values)
    return parse_config(data, source=str(BLOOM_CONFIG))


class Harness:
    def __init__(
        self,
        run_dir: Path,
        *,
        seed: int = 0,
        cfg: Any = None,
        spare_nodes: int = 4,
        cap_seconds: float = 1800.0,
        dense_after: float = 30.0,
        dense_after_note: float = 30.0,
        foreign_jobs: bool = True,
        fs_capacity_bytes: int = 100 * 10**12,
    ):
        self.cfg = cfg or bloom_config()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "run.yaml").write_text(dump_config(self.cfg))
        self.paths = RunPaths.of(self.run_dir)
        self.timings = Timings.from_config(self.cfg)
        self.clock = VirtualClock()
        accepted = importlib.util.find_spec("orchestrator.controller.requests") is not None
        self.world = World(
            self.run_dir,
            self.cfg,
            self.timings,
            self.clock,
            seed=seed,
            spare_nodes=spare_nodes,
            kill_file="accepted" if accepted else "control",
        )
        if foreign_jobs:  # other users' jobs under the run's own name: never the run's to adopt
            self.world.slurm.add_foreign_job(self.cfg.name, "alice", JobState.PENDING)
            self.world.slurm.add_foreign_job(self.cfg.name, "alice", JobState.COMPLETED)
        w = self.cfg.watchdog
        self.poll, self.cap, self.dense_after = w.poll_seconds, cap_seconds, dense_after
        self.dense_after_note = dense_after_note
        self.fs_capacity, self.fs_filled = fs_capacity_bytes, 0
        self.small_filesystem = False  # the run directory is a small tmpfs (runner.py) that can really fill
        self.disk_full = False  # every fsync under the run directory fails with ENOSPC (see __enter__)
        self.windows: list[tuple[float, float]] = []
        self.passes: list[tuple[float, float, int]] = []  # (start, end, events appended)
        self.events: list[tuple[float, float, dict[str, Any]]] = []  # (pass start, pass end, event)
        self.crashes: list[tuple[float, str]] = []
        self.hashed_bytes = 0
        self.controller: Controller | None = None
        self.controller_down = False
        self._events_seen = 0
        self._dense_until = 0.0
        self._patched: list[tuple[Any, str, Any]] = []

    # -- lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> Harness:
        self._patch(protocol, "sha256_file", make_hasher(self._charge_hash))
        real_usage = shutil.disk_usage
        root = str(self.paths.root)

        def disk_usage(path):
            if str(Path(path).resolve()).startswith(root):
                free = max(0, self.world.free_bytes(self.fs_capacity) - self.fs_filled)
                return DiskUsage(self.fs_capacity, self.fs_capacity - free, free)
            return real_usage(path)

        self._patch(shutil, "disk_usage", disk_usage)
        real_fsync = os.fsync

        def fsync(fd: int) -> None:  # without a small filesystem to fill: ENOSPC where ext4/GPFS report it
            if self.disk_full and os.readlink(f"/proc/self/fd/{fd}").startswith(root):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        self._patch(os, "fsync", fsync)
        try:
            self.start_controller()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.controller is not None and not self.controller_down:
            try:
                self.controller.stop()
            except Exception:  # e.g. its last state save on a full disk: the scenario judged that already
                pass
        for owner, name, value in reversed(self._patched):
            setattr(owner, name, value)

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _charge_hash(self, size: int) -> None:
        self.hashed_bytes += size
        self.clock.sleep(size / self.timings.login_hash_bytes_per_second)

    def start_controller(self) -> None:
        clocks = {"clock": self.clock.wall, "monotonic": self.clock.monotonic, "sleep": self.clock.sleep}
        accepted = inspect.signature(Controller).parameters  # a controller from before `monotonic`
        clocks = {k: v for k, v in clocks.items() if k in accepted}
        if "monotonic" not in accepted:  # its stack wait would run on the real clock: skip it
            clocks["stack_wait_seconds"] = 0.0
        self.controller = Controller(self.run_dir, self.cfg, self.world.slurm, **clocks)
        self.controller.start()
        self.controller_down = False
        self._collect_events(self.clock.t, self.clock.t)

    def kill_controller(self) -> None:
        """The controller process dies (kill -9): no stop(), no last state save; the lock goes."""
        self.controller.lock.release()
        self.controller_down = True

    # -- scheduling faults and operator actions --------------------------------------------------------
    def at(
        self, t: float, action, *, pre: float | None = None, post: float = 0.0, quiet: float = 0.0
    ) -> None:
        """Run `action(t)` at virtual time t. Dense passes over [t - pre, t + pre] and over the last
        2 x pre seconds before t + post (where detection is due); over all of [t - pre, t + quiet]
        for an anomaly that must NOT be acted on (a pass anywhere in it could be a false positive)."""
        if pre is None:
            pre = 1.2 * self.timings.step_seconds + self.timings.heartbeat_seconds + self.poll
        self.windows.append((t - pre, t + max(pre, quiet)))
        if post > pre:
            self.windows.append((t + max(pre, post - 2 * pre), t + post))
        self.world.at(t, action)

    def when(
        self,
        note: str,
        delay: float,
        action,
        *,
        nth: int = 1,
        post: float = 0.0,
        quiet: float = 0.0,
        **match: Any,
    ) -> None:
        """Run `action` `delay` seconds after the nth world note `note` (e.g. the first save_done)."""
        seen = {"n": 0}

        def watcher(t: float, what: str, fields: dict[str, Any]) -> bool:
            if what != note or any(fields.get(k) != v for k, v in match.items()):
                return False
            seen["n"] += 1
            if seen["n"] < nth:
                return False
            self.at(t + delay, action, post=post, quiet=quiet)
            return True

        self.world.watchers.append(watcher)

    def operator_kill(self, t: float, reason: str = "stop for the weekend") -> None:
        atomic_write_json(
            self.paths.control_request(KILL_REQUEST),
            {"user": "oncall", "reason": reason, "now": False, "time": self.clock.to_wall(t)},
        )

    # -- passes -----------------------------------------------------------------------------------------
    def run_until(self, t_end: float, stop=None) -> None:
        """Passes until virtual time t_end (or `stop(harness)` is true after a pass)."""
        if not self.passes and not self.controller_down:
            self.tick()
        while self.clock.t < t_end:
            self._advance_to_next_pass(t_end)
            if self.controller_down:
                continue
            self.tick()
            if stop is not None and stop(self):
                return

    def _dense(self, t: float) -> bool:
        return t < self._dense_until or any(a <= t <= b for a, b in self.windows)

    def _advance_to_next_pass(self, t_end: float) -> None:
        t = self.clock.t
        if self._dense(t) or self._dense(t + self.poll):
            self.clock.advance_to(min(t_end, t + self.poll))
            return
        starts = [a for a, _ in self.windows if a > t]
        limit = min([t_end, t + self.cap, *starts])
        notes = len(self.world.notes)
        while self.clock.t < limit:
            self.clock.advance_to(min(limit, max(self.world.next_event_time(), self.clock.t + 1e-3)))
            if len(self.world.notes) > notes:  # something happened: a pass now, then dense
                self._dense_until = max(self._dense_until, self.clock.t + self.dense_after_note)
                return

    def tick(self):
        start = self.clock.t
        self.world.sync()
        result = None
        try:
            result = self.controller.tick()
        except Exception as exc:  # `runctl watch` would die here: the run is unsupervised from now on
            self.crashes.append((start, f"{type(exc).__name__}: {exc}"))
            self.kill_controller()
        appended = self._collect_events(start, self.clock.t)
        self.passes.append((start, self.clock.t, appended))
        if appended:
            self._dense_until = max(self._dense_until, self.clock.t + self.dense_after)
        return result

    def _collect_events(self, start: float, end: float) -> int:
        records = read_jsonl(self.paths.events)
        new = records[self._events_seen :]
        self._events_seen = len(records)
        for record in new:
            self.events.append((start, end, record))
        return len([r for r in new if r.get("event") not in TRIVIAL_EVENTS])

    # -- what tests and the soak read ---------------------------------------------------------------------
    @property
    def t(self) -> float:
        return self.clock.t

    def events_named(
        self, *names: str, after: float = -math.inf
    ) -> list[tuple[float, float, dict[str, Any]]]:
        return [e for e in self.events if e[2].get("event") in names and e[0] >= after]

    def excluded(self) -> list[str]:
        return exclude_list.excluded_nodes(self.paths)

    def submissions(self) -> list[str]:
        return [str(arg) for _, method, arg in self.world.slurm.calls if method == "submit"]

    def own_jobs(self) -> list:
        return [j for j in self.world.slurm.jobs_by_id.values() if j.user == self.world.slurm.owner]
