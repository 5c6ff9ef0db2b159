"""A tiny stand-in for one trainer rank that follows the run-directory contract exactly.

    python fake_trainer.py RUN_DIR   (rank etc. from SLURM-like env: RANK, WORLD_SIZE, JOB_ID, HOST)

- a background thread beats every FAKE_BEAT seconds (liveness) and answers control/dump-stacks
  by writing stacks/rank-NNNNN.txt (it works while the loop is stuck, like the real trainer);
- the loop moves progress_time once per step; loss(step) is a fixed function of the step, so a
  resumed run has the same losses as an uninterrupted one only if it resumes at the right step;
- every FAKE_CKPT_EVERY steps rank 0 saves checkpoints/step_N/ (data + MANIFEST.json written last,
  `latest` renamed atomically), in phase "checkpoint" for FAKE_CKPT_SECONDS;
- resume: the newest checkpoint whose manifest verifies;
- accepted/kill (published by the controller once it authenticated control/kill) is checked every step: save, exit 17;
- ranks advance in lockstep (wait_for_peers), as a collective would make them;
- faults (for tests): FAKE_CRASH_AT=step:rank (exit 1), FAKE_HANG_AT=step:rank (keep beating,
  stop progressing; the others then wait for it), FAKE_STOP_AT=step:rank (SIGSTOP itself: no
  beats either).
Stdlib only, starts in ~50 ms.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.contract import (  # noqa: E402
    ExitCode,
    Heartbeat,
    Manifest,
    Phase,
    RunPaths,
    StepMetrics,
    atomic_write_text,
    read_heartbeats,
)
from orchestrator.contract.checkpoints import resume_point  # noqa: E402
from orchestrator.contract.manifest import DamageReport, FileEntry, report_damage, write_manifest  # noqa: E402
from orchestrator.contract.metrics import append_metrics  # noqa: E402


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def fault(name: str) -> tuple[int, int] | None:
    value = os.environ.get(name)
    if not value:
        return None
    step, rank = value.split(":")
    return int(step), int(rank)


def loss_at(step: int) -> float:
    return round(4.0 * math.exp(-step / 40.0) + 1.0 + 0.01 * math.sin(step), 6)


class Rank:
    def __init__(self, run_dir: str):
        self.paths = RunPaths.of(run_dir)
        self.rank = env_int("RANK", 0)
        self.world = env_int("WORLD_SIZE", 1)
        self.job_id = os.environ.get("JOB_ID", "0")
        self.host = os.environ.get("HOST_NAME", "node01")
        self.total = env_int("FAKE_STEPS", 20)
        self.step_seconds = float(os.environ.get("FAKE_STEP_SECONDS", "0.05"))
        self.ckpt_every = env_int("FAKE_CKPT_EVERY", 5)
        self.ckpt_seconds = float(os.environ.get("FAKE_CKPT_SECONDS", "0.1"))
        self.beat_every = float(os.environ.get("FAKE_BEAT", "0.1"))
        now = time.time()
        self.hb = Heartbeat(self.rank, self.world, self.host, self.job_id, os.getpid(), 0, Phase.INIT, now, now, now)
        self.lock = threading.Lock()
        self.paths.heartbeats.mkdir(parents=True, exist_ok=True)

    # heartbeat thread -------------------------------------------------------------------------
    def beat_forever(self) -> None:
        while True:
            with self.lock:
                self.hb.beat_time = time.time()
                self.hb.seq += 1
                atomic_write_text(self.paths.heartbeat(self.rank), self.hb.to_json())
            request = self.paths.accepted_request("dump-stacks")
            if request.exists():
                out = self.paths.stacks / f"rank-{self.rank:05d}.txt"
                out.parent.mkdir(parents=True, exist_ok=True)
                frames = sys._current_frames()
                text = "".join(f"thread {tid}:\n" + "".join(traceback.format_stack(f)) for tid, f in frames.items())
                atomic_write_text(out, text)
            time.sleep(self.beat_every)

    def set_phase(self, phase: Phase, step: int | None = None, progressed: bool = False) -> None:
        with self.lock:
            now = time.time()
            if phase != self.hb.phase:
                # Like orchestrator.contract.client.beat: report the longest init/checkpoint/eval so far.
                if self.hb.phase in (Phase.INIT, Phase.CHECKPOINT, Phase.EVAL):
                    done = self.hb.phase.value
                    durations = self.hb.durations
                    durations[done] = max(durations.get(done, 0.0), now - self.hb.phase_started)
                self.hb.phase_started = now
            self.hb.phase = phase
            if step is not None:
                self.hb.step = step
            if progressed:
                if phase is Phase.STEP and self.hb.phase_started < self.hb.progress_time:
                    self.hb.step_seconds = now - self.hb.progress_time  # like orchestrator.contract.client.beat
                self.hb.progress_time = now
            self.hb.seq += 1
            atomic_write_text(self.paths.heartbeat(self.rank), self.hb.to_json())

    # checkpoints ------------------------------------------------------------------------------
    def save(self, step: int) -> None:
        self.set_phase(Phase.CHECKPOINT, step)
        time.sleep(self.ckpt_seconds)
        if self.rank == 0:
            directory = self.paths.checkpoint(step)
            directory.mkdir(parents=True, exist_ok=True)
            data = json.dumps({"step": step}).encode()
            (directory / "state.json").write_bytes(data)
            entry = FileEntry(len(data), hashlib.sha256(data).hexdigest())
            write_manifest(directory, Manifest(files={"state.json": entry}, step=step))
            atomic_write_text(self.paths.latest, directory.name)

    def resume_step(self) -> int:
        """Like the trainer: the first candidate that verifies by hash; damaged ones reported."""
        info, skipped = resume_point(self.paths.checkpoints, check_hashes=True)
        if self.rank == 0:
            for bad, problem in skipped:
                report_damage(self.paths.checkpoints, DamageReport(bad.path.name, [problem], self.job_id, time.time()))
        return info.step if info else 0

    def wait_for_peers(self, step: int) -> None:
        """A stand-in for the step's collective: no rank finishes step+1 before every rank has
        finished `step`. A rank that died or hangs leaves the others here, beating, not progressing."""
        while True:
            steps = [b.step for b in read_heartbeats(self.paths.heartbeats) if b.job_id == self.job_id]
            if len(steps) == self.world and min(steps) >= step:
                return
            time.sleep(0.01)

    # the loop ---------------------------------------------------------------------------------
    def main(self) -> int:
        threading.Thread(target=self.beat_forever, daemon=True).start()
        step = self.resume_step()
        self.hb.resumed_from = step  # like trainer.loop: the step this job resumed from
        self.set_phase(Phase.STEP, step, progressed=True)
        crash, hang, stop = fault("FAKE_CRASH_AT"), fault("FAKE_HANG_AT"), fault("FAKE_STOP_AT")
        while step < self.total:
            if self.paths.accepted_request("kill").exists():
                self.save(step)
                self.set_phase(Phase.EXITING, step)
                return ExitCode.KILLED
            if crash == (step, self.rank):
                return 1
            if stop == (step, self.rank):
                os.kill(os.getpid(), signal.SIGSTOP)
            if hang == (step, self.rank):
                while True:  # beats go on, progress stops
                    time.sleep(1)
            time.sleep(self.step_seconds)
            self.wait_for_peers(step)
            step += 1
            self.set_phase(Phase.STEP, step, progressed=True)
            if self.rank == 0:
                append_metrics(self.paths.metrics, StepMetrics(
                    step=step, loss=loss_at(step), time=time.time(), job_id=self.job_id, tokens_per_s=1000.0,
                    tflops_per_gpu=1.5, step_seconds=self.step_seconds,
                ))  # fmt: skip
            if step % self.ckpt_every == 0 and step < self.total:
                self.save(step)
                self.set_phase(Phase.STEP, step)
        self.save(step)
        self.set_phase(Phase.EXITING, step)
        return ExitCode.FINISHED


if __name__ == "__main__":
    code = Rank(sys.argv[1]).main()
    sys.stdout.flush()
    os._exit(int(code))
