"""The pipeline layer specs under DeepSpeed's real pipeline engine with TP: tp = 2 x pp = 2 (4 gloo
ranks), 3 SGD steps, fp32, against the single-process BloomModel with torch SGD on the same batches.

This checks the tied embedding across stages (gradient all-reduced between first and last stage),
the vocab-parallel head and loss on the last stage, and that our TP groups agree with DeepSpeed's
grid. (The full 3D matrix with ZeRO-1/bf16 lives with the training engine's tests.)
Note: DeepSpeed 0.19.8 clips gradients to norm 1.0 unless `gradient_clipping` is set: set 0 here.
"""

from __future__ import annotations

import pytest
import torch

from tests.model.bloom_configs import tiny_config
from tests.model.dist_helpers import run_gloo
from trainer.model import BloomModel, bloom_loss

pytest.importorskip("deepspeed")

MODEL = {"num_layers": 2, "hidden_size": 48, "num_attention_heads": 6, "init_std": 0.2}
STEPS, LR, MICRO_BATCHES = 3, 0.1, 2


def _batches(cfg):
    generator = torch.Generator().manual_seed(7)
    out = []
    for _ in range(MICRO_BATCHES):
        ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_length), generator=generator)
        out.append((ids, torch.roll(ids, -1, dims=1)))
    return out


def _pipeline_worker(rank: int, world: int, tp: int, pp: int, out_path: str) -> None:
    import deepspeed

    from trainer.launch import skip_deepspeed_shm_op
    from trainer.model import build_pipeline_module
    from trainer.parallel import ParallelLayout, get_tp_rank, initialize_model_parallel

    skip_deepspeed_shm_op()  # as the trainer does: training never uses the op it would compile
    layout = ParallelLayout(tp=tp, pp=pp, dp=1, world_size=world)
    initialize_model_parallel(layout)
    cfg = tiny_config(tp=tp, pp=pp, **MODEL)
    module = build_pipeline_module(cfg, layout, activation_checkpoint_interval=0)
    # DeepSpeed's model-parallel ("slice") rank and ours agree on every rank.
    assert module.mpu().get_slice_parallel_rank() == get_tp_rank()
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": MICRO_BATCHES,
                 "gradient_clipping": 0.0, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=module, config=ds_config,
                                      optimizer=torch.optim.SGD(module.parameters(), lr=LR))
    losses = [engine.train_batch(iter(_batches(cfg))).item() for _ in range(STEPS)]
    if rank == 0:
        torch.save(losses, out_path)


def test_tp2_pp2_pipeline_losses_equal_single_process(tmp_path):
    out = tmp_path / "losses.pt"
    run_gloo(4, _pipeline_worker, 2, 2, str(out))
    pipeline_losses = torch.load(out)
    cfg = tiny_config(**MODEL)
    model = BloomModel(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    reference = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = sum(bloom_loss(model(ids), labels) for ids, labels in _batches(cfg)) / MICRO_BATCHES
        loss.backward()
        optimizer.step()
        reference.append(loss.item())
    rel = max(abs(a - b) / abs(b) for a, b in zip(pipeline_losses, reference, strict=True))
    print(f"tp=2 pp=2 DeepSpeed pipeline losses {pipeline_losses} vs single process {reference}: "
          f"max rel err {rel:.3e}")
    assert rel <= 1e-5
