"""One rank of a probe: build the trainer of RUN_DIR and resume it exactly as `python -m trainer`
does (trainer.loop.Trainer.build + resume: the newest checkpoint, or its universal conversion when
the layout changed), then write the optimizer's state gathered by parameter name (tests only).

    python -m tests.trainer.optimizer_state_probe RUN_DIR OUT.pt      (one process per rank, srun's env)

OUT.pt (rank 0): {"fp32": {name: full fp32 master weight}, "exp_avg": {...}, "exp_avg_sq": {...},
"adam_step": sorted set of Adam step counts, "train_state": the trainer's counters,
"global_steps": the engine's}. "Full" = the ZeRO-1 partitions of the DP ranks joined
(DeepSpeed's safe_get_full_* gather them) and the TP slices concatenated along each parameter's
partition_dim; names are the pipeline module's (global layer index), the same at every layout.
A name held by two pipeline stages (the tied embedding module) is taken from the first stage, the
one that trains its LayerNorm.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

STATES = ("fp32", "exp_avg", "exp_avg_sq")


def _full_over_tp(tensor, param):
    import torch
    import torch.distributed as dist

    from trainer.parallel import groups

    if not getattr(param, "tensor_model_parallel", False) or groups.get_tp_world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(groups.get_tp_world_size())]
    dist.all_gather(parts, tensor.contiguous(), group=groups.get_tp_group())
    return torch.cat(parts, dim=param.partition_dim)


def gather_state(engine) -> dict:
    """Collective over every rank: this stage's parameters' fp32 master and Adam moments, full."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    # BF16_Optimizer links each parameter to its slice of the Adam state lazily, at the first step;
    # a probe takes none, so link now (the same call its step() makes).
    engine.optimizer._lazy_init_hp_params_optimizer_state()
    mine: dict[str, dict] = {key: {} for key in STATES}
    for name, param in engine.module.named_parameters():
        values = {"fp32": safe_get_full_fp32_param(param),
                  "exp_avg": safe_get_full_optimizer_state(param, "exp_avg"),
                  "exp_avg_sq": safe_get_full_optimizer_state(param, "exp_avg_sq")}
        for key, value in values.items():
            if value is None:
                raise RuntimeError(f"{name}: no {key} (not a ZeRO-1 / BF16_Optimizer parameter?)")
            mine[key][name] = _full_over_tp(value.detach().float().cpu().clone(), param)
    return mine


class _NoHeartbeat:
    """The probe trains nothing and no controller watches it: every heartbeat call is a no-op."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def main(run_dir: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    import bloom_kernels
    from orchestrator.contract import RunPaths
    from orchestrator.plan.config import load_config
    from trainer.launch import dist_env_from, init_distributed
    from trainer.loop import Overrides, Trainer

    torch.set_num_threads(1)
    cfg = load_config(RunPaths.of(run_dir).config)
    paths = RunPaths.of(run_dir, cfg.checkpoint.dir)  # as trainer.__main__ does
    env = dist_env_from(os.environ)
    init_distributed(env, "cpu")
    bloom_kernels.set_kernel_path(cfg.model.kernels)
    trainer = Trainer(cfg, paths, env, Overrides(), heartbeat=_NoHeartbeat())
    trainer.build()
    trainer.resume()
    engine = trainer.engine
    mine = gather_state(engine)
    adam_steps = sorted({float(s["step"]) for s in engine.optimizer.optimizer.state.values() if "step" in s})
    stage = engine.grid.get_stage_id()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (stage, mine, adam_steps))
    if dist.get_rank() == 0:
        merged: dict = {key: {} for key in STATES}
        steps: set = set()
        for _, state, adam in sorted(gathered, key=lambda item: item[0]):  # first stage first
            steps.update(adam)
            for key in STATES:
                for name, value in state[key].items():
                    merged[key].setdefault(name, value)
        torch.save({**merged, "adam_step": sorted(steps), "train_state": asdict(trainer.state),
                    "global_steps": engine.global_steps}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # DeepSpeed/gloo threads must not hold the exit
