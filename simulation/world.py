"""The simulated cluster: SLURM, the trainer's incarnations, faults and the time ledger.

`advance(t)` (called by the virtual clock) processes every due event in time order: timers
(faults the harness scheduled), SLURM (starts, node deaths, signals, time limits) and each live
incarnation's timeline. Between two events nothing changes, so the ledger charges each interval
to one cause: the running incarnation's category (startup, load, step, save, eval, exit, or
detection once a fault stopped its progress), else "queue" while a job of the run is pending,
else "idle" (no job: the controller is deciding, stopped, or cannot reach SLURM). The causes add
up to the wall time by construction; `tests/simulation/test_soak.py` checks that they do.

`sync()` writes the heartbeat file of every node (contract.NodeBeat: its 8 ranks' beats, as their
local rank 0 gathers them) where a rank's beat changed since the last sync (the harness calls it
right before each controller pass), with plain write-and-rename: the contract's atomicity without
48 fsyncs a pass. A node whose local rank 0 died writes no more: its file holds what it last wrote
(every rank of the node then looks dead); a dead peer's entry stays frozen in a file that moves. Each job's launcher record (allocation.json, with how its
launch ended) is written as orchestrator/slurm/launcher writes it: the controller learns the culprit of
a crash from there, as on a real cluster.
"""

from __future__ import annotations

import heapq
import math
import operator
import os
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator.contract import (
    KILL_REQUEST,
    Allocation,
    Heartbeat,
    NodeBeat,
    RunPaths,
    checkpoints_dir,
    write_allocation,
    write_node_beat,
)
from orchestrator.contract.interval import bounded_interval, interval_directive_path, read_interval_directive
from orchestrator.contract.requests import read_accepted
from orchestrator.controller.probing import FS_SECONDS
from orchestrator.slurm.base import JobState

from . import checkpoints as sim_ckpt
from .clock import VirtualClock
from .incarnation import Incarnation
from .launcher import SimLauncher
from .slurm import SimJob, SimSlurm
from .timings import Timings

