"""Drive the real controller (orchestrator.controller.Controller) against the simulated world.

Every pass is a real `Controller.tick()` on a real run directory; only time is virtual. The
controller gets the virtual clock (`clock`, `monotonic`, `sleep`), the simulated SLURM as its
scheduler and the default submitter (the real sbatch rendering of orchestrator.operate.runs).

Pass spacing (what keeps a simulated month cheap without changing an outcome):
- dense, one pass per `watchdog.poll_seconds`, around every fault: from `pre` seconds before it
  (its last beat and marks seen at poll resolution) to past its detection bound (`post`, or
  `quiet`); over an anomaly that must not be acted on and that stops the scheduler (`quiet`):
  a false positive could come at any pass; and for `dense_after` seconds after the controller
  acts (an event that is more than a record, RECORDS) or anything happens in the world (a note);
- over a silence (a node's storage, the whole filesystem: `silence`): dense at its start and its
  end, one pass per dead_after between: the silent files' age only grows, so what a pass in the
  middle would conclude, the next one still does;
- a pass exactly at each note of the world (a job starts or stops, a save, an eval or a slowed
  step begins or ends, SLURM declares a node DOWN), so each phase is seen by a pass;
- otherwise sparse, at most `cap_seconds` apart. Where every rank beats every heartbeat_seconds
  and makes progress marks every few seconds (steps, a 2.5x step, an eval: the marks move), no
  pass can find anything, whatever the spacing, and the limits learned from the marks are the
  longest gaps each beat carries for its launch, seen by any later pass: sparse passes change no
  outcome. tests/simulation/test_spacing.py runs a slice both ways (the oracle: a pass per poll).
What stays real: the ranks' files at the instant of each pass, the order of events, the
controller's own sleeps (stack dumps, hashing: see checkpoints.make_hasher) advancing the world.

The harness also stands in for what the files cannot carry: the login node's hashing cost
(`contract.manifest.sha256_file` is replaced while a harness is open), the scratch filesystem's size
(`shutil.disk_usage` answers, for the run directory, a GPFS of `fs_capacity_bytes` holding the
checkpoints' apparent sizes plus whatever a scenario filled) and, where no small filesystem can
be mounted to fill, a full disk (`disk_full`: every fsync under the run directory fails ENOSPC).
"""

from __future__ import annotations

import collections
import errno
import math
import os
import shutil
from pathlib import Path
from typing import Any

import orchestrator.contract.manifest as manifest
from orchestrator.contract import KILL_REQUEST, RequestBody, RunPaths, atomic_write_json
from orchestrator.contract import exclude as exclude_list
from orchestrator.contract.events import Event, read_events
from orchestrator.contract.files import deferred_collection
from orchestrator.controller import Controller
from orchestrator.controller.timeouts import silent_after
from orchestrator.plan.config import dump_config, parse_config
from orchestrator.plan.config.load import load_yaml
from orchestrator.slurm.base import JobState
from orchestrator.slurm.render import run_job_name

from .checkpoints import make_hasher
from .clock import VirtualClock
from .timings import Timings
from .world import World

REPO = Path(__file__).resolve().parents[1]
BLOOM_CONFIG = REPO / "configs" / "bloom-176b.yaml"
DiskUsage = collections.namedtuple("DiskUsage", "total used free")  # shutil.disk_usage's answer
TRIVIAL_EVENTS = {"controller_started", "permissions_warning", "disk", "job_adopted"}
# Events that record what a pass saw and change nothing in the world (no job submitted, cancelled
# or signalled, no node excluded): no dense passes after them.
RECORDS = {"checkpoint_complete", "job_training", "node_stalled", "first_step_after_restart"}


def bloom_config(**overrides: Any):
    """configs/bloom-176b.yaml without notifications or operators (nobody to notify, no group)."""
    data = load_yaml(BLOOM_CONFIG)
    data["notifications"] = {}
    data["operators"] = {"group": None, "users": []}
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values) if isinstance(values, dict) else data.__setitem__(
            section, values
        )
    return parse_config(data, source=str(BLOOM_CONFIG))


