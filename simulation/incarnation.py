"""The simulated trainer: one incarnation of a job's 384 ranks, as a timeline of events.

An incarnation is what one `srun` runs: it starts when SLURM starts (or restarts) the job and
ends when the processes end. It follows trainer/loop.py's order on virtual time:
launch (python imports) -> init (rendezvous, model build) -> load (the newest checkpoint that
verifies, not newer than `latest`; damaged ones skipped and reported in checkpoints/damaged.jsonl)
-> steps; after each step: kill switch (save, exit 17), time budget / pre-timeout signal (save,
exit 18), the time-based save, eval every eval_interval steps. Rank 0 writes real checkpoints
(see checkpoints.py).

Heartbeats are computed, not ticked: rank r beats at `started + offset_r + k * heartbeat_seconds`
on its node's clock (skewed), and writes at every progress and phase change, exactly like
orchestrator/contract/client/beat.py (`set_phase` moves progress_time; `progress` sets step_seconds;
durations holds the longest init/checkpoint/eval so far; seq counts writes). Each beat reports the
progress marks made by its instant (marks.py: micro-batches, reduce, optimizer, save and load
chunks, eval micro-batches; the last one's kind; the longest gap between two marks per phase),
as the trainer's beat thread reads its counters. The world writes one file per node when the
controller is about to read them, so any pass spacing sees the bytes a real cluster would have
left on disk at that instant.
Faults: a dead rank freezes its entry; a hang stops the marks (mid-micro-batch, in the reduce
where every rank waits, or in a save whose bytes stop) while beats go on. A hang of one rank in a
step (`hang_rank`) blocks its collective peers the way gloo and NCCL do: every other rank enters a
collective that needs it and waits there (a WAIT mark, orchestrator/contract/client/progress.waited): its own pipeline
replica at its next mark (the TP all-reduce, the stage before and after it, and on through the
pipeline), the other replicas at the step's gradient reduce (their DP peers there wait for it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from orchestrator.contract import ExitCode, Heartbeat, Mark, Phase

from . import marks
from .clock import VirtualClock
from .slurm import SimJob
from .timings import Timings

TIMED = (Phase.INIT, Phase.CHECKPOINT, Phase.EVAL)


class Surroundings(Protocol):
    """What an incarnation needs of its world (world.World): the circle world <-> incarnation is
    cut here, the world imports this module and this module names only what it uses."""

    timings: Timings
    rng: random.Random
    clock: VirtualClock
    world_size: int
    gpus_per_node: int
    skew: dict[str, float]
    slowness: dict[str, float]
    step_tail: tuple[random.Random, float] | None
    stall_until: float
    now: float
    cfg: Any

    def at(self, t: float, action: Any, label: str = "") -> None: ...

    def note(self, what: str, t: float, **fields: object) -> None: ...
    def choose_resume(self, job_id: str) -> int | None: ...
    def log_step(self, index: int, seconds: float, job_id: str, t: float) -> None: ...
    def kill_requested(self) -> bool: ...
    def save_checkpoint(self, step: int, node: str, t: float, job_id: str) -> None: ...
    def saved_by(self, step: int) -> str | None: ...
    def save_interval_seconds(self) -> float: ...
    def processes_exited(self, inc: Incarnation, t: float, code: int) -> None: ...


@dataclass(frozen=True)
class RankState:
    """What a rank's file says between two writes (every live rank's is the same but for its
    identity and beat grid; a dead rank's is frozen)."""

    phase: Phase
    step: int
    progress_time: float
    phase_started: float
    writes: int
    last_write: float
    step_seconds: float | None = None
    durations: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    # Progress marks: the stretch of work under way, and what the finished ones left.
    stretch: marks.Stretch | None = None
    marks_before: int = 0
    unit_before: str = ""
    gaps_before: dict[str, float] = field(default_factory=dict)
    compute: tuple[int, float] | None = None  # (step, base compute seconds) of the last step

    def progress(self, t: float) -> tuple[int, str, dict[str, float]]:
        """(marks done, the last one's unit, the longest gap per phase) at time t."""
        if self.stretch is None:
            return self.marks_before, self.unit_before, self.gaps_before
        count, unit, _ = self.stretch.at(t)
        gaps = dict(self.gaps_before)
        gap = self.stretch.longest_gap(t)
        if gap > gaps.get(self.stretch.phase, 0.0):
            gaps[self.stretch.phase] = round(gap, 3)
        return self.marks_before + count, unit or self.unit_before, gaps


