"""One rank of any training loop under the controller: the calls a loop makes (the package
docstring lists them; docs/own_training_loop.md says what each buys).

Built by `start()`; every file it writes follows the run-directory contract through the
package's modules (beat, stop, checkpoints, resume_point, exits): our trainer uses the same ones.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from orchestrator.contract import (
    CHECKPOINT_NAME_FORMAT,
    CHECKPOINT_STATE_NAME,
    ExitCode,
    Manifest,
    Phase,
    RunPaths,
    StepMetrics,
    atomic_write_text,
)
from orchestrator.contract.metrics import append_metrics

from . import exits
from .beat import HeartbeatWriter
from .checkpoints import hash_files, list_files, seal_checkpoint
from .progress import waiting
from .ranks import DistEnv, dist_env_from
from .resume_point import ResumePoint, find_resume_point
from .settings import RunSettings, read_settings
from .stop import Agreement, AllReduceMax, Controls

RUN_DIR_VARIABLE = "RUNCTL_RUN_DIR"  # the launcher exports it to every rank it starts


class Supervision:
    """This rank's side of the contract. Not thread-safe but for the beat, which has its own thread."""

    def __init__(
        self,
        paths: RunPaths,
        ranks: DistEnv,
        settings: RunSettings,
        all_reduce_max: AllReduceMax | None,
        job_start_time: float,
    ):
        self.paths, self.ranks, self.settings = paths, ranks, settings
        self.rank, self.world_size, self.job_id = ranks.rank, ranks.world_size, ranks.job_id
        self._all_reduce_max = all_reduce_max
        self.beat = HeartbeatWriter(
            paths,
            ranks.rank,
            ranks.world_size,
            ranks.job_id,
            settings.heartbeat_seconds,
            local_rank=ranks.local_rank,
            local_world_size=ranks.local_world_size,
        )
        self.controls = Controls(
            paths,
            ranks.rank,
            job_start_time,
            settings.exit_duration_minutes,
            settings.checkpoint_interval_hours,
            settings.pre_timeout_signal,
        )
        self.resumed: ResumePoint | None = None
        self.stop_decision = Agreement()
        self._consumed_samples = 0
        self._last_batch = 0
        self._stepping = False

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(f"[runctl client] {message}", file=sys.stderr, flush=True)

    # -- resume ------------------------------------------------------------------------------
    def resume_point(self) -> ResumePoint:
        """The checkpoint to load (or none), the data skips and the LR scale to honour. Call once,
        before the first step; the controller is told which step this job resumed from and which
        rollback directive it applied."""
        loading = time.time()
        point = find_resume_point(self.paths, self.job_id, self.rank, self.log)
        self.resumed = point
        self._consumed_samples = point.consumed_samples
        self.beat.note(resumed_from=point.step, checkpoint_load_seconds=time.time() - loading)
        if point.applied_now is not None:
            self.beat.note(rollback_applied=point.applied_now.id)
        self.log(point.describe())
        return point

    # -- steps -------------------------------------------------------------------------------
    def step_done(
        self,
        step: int,
        consumed_samples: int,
        loss: float | None = None,
        *,
        global_batch: int | None = None,
        lr: float | None = None,
        grad_norm: float | None = None,
        **reported,
    ) -> None:
        """Optimizer step `step` (1-based, the count of steps taken) is done; `consumed_samples`:
        the data position after it (one past the last sample read, skipped ones included).
        Moves the progress the controller judges hangs by; rank 0 adds a line to metrics.jsonl
        (the training-health rules read the losses). `reported`: other Heartbeat fields."""
        if not self._stepping:
            self.beat.set_phase(Phase.STEP, step)
            self._stepping = True
        if global_batch is None:
            global_batch = max(0, consumed_samples - self._consumed_samples)
        self._consumed_samples, self._last_batch = consumed_samples, global_batch
        self.beat.progress(step, loss=loss, consumed_samples=consumed_samples, **reported)
        if self.rank == 0:
            append_metrics(
                self.paths.metrics,
                StepMetrics(
                    step=step,
                    time=time.time(),
                    loss=loss,
                    lr=lr,
                    grad_norm=grad_norm,
                    global_batch=global_batch,
                    consumed_samples=consumed_samples,
                    step_seconds=self.beat.step_seconds,
                    job_id=self.job_id,
                ),
            )

    @contextmanager
    def phase(self, phase: Phase, step: int | None = None) -> Iterator[None]:
        """A stretch of work timed as its own phase (EVAL, CHECKPOINT): a long save is not a hang."""
        self.beat.set_phase(phase, step)
        try:
            yield
        finally:
            self.beat.set_phase(Phase.STEP if self._stepping else Phase.INIT, step)

    # -- stopping ----------------------------------------------------------------------------
    def should_stop(self, all_reduce_max: AllReduceMax | None = None) -> bool:
        """Collective (every rank, the same step): the kill switch, the time budget or SLURM's
        pre-timeout signal, seen by any rank. True: save (checkpoint_saved), then
        exit(stop_code()). The all-reduce is the callable given here or to start(), else
        torch.distributed's."""
        with waiting():  # every rank's flags: the time here is the slowest peer's
            self.stop_decision = self.controls.agree(all_reduce_max=all_reduce_max or self._all_reduce_max)
        return self.stop_decision.stop

    def checkpoint_due(self) -> bool:
        """A time-based checkpoint (checkpoint.interval_hours) is due, as agreed by the last should_stop()."""
        return self.stop_decision.checkpoint_due

    def stop_code(self) -> ExitCode:
        """The exit code of the agreed stop: KILLED (never restarted) or TIME_BUDGET (continued)."""
        return ExitCode.KILLED if self.stop_decision.kill else ExitCode.TIME_BUDGET

    def stop_reason(self) -> str:
        return self.controls.describe_stop(self.stop_decision)

    # -- checkpoints -------------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> Path:
        """Where the checkpoint of step `step` goes (created): the loop writes its files there."""
        path = self.paths.checkpoints / CHECKPOINT_NAME_FORMAT.format(step=step)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def checkpoint_saved(
        self, step: int, files: Iterable[str] | None = None, entries: Mapping[str, Mapping] | None = None
    ) -> Manifest | None:
        """Every rank, after its files of step `step` are written (and, with several writers, after
        a barrier): rank 0 adds the rollback bookkeeping (trainer_state.json), hashes `files`
        (relative; default every file in the folder) or takes `entries` hashed by the ranks
        themselves, then seals: MANIFEST.json, `latest`, keep-last. Returns the manifest on rank 0."""
        self.controls.checkpoint_saved()
        if self.rank != 0:
            return None
        ckpt_dir = self.checkpoint_dir(step)
        rollback = self.resumed.rollback if self.resumed is not None else None
        if rollback is not None:
            state = rollback.checkpoint_state(
                step, self._consumed_samples, self._consumed_samples, 0, self._last_batch
            )
            atomic_write_text(ckpt_dir / CHECKPOINT_STATE_NAME, json.dumps(state.to_dict(), indent=1) + "\n")
        table = dict(entries or {})
        names = (
            list_files(ckpt_dir)
            if files is None
            else [*files, *([CHECKPOINT_STATE_NAME] if rollback else [])]
        )
        table.update(hash_files(ckpt_dir, [n for n in names if n not in table]))
        meta = {"step": step, "world_size": self.world_size, "job_id": self.job_id}
        return seal_checkpoint(self.paths.checkpoints, ckpt_dir, table, meta, self.settings.keep_last)

    # -- the end -----------------------------------------------------------------------------
    def record_exit(self, code: int) -> int:
        """The exit code in the last beat, the beat stopped; returns the code (for sys.exit)."""
        return exits.record_exit(self.beat, code)

    def exit(self, code: int) -> None:
        """record_exit, then leave at once (os._exit, after flushing)."""
        exits.exit_now(self.record_exit(code))


def start(
    run_dir: str | os.PathLike[str] | None = None,
    *,
    all_reduce_max: AllReduceMax | None = None,
    env: Mapping[str, str] | None = None,
    job_start_time: float | None = None,
) -> Supervision:
    """This rank under the controller: which rank (SLURM's variables, torchrun's, or one process),
    the run directory (`run_dir`, else $RUNCTL_RUN_DIR, which the job's launcher sets), its
    settings (RUN_DIR/run.yaml), and the beat started. Call it first thing, before the model is
    built: from here a rank that dies or hangs in its init is seen."""
    env = os.environ if env is None else env
    where = run_dir if run_dir is not None else env.get(RUN_DIR_VARIABLE)
    if not where:
        raise RuntimeError(
            f"no run directory: pass start(run_dir) or set {RUN_DIR_VARIABLE} "
            "(the job's launcher sets it when `runctl submit` started the job)"
        )
    settings = read_settings(RunPaths.of(where).config)
    paths = RunPaths.of(where, settings.checkpoint_dir)
    ranks = dist_env_from(env)
    supervision = Supervision(paths, ranks, settings, all_reduce_max, job_start_time or time.time())
    supervision.beat.start()
    return supervision


Callback = Callable[[], None]
