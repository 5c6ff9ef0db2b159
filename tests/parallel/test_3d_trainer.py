"""`python -m trainer` at every (tp, pp, dp) layout trains like the single-process trainer, and the
single-process trainer trains like a plain PyTorch loop that DeepSpeed does not touch.

The ranks are started as srun starts them (SLURM_PROCID, SLURM_NTASKS, ..., MASTER_ADDR/PORT);
each run trains the tiny BLOOM on the shipped corpus for STEPS steps and writes metrics.jsonl.
Layouts (tp, pp, dp): in fp32 each dimension alone (2x1x1, 1x2x1, 1x1x2) and all three (2x2x2); in
bf16 (BF16_Optimizer, ZeRO-1) data parallel alone (1x1x2, the optimizer's sharding) and all three;
each compared step by step with the (1,1,1) run of the same dtype. tp2 x pp2 without dp is
tests/parallel/test_tensor_parallel_pipeline.py's (the two-dimension layouts were dropped here to keep
`make test` under 25 minutes: 26 processes instead of 54; 2x2x2 holds every pair).
Config and tolerances: tests/parallel/trainer_layouts.py.

The anchor (fp32): our BloomModel + torch.optim.AdamW + torch.nn.utils.clip_grad_norm_ +
F.cross_entropy, on the same samples in the same order (the trainer's dataset, read by index),
with the LR schedule written out here (Megatron's: linear warmup, then cosine), one batch of 8
per step instead of 4 accumulated micro-batches.
"""

from __future__ import annotations

import math

import pytest

from tests.parallel.trainer_layouts import (
    STEPS,
    compare_records,
    layout_run_dir,
    max_rel_error,
    run_trainer_layouts,
    series,
)

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow  # ~2.5 min on 2 cores: 9 trainer runs, 26 processes (make test runs it)

LAYOUTS = {  # (tp, pp, dp)
    "fp32": [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2)],
    "bf16": [(1, 1, 2), (2, 2, 2)],
}
DTYPES = tuple(LAYOUTS)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    """Every (dtype, layout) run of this module, (1, 1, 1) included, started in one batch."""
    work = tmp_path_factory.mktemp("layouts")
    keys = [(dtype, layout) for dtype in DTYPES for layout in [(1, 1, 1), *LAYOUTS[dtype]]]
    runs = run_trainer_layouts(work, keys)
    for dtype in DTYPES:
        print(f"single process {dtype}: losses {[round(r['loss'], 5) for r in runs[dtype, (1, 1, 1)]]}, "
              f"grad norms {[round(r['grad_norm'], 5) for r in runs[dtype, (1, 1, 1)]]}")
    return work, runs


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_layout_matches_the_single_process_trainer(trainer_runs, dtype):
    _, runs = trainer_runs
    reference = series(runs[dtype, (1, 1, 1)])
    # The runs must have learned something, and every step must have been clipped (see the config).
    assert reference["loss"][-1] < reference["loss"][0] - 0.1, reference["loss"]
    assert min(reference["grad_norm"]) > 0.3, reference["grad_norm"]
    failures = []
    for layout in LAYOUTS[dtype]:
        try:
            compare_records(runs[dtype, layout], reference, dtype, f"tp,pp,dp={layout} {dtype} vs single process")
        except AssertionError as err:
            failures.append(str(err))
    assert not failures, "\n".join(failures)


def plain_pytorch_losses(run_dir, steps: int) -> dict[str, list[float]]:
    """Train BloomModel with torch.optim.AdamW and clip_grad_norm_ on the run's samples; per step the
    loss before the update, the gradient norm (float64) before clipping, and the LR used."""
    import torch
    import torch.nn.functional as F

    import bloom_kernels
    from orchestrator.contract import RunPaths
    from orchestrator.plan.config import load_config
    from trainer.loop import build_datasets
    from trainer.model import BloomModel
    from trainer.parallel import ParallelLayout, initialize_model_parallel

    cfg = load_config(RunPaths.of(run_dir).config)
    opt, batch = cfg.optimizer, cfg.parallel.global_batch_size
    layout = ParallelLayout(tp=1, pp=1, dp=1, world_size=1)
    initialize_model_parallel(layout)  # one process, whatever another test of this process set up
    model = BloomModel(cfg, layout)
    train, _ = build_datasets(cfg, RunPaths.of(run_dir), 0)  # the index the trainer run built
    # Megatron's rule: matrices decay, biases and LayerNorm parameters do not.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": opt.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=opt.lr, betas=(opt.adam_beta1, opt.adam_beta2), eps=opt.adam_eps)

    def lr_after(samples: int) -> float:  # linear warmup from 0, then cosine to min_lr at train_samples
        if samples <= opt.warmup_samples:
            return opt.lr * samples / opt.warmup_samples
        progress = (samples - opt.warmup_samples) / (cfg.train_samples - opt.warmup_samples)
        return opt.min_lr + (opt.lr - opt.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

    out: dict[str, list[float]] = {"loss": [], "grad_norm": [], "lr": []}
    with bloom_kernels.kernel_path("reference"):
        for step in range(steps):
            tokens = torch.stack([torch.from_numpy(train[i]["text"]) for i in range(step * batch, (step + 1) * batch)])
            lr = lr_after(step * batch)
            for group in adamw.param_groups:
                group["lr"] = lr
            logits = model(tokens[:, :-1])  # [8, s, V]
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            adamw.zero_grad()
            loss.backward()
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt.clip_grad)
            adamw.step()
            out["loss"].append(loss.item())
            out["grad_norm"].append(norm)
            out["lr"].append(lr)
    return out


def test_single_process_trainer_matches_a_plain_pytorch_loop(trainer_runs):
    work, runs = trainer_runs
    run_dir = layout_run_dir(work, "fp32", (1, 1, 1))  # the same directory (make_run_dir is idempotent)
    plain = plain_pytorch_losses(run_dir, STEPS)
    trainer = series(runs["fp32", (1, 1, 1)])
    lr_err = max_rel_error(trainer["lr"][1:], plain["lr"][1:])
    assert trainer["lr"][0] == plain["lr"][0] == 0.0 and lr_err < 1e-12, (trainer["lr"], plain["lr"])
    compare_records(runs["fp32", (1, 1, 1)], plain, "fp32", "single-process trainer vs plain PyTorch loop")