class Incarnation:
    def __init__(
        self, world: Surroundings, job: SimJob, t: float, nodes: list[str], launch: int = 0, standby: bool = False
    ):
        self.world, self.job = world, job
        self.job_id, self.restart_count, self.nodes = job.job_id, job.restart_count, list(nodes)
        self.launch = launch  # RUNCTL_LAUNCH: a relaunch on spares inside the job is launch 1, 2, ...
        self.standby = standby  # started from the launcher's warm standby (imports, model built)
        timings = world.timings
        paths = timings.paths
        self.started = t + (paths.import_seconds(standby) if paths is not None else timings.launch_seconds)
        self.load_source = "shared"
        self.trained_at: float | None = None  # its first step began (the launcher's standby starts)
        self.phase, self.step = Phase.INIT, 0
        self.phase_started = self.progress_time = self.last_write = self.started
        self.writes = 1
        self.step_seconds: float | None = None
        self.durations: dict[str, float] = {}
        # A node's file is written on its local rank 0's beat, with every rank's state at that moment.
        nodes = [world.rng.uniform(0, timings.heartbeat_seconds) for _ in range(len(self.nodes))]
        self.offsets = [nodes[rank // world.gpus_per_node] for rank in range(world.world_size)]
        self.dead: dict[int, tuple[float, RankState]] = {}  # rank -> (time, frozen state)
        self.stopped: set[int] = set()  # dead ranks whose processes stay, stopped (a frozen node)
        self.faulted_at: float | None = None  # progress stopped for good (hang, dead peer)
        self.gone_at: float | None = None
        self.exit_code: int | None = None
        self.resume_step: int | None = None
        self.load_at = math.inf
        self.last_save = self.started
        self.stop_after_step: int | None = None  # exit code to leave with at the next step end
        self.next_save_factor = 1.0
        self.slowed = False  # the step under way was made slower by slow_steps
        self.slow_steps: list[float] = []  # factors of the next steps' durations (honest slowness)
        self.forced_eval_seconds: float | None = None  # an eval of this length after the next step
        self.hang_at_wait = False  # the next step's reduce never completes (every rank waits in it)
        self.blocked: dict[int, marks.Stretch] = {}  # rank -> its marks, blocked in a collective (hang_rank)
        self.all_waiting_at: float | None = None  # hang_rank: when the last rank made its last mark
        # Per-rank compute (straggler detection): each rank reports its own compute time of the last
        # step, its node's slowness times the step's base; the step itself waits for the slowest.
        tp = world.cfg.parallel.tp
        dp = world.world_size // (tp * world.cfg.parallel.pp)
        self.groups = [f"pp{r // (dp * tp)}.tp{r % tp}" for r in range(world.world_size)]  # groups.py's order
        self.factors = [world.slowness.get(n, 1.0) for n in self.nodes]
        self.step_base = 0.0
        self.compute: tuple[int, float] | None = None  # (step, base compute seconds) of the last step
        self.writing_until: float | None = None  # an async save's background write ends then
        self.stretch: marks.Stretch | None = None
        self.marks_before, self.unit_before = 0, ""
        self.gaps_before: dict[str, float] = {}
        self.next_at, self._next = self.started, self._launch
        self._snapshot: RankState | None = None
        self._beats: dict[int, tuple[tuple, Heartbeat]] = {}  # rank -> (what it was built from, beat)

    # -- the timeline --------------------------------------------------------------------------
    def run_due(self, t: float) -> None:
        while self.gone_at is None and self.next_at <= t:
            action = self._next
            when = self.next_at
            self.next_at, self._next = math.inf, None
            action(when)

    def _at(self, t: float, action) -> None:
        self.next_at, self._next = t, action

    def _set_phase(self, phase: Phase, t: float) -> None:
        if self.phase in TIMED and phase != self.phase:
            key = self.phase.value
            self.durations[key] = max(self.durations.get(key, 0.0), t - self.phase_started)
        self.phase, self.phase_started, self.progress_time = phase, t, t
        self._wrote(t)

    def _wrote(self, t: float) -> None:
        self.writes += 1
        self.last_write = t

    def _launch(self, t: float) -> None:
        world, timings = self.world, self.world.timings
        self.resume_step = world.choose_resume(self.job_id)
        self.step = self.resume_step or 0
        load, init = timings.load_seconds, timings.init_seconds
        if timings.paths is not None:
            paths = timings.paths
            init = paths.start_seconds(self.standby) - paths.import_seconds(self.standby)
            if self.launch > 0 and self.resume_step:  # inside the allocation: the nearest copy
                load, source = paths.in_allocation_load(world.saved_by(self.resume_step) == self.job_id)
                self.load_source = source.value
        self.load_seconds = timings.noisy(world.rng, load) if self.resume_step else 0.0
        self.load_at = t + timings.noisy(world.rng, init)
        if self.resume_step:
            self._begin(
                marks.chunks(
                    Phase.INIT, t, self.load_seconds, Mark.LOAD_BYTES, marks.LOAD_CHUNKS, self.load_at - t
                )
            )
        else:
            self._begin(marks.opening(Phase.INIT, t, self.load_at))
        self.world.note(
            "launch", t, job_id=self.job_id, resume_step=self.resume_step, standby=self.standby,
            load_source=self.load_source if self.resume_step else None,
        )  # fmt: skip
        self._at(self.load_at, self._load)

    def _load(self, t: float) -> None:
        """Still the init phase for the controller; a separate event so that the ledger can tell
        startup from checkpoint load."""
        self._at(t + self.load_seconds, self._init_done)

    def _init_done(self, t: float) -> None:
        self._set_phase(Phase.STEP, t)
        self.last_save = t
        self.trained_at = t
        self.world.note("training", t, job_id=self.job_id, step=self.step)
        self._next_step(t)

    def _next_step(self, t: float) -> None:
        seconds = self.world.timings.noisy(self.world.rng, self.world.timings.step_seconds)
        if self.world.step_tail is not None:  # heavy-tailed step times (soak.py: lognormal)
            rng, sigma = self.world.step_tail
            seconds *= rng.lognormvariate(0.0, sigma)
        self.slowed = bool(self.slow_steps)
        if self.slow_steps:
            seconds *= self.slow_steps.pop(0)
        self.step_base = seconds
        seconds *= max(self.factors)  # every collective waits for the slowest node's ranks
        self._begin(marks.step(t, seconds, first_of_phase=self.phase_started == t))
        self._at(t + seconds, self._step_done)
        if self.hang_at_wait:
            self.hang_at_wait = False
            self._at(self.stretch.wait_time(), self._hang_in_reduce)

    def hang_in_next_reduce(self, t: float) -> None:
        """The next gradient reduce to begin from t never completes (this step's, if not yet begun)."""
        stretch = self.stretch
        wait = stretch.wait_time() if stretch is not None and self._next == self._step_done else None
        if wait is not None and wait >= t:
            self._at(wait, self._hang_in_reduce)
        else:
            self.hang_at_wait = True

    def _hang_in_reduce(self, t: float) -> None:
        self.fault(t)
        self.world.note("hung_in_reduce", t, job_id=self.job_id, step=self.step)

    def _begin(self, stretch: marks.Stretch) -> None:
        """A new stretch of work: the finished one's marks and gaps become history."""
        done = self.stretch
        if done is not None:
            count, unit, _ = done.at(math.inf)
            self.marks_before += count
            self.unit_before = unit or self.unit_before
            gap = done.longest_gap(math.inf)
            if gap > self.gaps_before.get(done.phase, 0.0):
                self.gaps_before = {**self.gaps_before, done.phase: round(gap, 3)}
        self.stretch, self._snapshot = stretch, None

    def _step_done(self, t: float) -> None:
        if t < self.world.stall_until:  # the progress write blocks on the stalled filesystem
            self._at(self.world.stall_until, self._step_done)
            return
        self.step_seconds = t - self.progress_time
        if self.slowed:  # a pass sees the slow step's end (the spacing argument: harness.py)
            self.slowed = False
            self.world.note("slow_step_done", t, job_id=self.job_id, seconds=self.step_seconds)
        self.world.log_step(self.step + 1, t - self.progress_time, self.job_id, t)
        self.step += 1
        self.compute = (self.step, self.step_base)
        self.progress_time = t
        self._wrote(t)
        timings = self.world.timings
        if self.forced_eval_seconds is not None or self.step % timings.eval_every_steps == 0:
            seconds = self.forced_eval_seconds or timings.noisy(self.world.rng, timings.eval_seconds)
            self.forced_eval_seconds = None
            self._set_phase(Phase.EVAL, t)
            self.world.note("eval_start", t, job_id=self.job_id, seconds=seconds)
            iterations = max(1, self.world.cfg.data.eval_iters) * marks.MICRO_BATCHES
            self._begin(marks.chunks(Phase.EVAL, t, seconds, Mark.EVAL, iterations))
            self._at(t + seconds, self._eval_done)
        else:
            self._save_or_go_on(t)

    def _save_or_go_on(self, t: float) -> None:
        """After a step and its eval, as trainer/loop.py: the ranks agree on a kill, the time budget
        or a save due, then save (and stop) or train on."""
        if self.world.kill_requested():
            self.stop_after_step = ExitCode.KILLED
        elif t - self.started >= self.world.timings.exit_duration_seconds:
            self.stop_after_step = self.stop_after_step or ExitCode.TIME_BUDGET
        if self.stop_after_step is not None or t - self.last_save >= self.world.save_interval_seconds():
            self._start_save(t)
        else:
            self._next_step(t)

    def _start_save(self, t: float) -> None:
        """A save: synchronous, or (checkpoint.async_save) a stall for the host snapshot with the
        write going on in the background (trainer/async_checkpoint.py). A save before exiting waits
        for its write, so it takes as long as a synchronous one."""
        self._set_phase(Phase.CHECKPOINT, t)
        seconds = (
            self.world.timings.noisy(self.world.rng, self.world.timings.save_seconds) * self.next_save_factor
        )
        self.next_save_factor = 1.0
        snapshot = self.world.timings.async_stall_seconds
        if snapshot is None or self.stop_after_step is not None:
            self._begin(marks.chunks(Phase.CHECKPOINT, t, seconds, Mark.SAVE_BYTES, marks.SAVE_CHUNKS))
            self.world.note("save_start", t, job_id=self.job_id, step=self.step)
            self._at(t + seconds, self._save_done)
            return
        stall = self.world.timings.noisy(self.world.rng, snapshot)
        self._begin(marks.chunks(Phase.CHECKPOINT, t, stall, Mark.SAVE_BYTES, marks.SAVE_CHUNKS))
        self.world.note("save_start", t, job_id=self.job_id, step=self.step)
        step = self.step
        self.writing_until = t + stall + seconds
        self.world.at(self.writing_until, lambda when: self._background_write_done(when, step))
        self._at(t + stall, self._snapshot_done)

    def _snapshot_done(self, t: float) -> None:
        self.last_save = t
        self.world.note("snapshot_done", t, job_id=self.job_id, step=self.step)
        self._set_phase(Phase.STEP, t)
        self._next_step(t)

    def _background_write_done(self, t: float, step: int) -> None:
        """Every rank's write is done: rank 0 seals (manifest, then latest). A launch that failed or
        ended meanwhile seals nothing: the previous checkpoint stays the latest."""
        self.writing_until = None
        if self.faulted_at is not None or self.gone_at is not None:
            self.world.note("async_write_lost", t, job_id=self.job_id, step=step)
            return
        self.world.save_checkpoint(step, self.nodes[0], t, self.job_id)
        if self.faulted_at is None:
            self.world.note("save_done", t, job_id=self.job_id, step=step)

    def _save_done(self, t: float) -> None:
        world = self.world
        world.save_checkpoint(self.step, self.nodes[0], t, self.job_id)
        if self.faulted_at is not None:  # the save failed (a full disk): rank 0 died
            return
        self.last_save = t
        world.note("save_done", t, job_id=self.job_id, step=self.step)
        if self.stop_after_step is not None:  # an async write still in flight is waited for
            code = int(self.stop_after_step)
            self._at(max(t, self.writing_until or t), lambda when: self._exit(when, code))
            return
        self._set_phase(Phase.STEP, t)
        self._next_step(t)

    def _eval_done(self, t: float) -> None:
        self.world.note("eval_done", t, job_id=self.job_id)
        self._set_phase(Phase.STEP, t)
        self._save_or_go_on(t)

    def _exit(self, t: float, code: int) -> None:
        self.exit_code = code
        self._set_phase(Phase.EXITING, t)
        self._begin(marks.opening(Phase.EXITING, t))
        self._at(t + 5.0, lambda when: self.world.processes_exited(self, when, code))

    # -- what happens to it ------------------------------------------------------------------------
    def fault(self, t: float) -> None:
        """Progress stops for good (a hang, or peers blocked on a dead rank); beats go on."""
        if self.faulted_at is None:
            self.faulted_at = t
            if self.stretch is not None:
                self.stretch, self._snapshot = self.stretch.cut(t), None
        self.next_at, self._next = math.inf, None

    def hang_rank(self, rank: int, t: float, in_collective: bool = False) -> bool:
        """`rank` stops at t in its own work, or (`in_collective`) in a collective that never
        completes (a link of its TP group fails: the group blocks at its next mark, the rest of its
        replica one mark later). Its peers block as the module docstring says. Only mid-step (False
        elsewhere: nothing done; the caller hangs the whole job)."""
        stretch = self.stretch
        if self.faulted_at is not None or stretch is None or self.phase is not Phase.STEP or not stretch.n:
            return False
        tp = self.world.cfg.parallel.tp
        dp = self.world.world_size // (tp * self.world.cfg.parallel.pp)
        replica, group = (rank // tp) % dp, rank // tp
        first = stretch.next_mark(t)
        later = stretch.next_mark(first) if in_collective else first
        reduce_at = stretch.wait_time()
        for other in range(self.world.world_size):
            if other == rank and not in_collective:
                continue
            if other // tp == group and in_collective:
                at = first
            elif (other // tp) % dp == replica or reduce_at is None or reduce_at <= t:
                at = later
            else:
                at = reduce_at
            self.blocked[other] = stretch.block(at)
        # The last progress any rank makes (a blocked rank's WAIT mark, its last mark before it):
        # no rule can see the hang before then.
        self.all_waiting_at = max(t, *(min(b.blocked, b.end) for b in self.blocked.values()))
        self.fault(t)
        return True

    def stop_node(self, index: int, t: float, frozen: bool = False) -> None:
        """Node `index`'s ranks stop at t without an exit beat: the node is lost (power, a kernel
        panic) or `frozen` (SIGSTOP, a driver hang: its processes stay, stopped). Mid-step their
        peers go on to the next collective that needs them and wait there (hang_rank's model: the
        other replicas compute on until the step's gradient reduce); elsewhere every rank stops."""
        per = self.world.gpus_per_node
        ranks = range(index * per, (index + 1) * per)
        self.hang_rank(ranks[0], t)  # False, nothing done, outside a step: fault() stops them all
        for rank in ranks:
            self.dead.setdefault(rank, (t, self.rank_state(rank)))
        if frozen:
            self.stopped.update(ranks)
        self.fault(t)

    def pid(self, rank: int) -> int:
        """The process id rank r's beats carry (a relaunch's processes are new ones)."""
        return 100000 + rank + 1000 * self.restart_count

    def rank_state(self, rank: int) -> RankState:
        """What rank r's file says now: every live rank's state, its own marks if it is blocked."""
        state = self.snapshot_state()
        blocked = self.blocked.get(rank)
        return state if blocked is None else replace(state, stretch=blocked)

    def kill_rank(self, rank: int, t: float, exit_code: int | None = None) -> None:
        """`exit_code`: a Python exception's, written in the exit beat before the rank dies; None:
        killed by a signal, no exit beat."""
        frozen = self.rank_state(rank)
        if exit_code is not None:
            frozen = replace(frozen, phase=Phase.EXITING, exit_code=exit_code, writes=frozen.writes + 1, last_write=t)
        self.dead.setdefault(rank, (t, frozen))
        self.fault(t)

    def signal_budget(self, t: float) -> None:
        """SLURM's pre-timeout signal: save and exit 18 after the current step."""
        self.stop_after_step = self.stop_after_step or ExitCode.TIME_BUDGET

    def end(self, t: float) -> None:
        self.gone_at = t
        self.next_at, self._next = math.inf, None

    def snapshot_state(self) -> RankState:
        """What every live rank's file says now (cached until the next write)."""
        if self._snapshot is None or self._snapshot.writes != self.writes:
            self._snapshot = RankState(
                phase=self.phase,
                step=self.step,
                progress_time=self.progress_time,
                phase_started=self.phase_started,
                writes=self.writes,
                last_write=self.last_write,
                step_seconds=self.step_seconds,
                durations=dict(self.durations),
                exit_code=self.exit_code,
                stretch=self.stretch,
                marks_before=self.marks_before,
                unit_before=self.unit_before,
                gaps_before=self.gaps_before,
                compute=self.compute,
            )
        return self._snapshot

    def _compute_fields(self, rank: int, state: RankState) -> dict[str, Any]:
        """The rank's compute time of its last step (trainer/compute_time.py: waits excluded)."""
        if state.compute is None:
            return {}
        step, base = state.compute
        factor = self.factors[rank // self.world.gpus_per_node]
        return {
            "compute_seconds": round(base * factor, 3),
            "compute_step": step,
            "compute_group": self.groups[rank],
        }

    def category(self) -> str:
        """What the cluster's time is spent on right now (the soak's accounting)."""
        if self.faulted_at is not None:
            return "detection"
        if self.phase is Phase.INIT:
            return "load" if self.world.now >= self.load_at else "startup"
        return {Phase.STEP: "step", Phase.CHECKPOINT: "save", Phase.EVAL: "eval"}.get(self.phase, "exit")

    # -- heartbeats ----------------------------------------------------------------------------------
    def node_key(self, index: int, t: float) -> tuple:
        """What the beats of node `index`'s ranks at time t are built from (its ranks share one
        beat grid): equal keys, equal beats (`beat`'s own cache key, for the whole node)."""
        end = min(t, self.gone_at if self.gone_at is not None else math.inf)
        per_node = self.world.gpus_per_node
        first = self.started + self.offsets[index * per_node]
        grid = 0 if end < first else int((end - first) // self.world.timings.heartbeat_seconds) + 1
        dead = tuple(
            (r, self.dead[r][0]) for r in range(index * per_node, (index + 1) * per_node) if r in self.dead
        )
        return (self.writes, self.phase, grid, end >= self.started, dead)

    def beat(self, rank: int, t: float) -> Heartbeat | None:
        """Rank r's heartbeat as its file holds it at virtual time t (None: the process has not
        started): the contract's type, stamped with the node's skewed clock. The same object
        while nothing in it changed (the world writes a file only for a new object)."""
        end = min(t, self.gone_at if self.gone_at is not None else math.inf)
        state = None
        if rank in self.dead:
            died, state = self.dead[rank]
            end = min(end, died)
        if end < self.started:
            return None
        state = state or self.rank_state(rank)
        hb = self.world.timings.heartbeat_seconds
        first = self.started + self.offsets[rank]
        grid_beats = 0 if end < first else int((end - first) // hb) + 1
        last_grid = first + (grid_beats - 1) * hb if grid_beats else self.started
        key = (state.writes, state.phase, grid_beats)
        cached = self._beats.get(rank)
        if cached is not None and cached[0] == key:
            return cached[1]
        node = self.nodes[rank // self.world.gpus_per_node]
        skew = self.world.skew.get(node, 0.0)
        wall = self.world.clock.to_wall
        as_of = max(last_grid, state.last_write)  # the beat thread read the counters then
        count, unit, gaps = state.progress(as_of)
        beat = Heartbeat(
            rank=rank,
            world_size=self.world.world_size,
            host=node,
            job_id=self.job_id,
            pid=self.pid(rank),
            step=state.step,
            phase=state.phase,
            beat_time=wall(max(last_grid, state.last_write)) + skew,
            progress_time=wall(state.progress_time) + skew,
            phase_started=wall(state.phase_started) + skew,
            restart_count=self.restart_count,
            process_started=wall(self.started) + skew,
            seq=grid_beats + state.writes,
            step_seconds=state.step_seconds,
            durations=dict(state.durations),
            exit_code=state.exit_code,
            progress_count=count,
            progress_unit=unit,
            mark_gaps=gaps,
            launch=self.launch,
            **self._compute_fields(rank, state),
        )
        self._beats[rank] = (key, beat)
        return beat
