"""This rank's heartbeat, and Python stacks on request: how the controller sees a rank.

Where it goes (orchestrator.contract.Heartbeat, NodeBeat):
- a rank alone on its node writes `heartbeats/rank-NNNNN.json` every `watchdog.heartbeat_seconds`;
- on a node of several ranks, every rank writes its beat about once a second into a node-local
  folder in /dev/shm (orchestrator/contract/client/node_beats.py), and local rank 0 gathers them into the node's one
  file `heartbeats/node-<host>.json` every `watchdog.heartbeat_seconds`: 48 files for BLOOM's
  384 ranks instead of 384. A dead peer shows there as an entry whose `seq` stops; a dead local
  rank 0 as a node file that stops changing. Local rank 0 removes the node-local folder at exit.

Three clocks in one beat:
- `beat_time`/`seq`: moved by a daemon thread, whatever the loop does. They stop only when the
  process dies or is frozen (SIGSTOP, lost node).
- `progress_count`/`progress_unit`/`mark_gaps`: the fine progress (orchestrator/contract/client/progress.py): marks
  bumped by hooks in the schedule and the checkpoint I/O, read here.
- `progress_time`: the last mark's, or the loop's last `progress()`/`set_phase()`, whichever is
  later. A rank blocked in a collective keeps beating but its progress stands still: a hang.

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
from dataclasses import fields
from pathlib import Path

from orchestrator.contract import (
    DUMP_STACKS_REQUEST,
    Heartbeat,
    NodeBeat,
    Phase,
    RunPaths,
    atomic_write_text,
    write_heartbeat,
    write_node_beat,
)
from orchestrator.contract.client.node_beats import NodeLocalBeats
from orchestrator.contract.client.progress import COUNTER
from orchestrator.contract.heartbeat import REQUIRED_FIELDS

# What the loop may report in a beat: not what every beat must have (the contract's), nor the
# writer's own bookkeeping.
REPORTED = (
    frozenset(f.name for f in fields(Heartbeat))
    - REQUIRED_FIELDS
    - {"restart_count", "process_started", "launch", "seq", "version", "durations", "progress_count",
       "progress_unit", "mark_gaps"}
)  # fmt: skip
LOCAL_BEAT_SECONDS = 1.0  # how often a rank of a shared node leaves its beat in /dev/shm


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
        local_rank: int = 0,
        local_world_size: int = 1,
        node_local_root: Path | None = None,
    ):
        """`local_world_size` > 1: the node's ranks share one node file, written by `local_rank` 0
        (`node_local_root`: where the node-local folder goes, /dev/shm by default)."""
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
        self._reported: dict = {}  # REPORTED fields, as the loop last said them
        self._durations: dict[str, float] = {}  # the longest completed init/checkpoint/eval
        self._seq = 0
        # SLURM keeps a requeued job's id; its restart count and our start time tell the beats apart.
        self._restart_count = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        self._launch = int(os.environ.get("RUNCTL_LAUNCH", "0") or 0)  # relaunches inside the job
        self._process_started = now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_dump_request = self._dump_request_mtime()  # a stale request from before start is ignored
        self._sigusr2_file = None
        self.local_rank = local_rank
        self._node: NodeLocalBeats | None = None
        if local_world_size > 1:
            self._node = NodeLocalBeats(job_id, self._restart_count, self._launch, self.host, node_local_root)
        self._gatherer = self._node is not None and local_rank == 0
        # The thread wakes every `_tick`: a shared node's ranks refresh their node-local beat at
        # each; the run directory is written (and the stacks request looked at) every `interval`.
        self._tick = min(interval_seconds, LOCAL_BEAT_SECONDS) if self._node is not None else interval_seconds

    # -- called by the training loop ---------------------------------------------------------
    def progress(self, step: int, **reported) -> None:
        """The loop advanced: move the progress time (and write now, so the controller sees it).

        `step_seconds` (computed here) is the duration of the steps since the last progress, per step, when
        nothing else (a save, an eval) happened in between: the controller learns its step timeout
        from it and from nothing else.

        The loop also passes `compute_seconds` (this rank's compute time of step `compute_step`,
        waits for peers excluded: trainer/compute_time.py) and `compute_group` (ranks with the
        same pipeline stage and TP rank do the same work): the controller's straggler detection
        compares them (orchestrator/controller/stragglers.py)."""
        self._check(reported)
        with self._lock:
            now = time.time()
            if self._phase == Phase.STEP.value and step > self._step:
                self._reported["step_seconds"] = (now - self._progress_time) / (step - self._step)
            self._step = step
            self._progress_time = now
            self._reported.update(reported)
        self.write()

    @property
    def step_seconds(self) -> float | None:
        """The time per step of the last progress (None before two steps in the STEP phase)."""
        with self._lock:
            return self._reported.get("step_seconds")

    def note(self, **reported) -> None:
        """Set fields of the beat (e.g. exit_code, resumed_from) without moving the progress time."""
        self._check(reported)
        with self._lock:
            self._reported.update(reported)

    @staticmethod
    def _check(reported: dict) -> None:
        unknown = sorted(set(reported) - REPORTED)
        if unknown:
            raise TypeError(
                f"not a heartbeat field the loop reports: {unknown} (orchestrator.contract.Heartbeat)"
            )

    def set_phase(self, phase: Phase, step: int | None = None) -> None:
        COUNTER.begin_phase(phase)
        with self._lock:
            now = time.time()
            # The longest init/checkpoint/eval so far goes into the beat (`durations`): the
            # controller learns its per-phase timeouts from it even when a whole save happens
            # between two of its passes. Steps are learned from progress instead.
            if self._phase in TIMED_PHASES and Phase(phase).value != self._phase:
                durations = self._durations
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
        if self._node is not None:
            self._node.open()
            if self._gatherer:
                try:
                    self._node.sweep()  # earlier jobs' folders a SIGKILLed local rank 0 left
                except OSError as exc:  # never a reason not to train
                    print(
                        f"[trainer rank {self.rank}] could not sweep {self._node.parent}: {exc}",
                        file=sys.stderr,
                    )
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
        if self._gatherer:
            self._node.remove()

    def _run(self) -> None:
        next_beat = time.monotonic() + self.interval
        while not self._stop.wait(self._tick):
            try:
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.interval
                    self.write()
                    self._maybe_dump_stacks()
                elif not self._gatherer:
                    self.write()  # a peer's node-local beat, about once a second
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
                phase=Phase(self._phase),
                beat_time=time.time(),
                progress_time=max(self._progress_time, COUNTER.last_mark_time()),
                phase_started=self._phase_started,
                progress_count=COUNTER.count,
                progress_unit=COUNTER.unit_name,
                mark_gaps=dict(COUNTER.gaps),
                durations=dict(self._durations),
                **self._reported,
                restart_count=self._restart_count,
                process_started=self._process_started,
                seq=self._next_seq(),
                launch=self._launch,
            )

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def write(self) -> None:
        beat = self.snapshot()
        if self._node is None:
            write_heartbeat(self.paths.heartbeats, beat)
        elif not self._gatherer:
            try:
                self._node.write(beat)
            except FileNotFoundError:
                pass  # local rank 0 has exited and removed the node-local folder: nobody gathers now
        else:
            ranks = sorted([beat, *self._node.read(skip_rank=self.rank)], key=lambda b: b.rank)
            node = NodeBeat(self.host, self.job_id, self.world_size, self._restart_count, self._launch, ranks)
            write_node_beat(self.paths.heartbeats, node)

    # -- stacks on request -------------------------------------------------------------------
    def stacks_path(self) -> Path:
        return self.paths.stack_dump(self.rank)

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
        self._sigusr2_file = open(self.paths.signal_stack_dump(self.rank), "a")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR2, file=self._sigusr2_file, all_threads=True, chain=False)