class _Leave(Exception):
    """Ends the harness's drive of Controller.run (t_end, a stop condition, the controller killed)."""


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
        probe: bool = True,
    ):
        self.cfg = cfg or bloom_config()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "run.yaml").write_text(dump_config(self.cfg))
        self.paths = RunPaths.of(self.run_dir)
        self.timings = Timings.from_config(self.cfg)
        self.clock = VirtualClock()
        self.world = World(
            self.run_dir, self.cfg, self.timings, self.clock, seed=seed, spare_nodes=spare_nodes
        )
        if not probe:  # a scheduler without probe_node: the controller never asks a silent node
            self.world.slurm.probe_node = None
        if foreign_jobs:  # other users' jobs under the run's own name: never the run's to adopt
            name = run_job_name(self.cfg.name, RunPaths.of(self.run_dir).root)
            self.world.slurm.add_foreign_job(name, "alice", JobState.PENDING)
            self.world.slurm.add_foreign_job(name, "alice", JobState.COMPLETED)
        w = self.cfg.watchdog
        self.poll, self.cap, self.dense_after = w.poll_seconds, cap_seconds, dense_after
        self.dense_after_note = dense_after_note
        self.dense_from = math.inf  # one pass per poll from then on (the oracle of the spacing test)
        self.fs_capacity, self.fs_filled = fs_capacity_bytes, 0
        self.small_filesystem = False  # the run directory is a small tmpfs (runner.py) that can really fill
        self.disk_full = False  # every fsync under the run directory fails with ENOSPC (see __enter__)
        self.windows: list[tuple[float, float]] = []
        self.passes: list[tuple[float, float, int]] = []  # (start, end, events appended)
        self.events: list[tuple[float, float, Event]] = []  # (pass start, pass end, event)
        self.crashes: list[tuple[float, str]] = []
        self.hashed_bytes = 0
        self.controller: Controller | None = None
        self.controller_down = False
        self._events_seen = 0
        self._dense_until = 0.0
        self._loop_pause = False  # Controller.run's next sleep is its pause between two passes
        self._pass_start = 0.0
        self._acted = False  # the last events collected hold an action, not only records
        self._patched: list[tuple[Any, str, Any]] = []

    # -- lifecycle -----------------------------------------------------------------------------------
    def __enter__(self) -> Harness:
        self._patch(manifest, "sha256_file", make_hasher(self._charge_hash))
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
        self.controller = Controller(
            self.run_dir,
            self.cfg,
            self.world.slurm,
            clock=self.clock.wall,
            monotonic=self.clock.monotonic,
            sleep=self.clock.sleep,
        )
        self.controller.start()
        self.controller_down = False
        self._collect_events(self.clock.t, self.clock.t)

    def kill_controller(self) -> None:
        """The controller process dies (kill -9): no stop(), no last state save; the lock goes."""
        self.controller.lock.release()
        self.controller_down = True

    # -- scheduling faults and operator actions --------------------------------------------------------
    def at(
        self,
        t: float,
        action,
        *,
        pre: float | None = None,
        post: float = 0.0,
        quiet: float = 0.0,
        window: bool = True,
    ) -> None:
        """Run `action(t)` at virtual time t. Dense passes over [t - pre, t + pre] and over the last
        2 x pre seconds before t + post (where detection is due); over all of [t - pre, t + quiet]
        for an anomaly that must NOT be acted on (a pass anywhere in it could be a false positive).
        `window=False`: no dense passes for it (work that stays slow but moves, whose marks and
        beats keep changing: the spacing argument of the module docstring holds through it)."""
        if pre is None:
            pre = 1.2 * self.timings.step_seconds + self.timings.heartbeat_seconds + self.poll
        if window:
            self.windows.append((t - pre, t + max(pre, quiet)))
            if post > pre:
                self.windows.append((t + max(pre, post - 2 * pre), t + post))
        self.world.at(t, action)

    def silence(self, t: float, action, seconds: float) -> None:
        """Run `action(t)`, which silences files for `seconds` (a node's storage, the filesystem):
        dense passes from one beat before it until `silent_after` + 2 polls into it (the last
        write is seen at poll resolution, and whatever the controller concludes from a silence
        that short), from 2 polls before its end to a beat and 2 polls after it (the longest
        silence, and the beats coming back); in between one pass every `dead_after`. Within a
        silence the silent files' age only grows and the others' changes are seen at every pass,
        so whatever a dense pass in the middle would conclude, the next pass still sees
        (tests/simulation/test_spacing.py checks it against dense passes)."""
        w = self.cfg.watchdog
        quiet = silent_after(w) + 2 * self.poll
        self.at(t, action, pre=w.heartbeat_seconds + self.poll, quiet=quiet)
        every = w.dead_after_seconds
        k = 1
        while quiet + k * every < seconds - 2 * self.poll:
            self.windows.append((t + quiet + k * every, t + quiet + k * every))
            k += 1
        self.windows.append((t + seconds - 2 * self.poll, t + seconds + w.heartbeat_seconds + 2 * self.poll))

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
        """What `runctl kill` drops in control/ (the controller authenticates it by the file's owner)."""
        atomic_write_json(
            self.paths.control_request(KILL_REQUEST), RequestBody(reason=reason).to_dict(), mode=0o660
        )

    # -- passes -----------------------------------------------------------------------------------------
    def run_until(self, t_end: float, stop=None) -> None:
        """Passes until virtual time t_end (or `stop(harness)` is true after a pass). The passes are
        the production loop's: `Controller.run` (safe_tick, then its own pause: poll_seconds, or
        its backoff after a failed pass), with its sleep between passes stretched by the spacing
        (sparse: `_advance_to_next_pass`). A pass that raises is the loop's to handle, as in
        production: a `pass_failed` event and a retry; `crashes` lists them."""
        while self.clock.t < t_end:
            if self.controller_down:
                self._advance_to_next_pass(t_end)
                continue
            if self._loop(t_end, stop):
                return

    def _loop(self, t_end: float, stop) -> bool:
        """Drive Controller.run until t_end, `stop`, or the controller's death; True: stop now."""
        controller = self.controller
        stopping = {"now": False}

        def on_pass(result) -> None:
            self._after_pass(result)
            if stop is not None and stop(self):
                stopping["now"] = True
            if stopping["now"] or self.clock.t >= t_end:
                raise _Leave
            self._loop_pause = True  # the loop's next sleep is its pause between passes

        def sleep(seconds: float) -> None:
            if not self._loop_pause:  # a sleep inside a pass (stack dumps, hashing): time as it is
                self.clock.sleep(seconds)
                return
            self._loop_pause = False
            self._advance_to_next_pass(t_end, at_least=seconds)
            if self.controller_down:
                raise _Leave
            self._before_pass()

        controller.sleep = sleep
        self._loop_pause = False
        try:
            if self.passes and self.passes[-1][0] >= self.clock.t:  # a pass ended the last call
                self._advance_to_next_pass(t_end)
                if self.controller_down or self.clock.t >= t_end:
                    return False
            self._before_pass()
            controller.run(on_pass=on_pass, stay=True)
        except _Leave:
            pass
        finally:
            controller.sleep = self.clock.sleep
        return stopping["now"]

    def _before_pass(self) -> None:
        self._pass_start = self.clock.t
        with deferred_collection():  # the world's sync, like a pass: its beats hold no cycles
            self.world.sync()

    def _after_pass(self, result) -> None:
        start = self._pass_start
        if result.error is not None:  # the loop recorded it (pass_failed) and retries with backoff
            self.crashes.append((start, result.error))
        self.world.after_pass()  # the launchers read what the pass decided
        appended = self._collect_events(start, self.clock.t)
        self.passes.append((start, self.clock.t, appended))
        if self._acted:
            self._dense_until = max(self._dense_until, self.clock.t + self.dense_after)

    def _dense(self, t: float) -> bool:
        return t >= self.dense_from or t < self._dense_until or any(a <= t <= b for a, b in self.windows)

    def _advance_to_next_pass(self, t_end: float, at_least: float = 0.0) -> None:
        t = self.clock.t
        poll = max(self.poll, at_least)  # the loop's pause: poll_seconds, or its backoff
        if at_least > self.poll or self._dense(t) or self._dense(t + poll):
            self.clock.advance_to(min(t_end, t + poll))
            return
        starts = [a for a, _ in self.windows if a > t]
        limit = min([t_end, t + self.cap, *starts])
        notes = len(self.world.notes)
        while self.clock.t < limit:
            self.clock.advance_to(min(limit, max(self.world.next_event_time(), self.clock.t + 1e-3)))
            if len(self.world.notes) > notes:  # something happened: a pass now, then dense
                self._dense_until = max(self._dense_until, self.clock.t + self.dense_after_note)
                return

    def _collect_events(self, start: float, end: float) -> int:
        records = read_events(self.paths.events)
        new = records[self._events_seen :]
        self._events_seen = len(records)
        for record in new:
            self.events.append((start, end, record))
        self._acted = any(r.KIND not in TRIVIAL_EVENTS and r.KIND not in RECORDS for r in new)
        return len([r for r in new if r.KIND not in TRIVIAL_EVENTS])

    # -- what tests and the soak read ---------------------------------------------------------------------
    @property
    def t(self) -> float:
        return self.clock.t

    def events_named(self, *names: str, after: float = -math.inf) -> list[tuple[float, float, Event]]:
        return [e for e in self.events if e[2].KIND in names and e[0] >= after]

    def excluded(self) -> list[str]:
        return exclude_list.excluded_nodes(self.paths)

    def submissions(self) -> list[str]:
        return [str(arg) for _, method, arg in self.world.slurm.calls if method == "submit"]

    def own_jobs(self) -> list:
        return [j for j in self.world.slurm.jobs_by_id.values() if j.user == self.world.slurm.owner]
