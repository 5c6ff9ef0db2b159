"""trainer/compute_time.py: what counts as a rank's compute time per step.

The real-process check (a rank waiting for a slow peer in gloo collectives reports its own compute,
not the wait) is tests/controller/test_stragglers_slurm.py. Here: the CPU clock ignores sleeping,
and the CUDA path times exactly the pipeline's forward and backward instructions, with a fake
torch.cuda.Event on a virtual clock (CI has no GPU)."""

from __future__ import annotations

import time
from types import MethodType

import torch

from trainer.compute_time import ComputeClock
from trainer.faults import burn_cpu


def test_cpu_clock_counts_work_not_waiting():
    clock = ComputeClock()
    clock.start()
    time.sleep(0.3)  # blocked, like a rank in a gloo wait
    burn_cpu(0.2)
    seconds = clock.stop()
    print(f"0.3 s asleep + 0.2 s busy -> {seconds:.3f} s of compute")
    assert 0.2 <= seconds < 0.27


def test_cuda_clock_times_only_forward_and_backward(monkeypatch):
    from deepspeed.runtime.pipe import schedule

    now = [0.0]  # virtual GPU time, seconds

    class FakeEvent:
        def __init__(self, enable_timing: bool):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = now[0]

        def elapsed_time(self, end) -> float:  # milliseconds, as torch's
            return (end.at - self.at) * 1000.0

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    class Engine:  # DeepSpeed's PipelineEngine dispatch: the class's _INSTRUCTION_MAP, bound per call
        def forward(self, buffer_id):
            now[0] += 2.0

        def backward(self, buffer_id):
            now[0] += 3.0

        def receive(self, buffer_id):
            now[0] += 50.0  # waiting for the previous stage

        _INSTRUCTION_MAP = {schedule.ForwardPass: forward, schedule.BackwardPass: backward,
                            schedule.RecvActivation: receive}  # fmt: skip

        def run(self, commands):
            for cmd in commands:
                MethodType(self._INSTRUCTION_MAP[type(cmd)], self)(**cmd.kwargs)

    engine = Engine()
    clock = ComputeClock(engine, cuda=True)
    step = [schedule.RecvActivation(buffer_id=0), schedule.ForwardPass(buffer_id=0), schedule.BackwardPass(buffer_id=0)]
    for _ in range(2):  # a second step starts from zero
        clock.start()
        engine.run(step)
        assert clock.stop() == 5.0
    assert Engine._INSTRUCTION_MAP[schedule.ForwardPass] is Engine.forward, "other engines are untouched"
