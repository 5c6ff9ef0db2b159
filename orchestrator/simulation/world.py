"""The simulated cluster: SLURM, the trainer's incarnations, faults and the time ledger.

`advance(t)` (called by the virtual clock) processes every due event in time order: timers
(faults the harness scheduled), SLURM (starts, node deaths, signals, time limits) and each live
incarnation's timeline. Between two events nothing changes, so the ledger charges each interval
to one cause: the running incarnation's category (startup, load, step, save, eval, exit, or
detection once a fault stopped its progress), else "queue" while a job of the run is pending,
else "idle" (no job: the controller is deciding, stopped, or cannot reach SLURM). The causes add
up to the wall time by construction; `tests/simulation/test_soak.py` checks that they do.

`sync()` writes the heartbeat files of every rank whose bytes changed since the last sync (the
harness calls it right before each controller pass), with plain write-and-rename: the contract's
atomicity without 384 fsyncs a pass.
"""

from __future__ import annotations

import heapq
import math
import os
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.protocol import KILL_REQUEST, RunPaths
from orchestrator.slurm.base import JobState

from . import checkpoints as sim_ckpt
from .clock import VirtualClock
from .slurm import SimJob, SimSlurm
from .timings import Timings
from .trainer import Incarnation, choose_resume


class World:
    def __init__(
        self,
        run_dir: Path,
        cfg: Any,
        timings: Timings,
        clock: VirtualClock,
        *,
        seed: int,
        spare_nodes: int = 4,
        kill_file: str = "control",
    ):
        self.paths = RunPaths.of(run_dir)
        configured = Path(cfg.checkpoint.dir)  # protocol.checkpoints_dir's rule
        self.ckpt_dir = configured if configured.is_absolute() else self.paths.root / configured
        self.cfg, self.timings, self.clock = cfg, timings, clock
        self.rng = random.Random(seed)
        self.world_size, self.gpus_per_node = cfg.world_size, cfg.cluster.gpus_per_node
        self.keep_last = cfg.checkpoint.keep_last
        pool = [f"node{i:03d}" for i in range(1, cfg.cluster.nodes + spare_nodes + 1)]
        self.slurm = SimSlurm(
            clock,
            pool,
            nodes_per_job=cfg.cluster.nodes,
            rng=self.rng,
            queue_wait_mean=timings.queue_wait_mean_seconds,
            slurmd_timeout=timings.slurmd_timeout_seconds,
            time_limit=timings.time_limit_seconds,
            pre_timeout=timings.pre_timeout_seconds,
            owner=os.environ.get("USER", "bloom"),
        )
        self.slurm.on_start, self.slurm.on_stop, self.slurm.on_signal = (
            self._job_started,
            self._job_stopped,
            self._signal,
        )
        self.kill_file = kill_file  # "accepted": the trainer acts only on requests the controller accepted
        self.skew: dict[str, float] = {}
        self.live: dict[str, Incarnation] = {}
        self.incarnations: list[Incarnation] = []
        self.stall_until = -math.inf
        self.writes_fail = False  # a full disk (when it cannot be made real)
        self.now = 0.0
        self.ledger: dict[str, float] = defaultdict(float)
        self.steps: list[tuple[int, float, str, float]] = []  # (index, seconds, job id, end time)
        self.notes: list[tuple[float, str, dict[str, Any]]] = []  # what happened, for pass timing
        self._timers: list[tuple[float, int, Any]] = []
        self._timer_seq = 0
        self.watchers: list[Any] = []  # (t, note, fields) -> True once it has fired (then dropped)
        self._written: dict[int, str] = {}
        self.paths.heartbeats.mkdir(parents=True, exist_ok=True)
        clock.on_advance(self.advance)

    # -- time -------------------------------------------------------------------------------------
    def at(self, t: float, action, label: str = "") -> None:
        """Run `action(t)` at virtual time t (faults, operator actions)."""
        self._timer_seq += 1
        heapq.heappush(self._timers, (t, self._timer_seq, action))

    def next_event_time(self) -> float:
        times = [self._timers[0][0]] if self._timers else []
        times.append(self.slurm.next_event_time())
        times.extend(inc.next_at for inc in self.live.values())
        return min(times)

    def advance(self, target: float) -> None:
        while True:
            t = self.next_event_time()
            if t > target:
                break
            self._charge(t)
            while self._timers and self._timers[0][0] <= t:
                _, _, action = heapq.heappop(self._timers)
                action(t)
            self.slurm.process(t)
            for inc in list(self.live.values()):
                inc.run_due(t)
        self._charge(target)

    def _charge(self, t: float) -> None:
        if t > self.now:
            self.ledger[self.category()] += t - self.now
            self.now = t

    def category(self) -> str:
        for inc in self.live.values():
            return inc.category()
        mine = [j for j in self.slurm.jobs_by_id.values() if j.user == self.slurm.owner]
        return "queue" if any(j.state is JobState.PENDING and not j.held for j in mine) else "idle"

    def note(self, what: str, t: float, **fields: Any) -> None:
        self.notes.append((t, what, fields))
        self.watchers = [w for w in self.watchers if not w(t, what, fields)]

    # -- SLURM's callbacks -------------------------------------------------------------------------
    def _job_started(self, job: SimJob, t: float) -> None:
        inc = Incarnation(self, job, t)
        self.live[job.job_id] = inc
        self.incarnations.append(inc)
        self.note("job_start", t, job_id=job.job_id, nodes=list(job.nodes), restart_count=job.restart_count)

    def _job_stopped(self, job: SimJob, t: float, why: str) -> None:
        inc = self.live.pop(job.job_id, None)
        if inc is not None and inc.gone_at is None:
            inc.end(t)
            self._sync_incarnation(inc, t)
        self.note("job_stop", t, job_id=job.job_id, why=why)

    def _signal(self, job: SimJob, t: float) -> None:
        if inc := self.live.get(job.job_id):
            inc.signal_budget(t)

    def processes_exited(self, inc: Incarnation, t: float, code: int) -> None:
        inc.end(t)
        self._sync_incarnation(inc, t)
        self.live.pop(inc.job_id, None)
        self.slurm.job_exited(inc.job, t, code)

    # -- what the trainer asks of the world ---------------------------------------------------------
    def kill_requested(self) -> bool:
        base = self.paths.accepted if self.kill_file == "accepted" else self.paths.control
        return (base / KILL_REQUEST).exists()

    def choose_resume(self, job_id: str) -> int | None:
        return choose_resume(self.ckpt_dir, job_id, self.clock.to_wall(self.now))

    def save_checkpoint(self, step: int, node: str, t: float) -> None:
        wall = self.clock.to_wall(t) + self.skew.get(node, 0.0)
        try:
            if self.writes_fail:
                raise OSError(28, "No space left on device")
            sim_ckpt.write_checkpoint(
                self.ckpt_dir, step, self.timings.checkpoint_bytes, self.cfg.cluster.nodes, wall
            )
            sim_ckpt.keep_last(self.ckpt_dir, self.keep_last)
        except OSError:  # ENOSPC during the save: rank 0 raises, srun ends the job (exit 1)
            self.crash_rank(t, 0, by_signal=False)

    def log_step(self, index: int, seconds: float, job_id: str, t: float) -> None:
        self.steps.append((index, seconds, job_id, t))

    # -- heartbeat files ------------------------------------------------------------------------------
    def sync(self) -> int:
        """Write the heartbeat files whose bytes changed; returns how many were written."""
        if self.now < self.stall_until or self.writes_fail:
            return 0
        written = 0
        for inc in self.live.values():
            written += self._sync_incarnation(inc, self.now)
        return written

    def _sync_incarnation(self, inc: Incarnation, t: float) -> int:
        if t < self.stall_until:
            return 0
        written = 0
        dir_fd = os.open(self.paths.heartbeats, os.O_RDONLY)
        try:
            for rank in range(self.world_size):
                text = inc.beat(rank, t)
                if text is None:
                    continue
                if self._written.get(rank) == text:
                    continue
                name = f"rank-{rank:05d}.json"
                try:
                    fd = os.open(".sim.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
                    try:
                        os.write(fd, text.encode())
                    finally:
                        os.close(fd)
                    os.replace(".sim.tmp", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except OSError:  # a full disk: the trainer's beat thread logs and carries on
                    continue
                self._written[rank] = text
                written += 1
        finally:
            os.close(dir_fd)
        return written

    # -- faults (the harness calls these at their time) ---------------------------------------------
    def running_incarnation(self) -> Incarnation | None:
        return next(iter(self.live.values()), None)

    def node_of(self, inc: Incarnation, rank: int) -> str:
        return inc.nodes[rank // self.gpus_per_node]

    def crash_rank(self, t: float, rank: int, by_signal: bool) -> str | None:
        """One rank dies; srun --kill-on-bad-exit ends the others; the job fails."""
        inc = self.running_incarnation()
        if inc is None:
            return None
        node = self.node_of(inc, rank)
        inc.kill_rank(rank, t, exit_beat=not by_signal)
        what = "Killed" if by_signal else "Exited with exit code 1"
        out = self.paths.jobs / f"slurm-{inc.job_id}.out"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as handle:
            handle.write(f"srun: error: {node}: task {rank}: {what}\n")
        code = 137 if by_signal else 1
        self.at(t + 3.0, lambda when: self.processes_exited(inc, when, code) if inc.gone_at is None else None)
        return node

    def lose_node(self, t: float, node: str | None = None, requeue: bool = False) -> str | None:
        inc = self.running_incarnation()
        if inc is None:
            return None
        node = node or inc.nodes[len(inc.nodes) // 2]
        first = inc.nodes.index(node) * self.gpus_per_node
        for rank in range(first, first + self.gpus_per_node):
            inc.kill_rank(rank, t)
        self.slurm.fail_node(node, t, requeue=requeue)
        return node

    def hang(self, t: float) -> None:
        if inc := self.running_incarnation():
            inc.fault(t)

    def stall_filesystem(self, t: float, seconds: float) -> None:
        self.stall_until = t + seconds

    def free_bytes(self, capacity: int) -> int:
        used = sum(p.stat().st_size for p in self.ckpt_dir.rglob("*.pt")) if self.ckpt_dir.exists() else 0
        return max(0, capacity - used)
