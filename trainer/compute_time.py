"""This rank's compute time per training step: the time it worked, not the time it waited for peers.

Every rank's step time (wall) is the same, set by the slowest rank: collectives make the others
wait. A straggler is found by what each rank spends *computing*; the controller compares those
(orchestrator/controller/stragglers.py). The heartbeat carries it as `extra.compute_seconds`.

- CPU / gloo: the CPU time of the training thread (`time.thread_time`) over the step. A rank
  waiting in a gloo collective or a recv blocks on a condition variable in C++ and burns no CPU,
  so the wait is excluded (measured on this machine: rank 0 waiting 2.66 s in an all_reduce for
  a busy peer used 0.0002 s of thread CPU time; a recv waiting 2.0 s, 0.0001 s). Work done by
  gloo's own threads (the reduction itself) and by other threads (checkpoint writer, heartbeat)
  is not counted either. With OMP_NUM_THREADS > 1 the intra-op threads' share is missed, which
  is the same fraction on every rank of the same layout.
- CUDA: CPU time says nothing (kernels are asynchronous, and a synchronize spins). CUDA events
  around DeepSpeed's pipeline ForwardPass/BackwardPass instructions time the kernels of the
  model's compute; p2p sends/receives, the gradient all-reduce and the optimizer are outside
  them. Tensor-parallel all-reduces inside the forward stay in, but a TP group never leaves a
  node, so a slow GPU still shows on its own node. NOT yet run on a GPU (CI has none).
"""

from __future__ import annotations

import time
from typing import Any


class ComputeClock:
    """`start()` before a step, `stop()` after it -> compute seconds of that step."""

    def __init__(self, engine: Any = None, cuda: bool = False):
        self._cuda_events: list[tuple[Any, Any]] | None = None
        if cuda and engine is not None and hasattr(engine, "_INSTRUCTION_MAP"):
            self._cuda_events = []
            _time_compute_instructions(engine, self._cuda_events)
        self._started = 0.0

    def start(self) -> None:
        if self._cuda_events is not None:
            self._cuda_events.clear()
        self._started = time.thread_time()

    def stop(self) -> float:
        if self._cuda_events is None:
            return time.thread_time() - self._started
        import torch  # noqa: PLC0415

        torch.cuda.synchronize()
        return sum(begin.elapsed_time(end) for begin, end in self._cuda_events) / 1000.0


def _time_compute_instructions(engine: Any, events: list[tuple[Any, Any]]) -> None:
    """Record a CUDA event pair around every forward and backward pass of the pipeline schedule.
    DeepSpeed looks instructions up in `_INSTRUCTION_MAP`; a per-engine copy of the engine's own
    (not the class's: that would drop the step guard, the TP grad sync and the progress marks)
    keeps other engines untouched."""
    import torch  # noqa: PLC0415
    from deepspeed.runtime.pipe import schedule  # noqa: PLC0415

    table = dict(engine._INSTRUCTION_MAP)  # the engine's own: keeps the wrappers installed before
    for kind in (schedule.ForwardPass, schedule.BackwardPass):
        original = table[kind]

        def timed(self, *args, _original=original, **kwargs):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            try:
                return _original(self, *args, **kwargs)
            finally:
                end.record()
                events.append((begin, end))

        table[kind] = timed
    engine._INSTRUCTION_MAP = table
