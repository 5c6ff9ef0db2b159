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
trainer/heartbeat.py (`set_phase` moves progress_time; `progress` sets extra.step_seconds;
extra.durations holds the longest init/checkpoint/eval so far; seq counts writes). The world
writes the files when the controller is about to read them, so any pass spacing sees the bytes a
real cluster would have left on disk at that instant.
Faults: a dead rank freezes its file; a hang stops progress while beats go on.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from orchestrator.protocol import CHECKPOINT_NAME_FORMAT, LATEST_NAME, ExitCode, Phase, append_jsonl

from . import checkpoints as sim_ckpt

if TYPE_CHECKING:
    from .slurm import SimJob
    from .world import World

TIMED = (Phase.INIT.value, Phase.CHECKPOINT.value, Phase.EVAL.value)


class Incarnation:
    def __init__(self, world: World, job: SimJob, t: float):
        self.world, self.job = world, job
        self.job_id, self.restart_count, self.nodes = job.job_id, job.restart_count, list(job.nodes)
        timings = world.timings
        self.started = t + timings.launch_seconds
        self.phase, self.step = Phase.INIT.value, 0
        self.phase_started = self.progress_time = self.last_write = self.started
        self.writes = 1
        self.extra: dict[str, Any] = {}
        self.offsets = [world.rng.uniform(0, timings.heartbeat_seconds) for _ in range(world.world_size)]
        self.dead: dict[int, tuple[float, dict[str, Any]]] = {}  # rank -> (time, frozen state)
        self.faulted_at: float | None = None  # progress stopped for good (hang, dead peer)
        self.gone_at: float | None = None
        self.exit_code: int | None = None
        self.resume_step: int | None = None
        self.last_save = self.started
        self.stop_after_step: int | None = None  # exit code to leave with at the next step end
        self.hang_in_next_save = False
        self.next_save_factor = 1.0
        self.next_at, self._next = self.started, self._launch
        self._snapshot: dict[str, Any] | None = None

    # -- the timeline --------------------------------------------------------------------------
    def run_due(self, t: float) -> None:
        while self.gone_at is None and self.next_at <= t:
            when, action = self.next_at, self._next
            self.next_at, self._next = math.inf, None
            action(when)

    def _at(self, t: float, action) -> None:
        self.next_at, self._next = t, action

    def _set_phase(self, phase: str, t: float) -> None:
        if self.phase in TIMED and phase != self.phase:
            durations = self.extra.setdefault("durations", {})
            durations[self.phase] = max(durations.get(self.phase, 0.0), t - self.phase_started)
        self.phase, self.phase_started, self.progress_time = phase, t, t
        self._wrote(t)

    def _wrote(self, t: float) -> None:
        self.writes += 1
        self.last_write = t

    def _launch(self, t: float) -> None:
        world, timings = self.world, self.world.timings
        self.resume_step = world.choose_resume(self.job_id)
        self.step = self.resume_step or 0
        self.load_seconds = timings.noisy(world.rng, timings.load_seconds) if self.resume_step else 0.0
        self.load_at = t + timings.noisy(world.rng, timings.init_seconds)
        self.world.note("launch", t, job_id=self.job_id, resume_step=self.resume_step)
        self._at(self.load_at, self._load)

    def _load(self, t: float) -> None:
        """Still the init phase for the controller; a separate event so that the ledger can tell
        startup from checkpoint load."""
        self._at(t + self.load_seconds, self._init_done)

    def _init_done(self, t: float) -> None:
        self._set_phase(Phase.STEP.value, t)
        self.last_save = t
        self.world.note("training", t, job_id=self.job_id, step=self.step)
        self._next_step(t)

    def _next_step(self, t: float) -> None:
        self._at(
            t + self.world.timings.noisy(self.world.rng, self.world.timings.step_seconds), self._step_done
        )

    def _step_done(self, t: float) -> None:
        if t < self.world.stall_until:  # the progress write blocks on the stalled filesystem
            self._at(self.world.stall_until, self._step_done)
            return
        self.extra["step_seconds"] = t - self.progress_time
        self.world.log_step(self.step + 1, t - self.progress_time, self.job_id, t)
        self.step += 1
        self.progress_time = t
        self._wrote(t)
        timings = self.world.timings
        if self.world.kill_requested():
            self.stop_after_step = ExitCode.KILLED
        elif t - self.started >= timings.exit_duration_seconds:
            self.stop_after_step = self.stop_after_step or ExitCode.TIME_BUDGET
        if self.stop_after_step is not None or t - self.last_save >= timings.save_interval_seconds:
            self._start_save(t)
        elif self.step % timings.eval_every_steps == 0:
            self._set_phase(Phase.EVAL.value, t)
            self._at(t + timings.noisy(self.world.rng, timings.eval_seconds), self._eval_done)
        else:
            self._next_step(t)

    def _start_save(self, t: float) -> None:
        self._set_phase(Phase.CHECKPOINT.value, t)
        self.world.note("save_start", t, job_id=self.job_id, step=self.step)
        if self.hang_in_next_save:
            self.fault(t)
            return
        seconds = (
            self.world.timings.noisy(self.world.rng, self.world.timings.save_seconds) * self.next_save_factor
        )
        self.next_save_factor = 1.0
        self._at(t + seconds, self._save_done)

    def _save_done(self, t: float) -> None:
        world = self.world
        world.save_checkpoint(self.step, self.nodes[0], t)
        if self.faulted_at is not None:  # the save failed (a full disk): rank 0 died
            return
        self.last_save = t
        world.note("save_done", t, job_id=self.job_id, step=self.step)
        if self.stop_after_step is not None:
            self._exit(t, int(self.stop_after_step))
            return
        self._set_phase(Phase.STEP.value, t)
        self._next_step(t)

    def _eval_done(self, t: float) -> None:
        self._set_phase(Phase.STEP.value, t)
        self._next_step(t)

    def _exit(self, t: float, code: int) -> None:
        self.extra["exit_code"] = code
        self._set_phase(Phase.EXITING.value, t)
        self.exit_code = code
        self._at(t + 5.0, lambda when: self.world.processes_exited(self, when, code))

    # -- what happens to it ------------------------------------------------------------------------
    def fault(self, t: float) -> None:
        """Progress stops for good (a hang, or peers blocked on a dead rank); beats go on."""
        if self.faulted_at is None:
            self.faulted_at = t
        self.next_at, self._next = math.inf, None

    def kill_rank(self, rank: int, t: float, exit_beat: bool = False) -> None:
        frozen = dict(self.snapshot_state())
        if exit_beat:  # a Python exception: the trainer writes its exit beat before dying
            extra = {**frozen["extra"], "exit_code": 1}
            frozen.update(
                phase=Phase.EXITING.value, extra=extra, extra_json=json.dumps(extra, sort_keys=True)
            )
            frozen["writes"] += 1
            frozen["last_write"] = t
        self.dead.setdefault(rank, (t, frozen))
        self.fault(t)

    def signal_budget(self, t: float) -> None:
        """SLURM's pre-timeout signal: save and exit 18 after the current step."""
        self.stop_after_step = self.stop_after_step or ExitCode.TIME_BUDGET

    def end(self, t: float) -> None:
        self.gone_at = t
        self.next_at, self._next = math.inf, None

    def snapshot_state(self) -> dict[str, Any]:
        """What every live rank's file says now (cached until the next write)."""
        if self._snapshot is None or self._snapshot["writes"] != self.writes:
            self._snapshot = {
                "phase": self.phase,
                "step": self.step,
                "progress_time": self.progress_time,
                "phase_started": self.phase_started,
                "extra": dict(self.extra),
                "writes": self.writes,
                "last_write": self.last_write,
                "extra_json": json.dumps(self.extra, sort_keys=True),
            }
        return self._snapshot

    def category(self) -> str:
        """What the cluster's time is spent on right now (the soak's accounting)."""
        if self.faulted_at is not None:
            return "detection"
        if self.phase == Phase.INIT.value:
            return "load" if self.world.now >= getattr(self, "load_at", math.inf) else "startup"
        return {"step": "step", "checkpoint": "save", "eval": "eval"}.get(self.phase, "exit")

    # -- heartbeats ----------------------------------------------------------------------------------
    def beat(self, rank: int, t: float) -> str | None:
        """Rank r's heartbeat file (JSON text, the fields of protocol.Heartbeat) as it is at virtual
        time t; None: the process has not started. Built from a per-state template: 384 beats a
        pass cost a few ms."""
        end = min(t, self.gone_at if self.gone_at is not None else math.inf)
        state = None
        if rank in self.dead:
            died, state = self.dead[rank]
            end = min(end, died)
        if end < self.started:
            return None
        state = state or self.snapshot_state()
        hb = self.world.timings.heartbeat_seconds
        first = self.started + self.offsets[rank]
        grid_beats = 0 if end < first else int((end - first) // hb) + 1
        last_grid = first + (grid_beats - 1) * hb if grid_beats else self.started
        node = self.nodes[rank // self.world.gpus_per_node]
        skew = self.world.skew.get(node, 0.0)
        wall = self.world.clock.to_wall
        return (
            f'{{"rank": {rank}, "world_size": {self.world.world_size}, "host": "{node}", '
            f'"job_id": "{self.job_id}", "pid": {100000 + rank + 1000 * self.restart_count}, '
            f'"step": {state["step"]}, "phase": "{state["phase"]}", '
            f'"beat_time": {wall(max(last_grid, state["last_write"])) + skew!r}, '
            f'"progress_time": {wall(state["progress_time"]) + skew!r}, '
            f'"phase_started": {wall(state["phase_started"]) + skew!r}, '
            f'"extra": {state["extra_json"]}, "restart_count": {self.restart_count}, '
            f'"process_started": {wall(self.started) + skew!r}, "seq": {grid_beats + state["writes"]}}}'
        )


def choose_resume(ckpt_dir, job_id: str, now_wall: float) -> int | None:
    """trainer/checkpoint.find_resume_checkpoint: the newest complete checkpoint not newer than
    `latest` that verifies; a damaged one is reported in damaged.jsonl and skipped, never deleted."""
    try:
        latest = (ckpt_dir / LATEST_NAME).read_text().strip()
    except OSError:
        latest = ""
    latest_step = int(latest.split("_")[1]) if latest.startswith("step_") else None
    known = sim_ckpt.damaged(ckpt_dir)
    for step in reversed(sim_ckpt.complete_steps(ckpt_dir)):
        if latest_step is not None and step > latest_step:
            continue
        name = CHECKPOINT_NAME_FORMAT.format(step=step)
        problems = sim_ckpt.verify(ckpt_dir / name)
        if not problems:
            return step
        if name not in known:
            append_jsonl(
                ckpt_dir / sim_ckpt.DAMAGED_LOG,
                {"checkpoint": name, "problems": problems[:20], "time": now_wall, "job_id": job_id},
            )
    return None
