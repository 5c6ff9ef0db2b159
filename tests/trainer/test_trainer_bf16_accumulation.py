"""The trainer's bf16 engine accumulates gradients across micro-batches in fp32, as BLOOM's
BF16_Optimizer did: a sum that bf16 cannot hold survives, and the update uses it.

The engine is trainer.engine.initialize's (the trainer's DeepSpeed config: bf16, ZeRO-1,
grad_accum_dtype fp32), around a PipelineModule of one probe layer: out = sum(x * w), w = ones(4),
loss = mean(out). A micro-batch's gradient is then its input x (scaled by DeepSpeed's 1/M), exactly,
in bf16. Step: M = 256 micro-batches of one sample; the first has x = 1, the other 255 have
x = 2^-9. In bf16 (8 significant bits) 1 + 2^-9 rounds back to 1, so a bf16 accumulator ends at
1/M and loses them all; fp32 holds (1 + 255 * 2^-9) / M exactly.

Checked, with values computed here:
- after the last micro-batch's backward, the accumulated gradient is fp32 and exactly that sum;
- before the optimizer step it is that sum rounded ONCE to bf16: DeepSpeed all-reduces the fp32
  buffers over DP in `communication_data_type`, which defaults to the model's bf16 (as in BLOOM's
  runs); one rounding (2^-9 relative at most), not bf16 accumulation (here -33%);
- the fp32 master weight after the step equals torch.optim.AdamW applied, in this test, to an fp32
  copy with that gradient (adam_eps = 1 makes the update proportional to the gradient instead of
  Adam's scale-free ~lr).

Runs in a child process (`python -m tests.trainer.test_trainer_bf16_accumulation OUT.json`): the
engine needs torch.distributed, which the pytest process must not initialise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
M = 256
SMALL = 2.0**-9
LR, EPS = 0.5, 1.0


def expected_gradient() -> float:
    return (1.0 + (M - 1) * SMALL) / M  # exact in fp32 (10 significant bits), 1/M in bf16


def probe(out: str) -> None:
    import torch
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe import schedule
    from deepspeed.utils import safe_get_full_fp32_param

    from orchestrator.plan.config import parse_config
    from tests.trainer.runs import tiny_config_dict
    from trainer import engine as eng
    from trainer.launch import dist_env_from, init_distributed
    from trainer.parallel import ParallelLayout, initialize_model_parallel

    class ProbeLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):  # x [1, 4] -> [1]
            return (x.to(self.w.dtype) * self.w).sum(-1)

    def loss_fn(outputs, labels):
        return outputs.float().mean()

    init_distributed(dist_env_from(os.environ), "cpu")
    cfg = parse_config(tiny_config_dict(
        model={"dtype": "bf16"}, parallel={"micro_batch_size": 1, "global_batch_size": M},
        optimizer={"lr": LR, "min_lr": LR, "warmup_samples": 0, "decay_style": "constant", "adam_eps": EPS,
                   "weight_decay": 0.0, "clip_grad": 1.0}), source="bf16-accumulation-probe")
    layout = ParallelLayout(tp=1, pp=1, dp=1, world_size=1)
    initialize_model_parallel(layout)
    import deepspeed

    from trainer.launch import skip_deepspeed_shm_op

    skip_deepspeed_shm_op()  # as the trainer does: training never uses the op it would compile
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    module = PipelineModule(layers=[ProbeLayer()], loss_fn=loss_fn, topology=layout.deepspeed_topology(),
                            partition_method="uniform")
    engine = eng.initialize(cfg, module, cfg.micro_batches)
    eng.set_lr(engine, LR)
    (param,) = list(engine.module.parameters())
    seen: dict = {}

    def capture(where: str):
        def record(e) -> None:
            hp = getattr(param, "_hp_grad", None)
            grad = hp if hp is not None else param.grad
            seen[where] = {"dtype": str(grad.dtype) if grad is not None else None,
                           "grad": grad.double().tolist() if grad is not None else None,
                           "buffer": "_hp_grad" if hp is not None else "param.grad"}
        return record

    # after every micro-batch's backward (ReduceTiedGrads comes next), and right before the step
    eng.wrap_instruction(engine, schedule.ReduceTiedGrads, before=capture("accumulated"))
    eng.wrap_instruction(engine, schedule.OptimizerStep, before=capture("stepped"))
    label = torch.zeros(1)
    batches = [(torch.ones(1, 4), label)] + [(torch.full((1, 4), SMALL), label)] * (M - 1)
    engine.train_batch(data_iter=iter(batches))
    master = safe_get_full_fp32_param(param)
    Path(out).write_text(json.dumps({
        **seen, "optimizer": type(engine.optimizer).__name__, "param_dtype": str(param.dtype),
        "master": master.double().tolist(), "master_dtype": str(master.dtype),
        "micro_batches": engine.gradient_accumulation_steps()}))


def test_gradient_accumulation_is_fp32_and_the_update_uses_it(tmp_path):
    pytest.importorskip("deepspeed")
    import torch

    from tests.trainer.launch_local import free_port, rank_env

    out = tmp_path / "probe.json"
    proc = subprocess.run([sys.executable, "-m", "tests.trainer.test_trainer_bf16_accumulation", str(out)],
                          cwd=REPO_ROOT, env=rank_env(0, 1, free_port(), "bf16-probe"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["micro_batches"] == M and got["param_dtype"] == "torch.bfloat16"

    want = expected_gradient()
    bf16_sum = torch.tensor(0.0, dtype=torch.bfloat16)  # what a bf16 accumulator would hold
    for x in [1.0] + [SMALL] * (M - 1):
        bf16_sum += torch.tensor(x / M, dtype=torch.bfloat16)
    rounded_once = float(torch.tensor(want).to(torch.bfloat16))
    assert float(bf16_sum) == 1.0 / M, "the test case must be one that bf16 accumulation gets wrong"
    acc, step = got["accumulated"], got["stepped"]
    print(f"optimizer {got['optimizer']}: accumulated in {acc['buffer']} ({acc['dtype']}) {acc['grad']}; "
          f"exact fp32 sum {want!r}; before the step {step['buffer']} {step['grad']} (the sum rounded once to "
          f"bf16: {rounded_once!r}); a bf16 accumulator gives {float(bf16_sum)!r} "
          f"(rel error {abs(float(bf16_sum) - want) / want:.2e})")
    assert acc["dtype"] == "torch.float32" and acc["buffer"] == "_hp_grad", acc
    acc_err = max(abs(g - want) for g in acc["grad"]) / want
    print(f"accumulated gradient: max rel error {acc_err:.2e}")
    assert acc_err == 0.0, "the accumulated gradient must be the exact fp32 sum"
    assert step["grad"] == [rounded_once] * 4, "the DP all-reduce rounds the fp32 sum once, to bf16"
    want = rounded_once

    # The update, independently: torch AdamW on an fp32 copy of the initial weight with the exact gradient.
    weight = torch.nn.Parameter(torch.ones(4))
    adamw = torch.optim.AdamW([weight], lr=LR, eps=EPS, weight_decay=0.0, foreach=False)
    weight.grad = torch.full((4,), want)
    adamw.step()
    master_err = max(abs(m - w) for m, w in zip(got["master"], weight.detach().double().tolist(), strict=True))
    print(f"fp32 master after the step {got['master'][0]!r} vs AdamW given that gradient "
          f"{float(weight.detach()[0])!r}: max abs error {master_err:.2e}; the initial weight was 1.0")
    assert got["master_dtype"] == "torch.float32"
    assert master_err <= 1e-7, "the update must use the fp32-accumulated gradient"


if __name__ == "__main__":
    probe(sys.argv[1])
    sys.stdout.flush()
    os._exit(0)
