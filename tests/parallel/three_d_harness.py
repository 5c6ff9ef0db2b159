"""One rank of a 3D-parallel (dp, tp, pp) training run of a tiny BLOOM on synthetic batches, for the
bench (bench/parallel_layouts.py: it times every pipeline-schedule instruction, which `python -m
trainer` cannot) and the 4-node SLURM job test. The equivalence of the layouts is shown on the
trainer itself (tests/parallel/test_3d_trainer.py); this harness builds its engine with the
trainer's own functions (trainer.engine.initialize), clipping included, and overrides nothing.

Run by `spawn_ranks` (one process per rank, SLURM-like env) or by srun on the local SLURM cluster:

    python -m tests.parallel.three_d_harness SPEC_JSON      (or the path of a .json file with it)

SPEC (JSON): {"tp", "pp", "dp", "dtype": "fp32"|"bf16", "steps", "out": path of the result JSON,
    "instrument"?: bool (time every schedule instruction), "global_batch"?, "hidden_size"?, "clip_grad"?}
(Checkpoints and universal resume are tested on the trainer: tests/trainer/test_trainer_*resume*.py.)

The model, the data and the seed depend on nothing but the step index, so every layout trains on
the same global batches: step k uses GLOBAL_BATCH sequences drawn from a generator seeded by
(DATA_SEED, k); DP rank d takes the d-th contiguous block of them, split into micro-batches. With
mean-loss micro-batches and DeepSpeed's 1/m scaling + DP averaging, every layout computes the same
mean loss and gradient as the single process, up to the order of fp32 sums.

Rank 0 writes {"losses": [...], "grad_norms": [...], "step_seconds": [...], ...} to spec["out"].
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SEQ_LENGTH = 16
VOCAB = 250
PADDED_VOCAB = 256  # fixed for every tp (divisible by 8*tp for tp in 1, 2): same weights, same loss
MICRO_BATCH = 2
GLOBAL_BATCH = 8
DATA_SEED = 4321
ALPHABET = 32


def tiny_run_config(tp: int = 1, pp: int = 1, dp: int = 1, dtype: str = "fp32", *, num_layers: int = 4,
                    global_batch: int = GLOBAL_BATCH, micro_batch: int = MICRO_BATCH, seed: int = 1234,
                    clip_grad: float = 1.0, hidden_size: int = 48):
    """The RunConfig of the tiny BLOOM every layout trains (4 layers: pp=2 puts 2 on each stage)."""
    from orchestrator.plan.config import parse_config

    world = tp * pp * dp
    data = {
        "name": "tiny-3d-test",
        "seed": seed,
        "cluster": {"nodes": 1, "gpus_per_node": world, "accelerator": "cpu"},
        "model": {"num_layers": num_layers, "hidden_size": hidden_size, "num_attention_heads": 6, "seq_length": SEQ_LENGTH,
                  "vocab_size": VOCAB, "padded_vocab_size": PADDED_VOCAB, "make_vocab_size_divisible_by": 8,
                  "init_std": 0.02, "dtype": dtype, "kernels": "reference"},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": micro_batch,
                     "global_batch_size": global_batch, "activation_checkpointing": False,
                     "partition_method": "type:transformer|embedding"},
        # Constant LR (no warmup): a step's update does not depend on where the LR schedule is.
        "optimizer": {"lr": 1e-2, "min_lr": 1e-2, "clip_grad": clip_grad, "warmup_samples": 0},
        "data": {"datasets": [{"path": "unused"}], "tokenizer": "unused", "train_samples": 10_000},
        "checkpoint": {"interval_steps": 10},
    }
    return parse_config(data, source="tests.parallel.three_d_harness")


def global_batch_tokens(step: int, global_batch: int = GLOBAL_BATCH):
    """Step `step`'s global batch: token ids [global_batch, SEQ_LENGTH + 1], the same for every layout.

    Random tokens from the first ALPHABET ids with a copy structure (the second half repeats the
    first), so the loss falls visibly within 10 steps (from ln 256 towards ln 32 and below)."""
    import torch

    gen = torch.Generator().manual_seed(DATA_SEED * 1_000_003 + step)
    half = (SEQ_LENGTH + 2) // 2
    first = torch.randint(0, ALPHABET, (global_batch, half), generator=gen)
    return torch.cat([first, first], dim=1)[:, : SEQ_LENGTH + 1]


def micro_batches_of(step: int, dp_rank: int, dp: int, micro_batch: int = MICRO_BATCH,
                     global_batch: int = GLOBAL_BATCH):
    """This DP rank's micro-batches of step `step`: [(input_ids [b, s], labels [b, s]), ...]."""
    tokens = global_batch_tokens(step, global_batch)
    per_rank = global_batch // dp
    mine = tokens[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    return [(mine[i:i + micro_batch, :-1].contiguous(), mine[i:i + micro_batch, 1:].contiguous())
            for i in range(0, per_rank, micro_batch)]


def instrument_schedule(engine) -> dict:
    """Time every pipeline-schedule instruction this rank executes (ForwardPass, BackwardPass,
    SendActivation, RecvGrad, ...): {"current": {instruction name: seconds}} for the step running,
    moved to "steps" by the caller after each step. The bench derives the pipeline bubble from it."""
    timings: dict = {"steps": []}
    table = dict(engine._INSTRUCTION_MAP)
    for instruction, inner in list(table.items()):
        def timed(self, *args, _inner=inner, _name=instruction.__name__, **kwargs):
            start = time.perf_counter()
            try:
                return _inner(self, *args, **kwargs)
            finally:
                current = timings.setdefault("current", {})
                current[_name] = current.get(_name, 0.0) + time.perf_counter() - start
        table[instruction] = timed
    engine._INSTRUCTION_MAP = table  # an instance copy shadows the class table (see trainer.engine)
    return timings


def build_engine(cfg, layout):
    """PipelineModule of the tiny BLOOM + the trainer's DeepSpeed engine, built by trainer.engine as
    trainer.loop does (param groups, AdamW, DeepSpeed config, fp32 step guard with its pipeline-aware
    clipping, TP-replicated grad sync)."""
    from trainer import engine as trainer_engine
    from trainer.model import build_pipeline_module

    module = build_pipeline_module(cfg, layout)
    engine = trainer_engine.initialize(cfg, module, cfg.micro_batches)
    trainer_engine.install_replicated_grad_sync(engine, layout.tp)
    return engine


def run(spec: dict) -> dict:
    import torch
    import torch.distributed as dist

    from trainer.launch import dist_env_from, init_distributed
    from trainer.parallel import ParallelLayout, groups, initialize_model_parallel

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    env = dist_env_from(os.environ)
    init_distributed(env, "cpu")
    tp, pp, dp = spec["tp"], spec["pp"], spec["dp"]
    global_batch = spec.get("global_batch", GLOBAL_BATCH)
    cfg = tiny_run_config(tp, pp, dp, spec.get("dtype", "fp32"), clip_grad=spec.get("clip_grad", 1.0),
                          global_batch=global_batch, hidden_size=spec.get("hidden_size", 48))
    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, world_size=env.world_size)
    initialize_model_parallel(layout)
    t0 = time.perf_counter()
    engine = build_engine(cfg, layout)
    init_seconds = time.perf_counter() - t0

    timings = instrument_schedule(engine) if spec.get("instrument") else None
    dp_rank = groups.get_dp_rank()
    losses, norms, seconds = [], [], []
    for step in range(spec["steps"]):
        batches = iter(micro_batches_of(step, dp_rank, dp, global_batch=global_batch))
        dist.barrier()
        t = time.perf_counter()
        loss = engine.train_batch(data_iter=batches)
        seconds.append(time.perf_counter() - t)
        losses.append(float(loss))
        norm = engine.get_global_grad_norm()
        norms.append(None if norm is None else float(norm))
        if timings is not None:
            timings["steps"].append(dict(timings.pop("current", {})))
    result = {"layout": [dp, tp, pp], "dtype": cfg.model.dtype, "losses": losses, "grad_norms": norms,
              "step_seconds": seconds, "init_seconds": init_seconds,
              "micro_batches": engine.gradient_accumulation_steps()}
    if timings is not None:  # every rank's per-instruction seconds, per step: [rank][step]{name: s}
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {"coords": groups.get_layout().coords_of(dist.get_rank()),
                                          "steps": timings["steps"]})
        result["instruction_seconds"] = gathered
    if dist.get_rank() == 0:
        Path(spec["out"]).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    # The spec inline, or a path to a JSON file (what the SLURM test passes: no JSON on a shell line).
    arg = sys.argv[1]
    run(json.loads(Path(arg).read_text() if arg.endswith(".json") and Path(arg).is_file() else arg))