# An `srun --overlap` step of one task inside a running job: its launch and exit (Slurm 22.05 on
# the local cluster: under a second; an assumption at scale).
PROBE_STEP_SECONDS = 1.0


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
    ):
        self.paths = RunPaths.of(run_dir)
        self.ckpt_dir = checkpoints_dir(self.paths.root, cfg.checkpoint.dir)
        self.cfg, self.timings, self.clock = cfg, timings, clock
        self.rng = random.Random(seed)
        self.world_size, self.gpus_per_node = cfg.world_size, cfg.cluster.gpus_per_node
        self.keep_last = cfg.checkpoint.keep_last
        # The job holds cluster.nodes + cluster.spare_nodes (the in-allocation spares, --no-kill);
        # the pool has `spare_nodes` more beside them.
        held = cfg.cluster.nodes + cfg.cluster.spare_nodes
        pool = [f"node{i:03d}" for i in range(1, held + spare_nodes + 1)]
        self.slurm = SimSlurm(
            clock,
            pool,
            nodes_per_job=held,
            no_kill=cfg.cluster.spare_nodes > 0,
            repair_seconds=timings.repair_seconds,
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
        self.slurm.on_node_lost = self._node_lost
        self.slurm.on_node_down = lambda node, t: self.note("node_down", t, node=node)
        self.slurm.on_probe = self._probe
        self.skew: dict[str, float] = {}
        self.step_tail: tuple[random.Random, float] | None = None  # (rng, sigma): lognormal step noise
        self.slowness: dict[str, float] = {}  # node -> factor of its ranks' compute time (a straggler)
        self.launchers: dict[str, SimLauncher] = {}
        self.live: dict[str, Incarnation] = {}
        self.incarnations: list[Incarnation] = []
        self.stall_until = -math.inf
        self.node_stalls: dict[str, float] = {}  # node -> until when its writes block (it computes on)
        self.writes_fail = False  # a full disk (when it cannot be made real)
        self.now = 0.0
        self._saved_by: dict[int, str] = {}
        self._interval_key: tuple | None = None
        self._interval_seconds = timings.save_interval_seconds
        self.ledger: dict[str, float] = defaultdict(float)
        self.steps: list[tuple[int, float, str, float]] = []  # (index, seconds, job id, end time)
        self.notes: list[tuple[float, str, dict[str, Any]]] = []  # what happened, for pass timing
        self._timers: list[tuple[float, int, Any]] = []
        self._timer_seq = 0
        self.watchers: list[Any] = []  # (t, note, fields) -> True once it has fired (then dropped)
        self._written: dict[str, list[Heartbeat]] = {}  # node -> the beats its file holds
        self._node_keys: dict[str, tuple] = {}  # node -> what its file's beats were built from
        self._ckpt_usage: tuple[tuple, int] | None = None  # (directory signature, bytes used)
        self._ckpt_saves = 0
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
        self.note("job_start", t, job_id=job.job_id, nodes=list(job.nodes), restart_count=job.restart_count)
        self.launchers[job.job_id] = SimLauncher(self, job, t)

    def start_incarnation(
        self, job: SimJob, t: float, nodes: list[str], launch: int, standby: bool = False
    ) -> None:
        """The launcher starts launch `launch` of the job on `nodes` (srun, or its warm standby)."""
        inc = Incarnation(self, job, t, nodes, launch, standby)
        self.live[job.job_id] = inc
        self.incarnations.append(inc)

    def _node_lost(self, job: SimJob, node: str, t: float) -> None:
        if launcher := self.launchers.get(job.job_id):
            launcher.node_lost(t, node)

    def after_pass(self) -> None:
        """A controller pass ended: each job's launcher looks for its decision."""
        for launcher in list(self.launchers.values()):
            if not launcher.ended:
                launcher.after_pass(self.now)

    def _job_stopped(self, job: SimJob, t: float, why: str) -> None:
        if launcher := self.launchers.get(job.job_id):
            launcher.gone = True  # SLURM ended the job: its launcher dies with it (its record stays)
        inc = self.live.pop(job.job_id, None)
        if inc is not None and inc.gone_at is None:
            inc.end(t)
            self._sync_incarnation(inc, t)
        self.note("job_stop", t, job_id=job.job_id, why=why)

    def _signal(self, job: SimJob, t: float) -> None:
        if inc := self.live.get(job.job_id):
            inc.signal_budget(t)

    def processes_exited(self, inc: Incarnation, t: float, code: int, srun_stderr: str = "") -> None:
        """srun of this launch returned: its launcher records how (contract.job_end parses srun's
        report once), then ends the job or waits for the controller's decision (launcher.py)."""
        if inc.gone_at is not None:
            return
        inc.end(t)
        self._sync_incarnation(inc, t)
        self.live.pop(inc.job_id, None)
        self.launchers[inc.job_id].launch_ended(t, code, srun_stderr)

    # -- what the trainer asks of the world ---------------------------------------------------------
    def record_launch(self, job_id: str, record: Allocation) -> None:
        try:
            self.paths.job_dir(job_id).mkdir(mode=0o700, parents=True, exist_ok=True)
            write_allocation(self.paths.allocation(job_id), record)
        except OSError:  # a full disk: the launcher logs it; the controller goes by SLURM's word
            pass

    def kill_requested(self) -> bool:
        """Only a request the controller accepted (accepted/kill), never control/ directly."""
        return read_accepted(self.paths, KILL_REQUEST) is not None

    def choose_resume(self, job_id: str) -> int | None:
        return sim_ckpt.choose_resume(self.ckpt_dir, job_id, self.clock.to_wall(self.now))

    def saved_by(self, step: int) -> str | None:
        """The job whose save made the checkpoint of `step` (its nodes hold local copies of it)."""
        return self._saved_by.get(step)

    def save_interval_seconds(self) -> float:
        """The trainer's interval: the config's, or the controller's applied directive within the
        config's bounds (read again only when the file changed)."""
        ck = self.cfg.checkpoint
        if ck.adaptive_interval != "apply":
            return self.timings.save_interval_seconds
        try:
            info = os.stat(interval_directive_path(self.paths))
            key: tuple | None = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            key = None
        if key != self._interval_key:
            directive = read_interval_directive(self.paths) if key is not None else None
            self._interval_key = key
            self._interval_seconds = (
                bounded_interval(directive.interval_hours, ck.min_interval_hours, ck.max_interval_hours) * 3600
                if directive is not None
                else self.timings.save_interval_seconds
            )
        return self._interval_seconds

    def save_checkpoint(self, step: int, node: str, t: float, job_id: str) -> None:
        wall = self.clock.to_wall(t) + self.skew.get(node, 0.0)
        self._ckpt_saves += 1
        try:
            if self.writes_fail:
                raise OSError(28, "No space left on device")
            sim_ckpt.save(
                self.ckpt_dir,
                step,
                total_bytes=self.timings.checkpoint_bytes,
                shards=self.cfg.cluster.nodes,
                saved_at_wall=wall,
                job_id=job_id,
                world_size=self.world_size,
                keep_last=self.keep_last,
            )
            self._saved_by[step] = job_id
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
        written, per_node = 0, self.gpus_per_node
        for index, node in enumerate(inc.nodes):
            if t < self.node_stalls.get(node, -math.inf):
                continue  # its gatherer's write blocks on the node's stalled storage
            gatherer = index * per_node
            died = inc.dead.get(gatherer, (math.inf,))[0]
            as_of = min(t, died)  # a dead local rank 0 wrote its node's file for the last time then
            # The node's ranks share a beat grid: their beats can only have changed when the
            # node's grid, the trainer's writes or a death in the node moved (incarnation.beat's
            # own cache key); otherwise the file already holds these bytes.
            key = (id(inc), inc.node_key(index, as_of))
            if self._node_keys.get(node) == key:
                continue
            self._node_keys[node] = key
            beats = [inc.beat(rank, as_of) for rank in range(gatherer, gatherer + per_node)]
            beats = [b for b in beats if b is not None]
            last = self._written.get(node)
            if not beats or (
                last is not None and len(last) == len(beats) and all(map(operator.is_, last, beats))
            ):
                continue
            record = NodeBeat(node, inc.job_id, self.world_size, inc.restart_count, inc.launch, beats)
            try:
                write_node_beat(self.paths.heartbeats, record, durable=False)
            except OSError:  # a full disk: the gatherer logs and carries on
                self._node_keys.pop(node, None)
                continue
            self._written[node] = beats
            written += 1
        return written

    # -- faults (the harness calls these at their time) ---------------------------------------------
    def running_incarnation(self) -> Incarnation | None:
        return next(iter(self.live.values()), None)

    def node_of(self, inc: Incarnation, rank: int) -> str:
        return inc.nodes[rank // self.gpus_per_node]

    def crash_rank(self, t: float, rank: int, by_signal: bool, exit_code: int = 1) -> str | None:
        """One rank dies (by a signal, or exiting with `exit_code` after its exit beat); srun
        --kill-on-bad-exit ends the others; the job fails."""
        inc = self.running_incarnation()
        if inc is None:
            return None
        node = self.node_of(inc, rank)
        inc.kill_rank(rank, t, exit_code=None if by_signal else exit_code)
        what = "Killed" if by_signal else f"Exited with exit code {exit_code}"
        report = f"srun: error: {node}: task {rank}: {what}\n"
        code = 137 if by_signal else exit_code

        def srun_returns(when: float) -> None:
            if inc.gone_at is None:
                self.processes_exited(inc, when, code, report)

        self.at(t + 3.0, srun_returns)
        return node

    def abort_all(self, t: float, inc: Incarnation) -> None:
        """NCCL's watchdog aborts every rank of a launch (SIGABRT, no exit beat): srun reports each
        node's tasks as Aborted and exits 128 + 6. Nothing to do if the launch already ended."""
        if inc.gone_at is not None:
            return
        for rank in range(self.world_size):
            inc.kill_rank(rank, t)
        per = self.gpus_per_node
        report = "".join(
            f"srun: error: {node}: tasks {i * per}-{i * per + per - 1}: Aborted (core dumped)\n"
            for i, node in enumerate(inc.nodes)
        )
        self.note("nccl_abort", t, job_id=inc.job_id)

        def srun_returns(when: float) -> None:
            if inc.gone_at is None:
                self.processes_exited(inc, when, 134, report)

        self.at(t + 3.0, srun_returns)

    def lose_node(self, t: float, node: str | None = None, requeue: bool = False) -> str | None:
        inc = self.running_incarnation()
        if inc is None:
            return None
        node = node or inc.nodes[len(inc.nodes) // 2]
        inc.stop_node(inc.nodes.index(node), t)
        self.slurm.fail_node(node, t, requeue=requeue)
        return node

    def freeze_node(self, t: float, node: str) -> str | None:
        """Every process of `node` stops at t (a driver hang, SIGSTOP) while the node itself
        answers: SLURM never notices, a probe finds its ranks stopped (T)."""
        inc = self.running_incarnation()
        if inc is None:
            return None
        inc.stop_node(inc.nodes.index(node), t, frozen=True)
        return node

    def _probe(self, job_id: str, node: str, timeout: float) -> str | None:
        """What the controller's probe step prints on `node` (controller/probe.py's script): a
        line per rank (/proc's state: T stopped, D blocked on storage, S running, gone) and
        whether a stat of the run directory answered, after the time it takes on virtual time:
        PROBE_STEP_SECONDS for the step, FS_SECONDS more when the stat does not answer, the whole
        `timeout` when the node does not answer (lost: None)."""
        inc = self.live.get(job_id)
        if not self.slurm.answers(node):
            self.clock.sleep(timeout)
            return None
        if inc is None or node not in inc.nodes:
            return None  # srun refuses a node outside the job's allocation at once
        stalled = self.now < max(self.stall_until, self.node_stalls.get(node, -math.inf))
        per, index = self.gpus_per_node, inc.nodes.index(node)
        lines = []
        for rank in range(index * per, (index + 1) * per):
            if rank in inc.stopped:
                state = "T"
            elif rank in inc.dead:
                state = "gone"
            elif stalled and rank == index * per:
                state = "D"  # the node's gatherer, its heartbeat write blocked on storage
            else:
                state = "S"
            lines.append(f"rank {rank} {inc.pid(rank)} {state}")
        lines.append("fs stuck" if stalled else "fs ok")
        self.clock.sleep(PROBE_STEP_SECONDS + (FS_SECONDS if stalled else 0.0))
        return "\n".join(lines) + "\n"

    def hang(self, t: float, rank: int | None = None, in_collective: bool = False) -> None:
        """The running job hangs at t: every rank at once (a collective that never completes
        anywhere), or `rank` (in its own work, or in a collective its TP group never completes)
        with its peers blocked behind it (Incarnation.hang_rank; mid-step only, else every rank)."""
        if inc := self.running_incarnation():
            if rank is None or not inc.hang_rank(rank, t, in_collective):
                inc.fault(t)

    def stall_filesystem(self, t: float, seconds: float) -> None:
        self.stall_until = t + seconds

    def stall_node_storage(self, t: float, node: str, seconds: float) -> None:
        """One node's writes to the shared filesystem block (a storage hiccup, a paging storm): its
        heartbeat file stands still while its ranks compute on (their data is read ahead)."""
        self.node_stalls[node] = t + seconds

    def free_bytes(self, capacity: int) -> int:
        """What the checkpoints leave free. Their apparent sizes are summed again only when a
        checkpoint directory changed (its entries' mtimes): the controller asks every pass."""
        return max(0, capacity - self._checkpoint_bytes())

    def _checkpoint_bytes(self) -> int:
        try:
            entries = list(os.scandir(self.ckpt_dir))
        except OSError:
            return 0
        signature = (
            self._ckpt_saves,
            *sorted((e.name, e.stat(follow_symlinks=False).st_mtime_ns) for e in entries),
        )
        if self._ckpt_usage is None or self._ckpt_usage[0] != signature:
            used = sum(p.stat().st_size for p in self.ckpt_dir.rglob("*.pt"))
            self._ckpt_usage = (signature, used)
        return self._ckpt_usage[1]
