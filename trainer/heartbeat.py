"""This rank's heartbeat file, and Python stacks on request: how the controller sees a rank.

Two clocks, written together into `heartbeats/rank-NNNNN.json` (protocol.Heartbeat):
- `beat_time`: moved by a daemon thread every `watchdog.heartbeat_seconds`, whatever the loop
  does. It stops only when the process dies or is frozen (SIGSTOP, lost node).
- `progress_time`: moved only by the training loop (`progress()` after a step, `set_phase()`).
  A rank blocked in a collective keeps beating but its progress time stands still: a hang.

The same thread serves `accepted/dump-stacks` (published by the controller only): when that file's mtime is newer than the last
dump, every thread's Python stack goes to `stacks/rank-NNNNN.txt` (atomic write). The main
thread may be stuck in C++ (a gloo/NCCL wait) and cannot answer; this thread still can, because
it does not need the GIL held by the stuck call (collectives release it). SIGUSR2 also writes
the stacks (faulthandler, C-level, works even when the GIL is held), appended to
`stacks/rank-NNNNN.sigusr2.txt`.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from orchestrator.protocol import DUMP_STACKS_REQUEST, Heartbeat, Phase, RunPaths, atomic_write_text


def format_all_stacks() -> str:
    """Every thread's Python stack, main thread first, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: ident != threading.main_thread().ident)
    out = [f"# pid {os.getpid()} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"]
    for ident in order:
        out.append(f"\n--- thread {names.get(ident, '?')} ({ident}) ---\n")
        out.extend(traceback.format_stack(frames[ident]))
    return "".join(out)


TIMED_PHASES = (Phase.INIT.value, Phase.CHECKPOINT.value, Phase.EVAL.value)


class HeartbeatWriter:
    def __init__(
        self,
        paths: RunPaths,
        rank: int,
        world_size: int,
        job_id: str,
        interval_seconds: float,
        host: str | None = None,
    ):
        self.paths = paths
        self.rank = rank
        self.world_size = world_size
        self.job_id = job_id
        # SLURM's node name: emulated nodes of the local cluster share one hostname.
        self.host = host or os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        self.interval = interval_seconds
        self._lock = threading.Lock()
        now = time.time()
        self._step = 0
        self._phase = Phase.INIT.value
        self._progress_time = now
        self._phase_started = now
        self._extra: dict = {}
        self._seq = 0
        # SLURM keeps a requeued job's id; its restart count and our start time tell the beats apart.
        self._restart_count = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        self._launch = int(os.environ.get("RUNCTL_LAUNCH", "0") or 0)  # relaunches inside the job
        self._process_started = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_dump_request = self._dump_request_mtime()  # a stale request from before start is ignored
        self._sigusr2_file = None

    # -- called by the training loop ---------------------------------------------------------
    def progress(self, step: int, **extra) -> None:
        """The loop advanced: move the progress time (and write now, so the controller sees it).

        `extra.step_seconds` is the duration of the steps since the last progress, per step, when
        nothing else (a save, an eval) happened in between: the controller learns its step timeout
        from it and from nothing else.

        The loop also passes `compute_seconds` (this rank's compute time of step `compute_step`,
        waits for peers excluded: trainer/compute_time.py) and `compute_group` (ranks with the
        same pipeline stage and TP rank do the same work): the controller's straggler detection
        compares them (orchestrator/controller/stragglers.py)."""
        with self._lock:
            now = time.time()
            if self._phase == Phase.STEP.value and step > self._step:
                self._extra["step_seconds"] = (now - self._progress_time) / (step - self._step)
            self._step = step
            self._progress_time = now
            self._extra.update(extra)
        self.write()

    def note(self, **extra) -> None:
        """Add fields to the beat's `extra` (e.g. exit_code) without moving the progress time."""
        with self._lock:
            self._extra.update(extra)

    def set_phase(self, phase: Phase, step: int | None = None) -> None:
        with self._lock:
            now = time.time()
            # The longest init/checkpoint/eval so far goes into the beat (`extra.durations`): the
            # controller learns its per-phase timeouts from it even when a whole save happens
            # between two of its passes. Steps are learned from progress instead.
            if self._phase in TIMED_PHASES and Phase(phase).value != self._phase:
                durations = self._extra.setdefault("durations", {})
                durations[self._phase] = max(durations.get(self._phase, 0.0), now - self._phase_started)
            self._phase = Phase(phase).value
            self._phase_started = now
            self._progress_time = now
            if step is not None:
                self._step = step
        self.write()

    # -- the background thread ---------------------------------------------------------------
    def start(self) -> HeartbeatWriter:
        self.paths.heartbeats.mkdir(parents=True, exist_ok=True)
        self._install_sigusr2()
        self.write()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-rank{self.rank}", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_phase: Phase | None = Phase.EXITING) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval + 1)
        if final_phase is not None:
            self.set_phase(final_phase)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write()
                self._maybe_dump_stacks()
            except Exception as exc:  # a full disk must not kill training; the controller sees stale beats
                print(f"[heartbeat rank {self.rank}] could not write: {exc}", file=sys.stderr, flush=True)

    def snapshot(self) -> Heartbeat:
        with self._lock:
            return Heartbeat(
                rank=self.rank,
                world_size=self.world_size,
                host=self.host,
                job_id=self.job_id,
                pid=os.getpid(),
                step=self._step,
                phase=self._phase,
                beat_time=time.time(),
                progress_time=self._progress_time,
                phase_started=self._phase_started,
                extra=dict(self._extra),
                restart_count=self._restart_count,
                process_started=self._process_started,
                seq=self._next_seq(),
                launch=self._launch,
            )

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def write(self) -> None:
        atomic_write_text(self.paths.heartbeat(self.rank), self.snapshot().to_json() + "\n")

    # -- stacks on request -------------------------------------------------------------------
    def stacks_path(self) -> Path:
        return self.paths.stacks / f"rank-{self.rank:05d}.txt"

    def _dump_request_mtime(self) -> float:
        try:
            return self.paths.accepted_request(DUMP_STACKS_REQUEST).stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def _maybe_dump_stacks(self) -> None:
        mtime = self._dump_request_mtime()
        if mtime and mtime > self._last_dump_request:
            self._last_dump_request = mtime
            self.dump_stacks()

    def dump_stacks(self) -> Path:
        path = self.stacks_path()
        atomic_write_text(path, format_all_stacks())
        return path

    def _install_sigusr2(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread (tests may differ)
        self.paths.stacks.mkdir(parents=True, exist_ok=True)
        self._sigusr2_file = open(self.paths.stacks / f"rank-{self.rank:05d}.sigusr2.txt", "a")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR2, file=self._sigusr2_file, all_threads=True, chain=False)
