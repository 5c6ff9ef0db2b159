"""DeepSpeed as the training engine: its config, the optimizer's parameter groups, initialize().

What DeepSpeed gives us here is what it gave BLOOM: the `PipelineEngine` (micro-batch schedule,
tied-embedding gradient reduce), ZeRO-1 data parallelism and the `BF16_Optimizer` (bf16 weights,
an fp32 master copy, fp32 gradient accumulation across micro-batches). In DeepSpeed 0.19 that
optimizer is selected by bf16 + ZeRO stage 1 + `data_types.grad_accum_dtype: fp32`. It computes
the global gradient norm (across TP/PP via the module's grid) and skips the step when the norm is
not finite; the engine then counts the skip (`engine.skipped_steps`) and, like Megatron, does not
advance the LR.

The LR is ours (`trainer.schedules`, by samples): it is written into every parameter group
before each step, so DeepSpeed gets no lr_scheduler. The batch-size rampup changes the engine's
gradient-accumulation steps with `PipelineEngine.set_train_batch_size`.

An fp32 model (`model.dtype: fp32`, for exact parallel-vs-single comparisons) runs without ZeRO
(DeepSpeed refuses ZeRO-0-less fp32 accumulation combos otherwise); non-finite steps are then
skipped by `guard_fp32_step` installed here, so both dtypes behave the same.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

log = logging.getLogger(__name__)

# Parameters that never get weight decay: biases and LayerNorm weights (Megatron's rule). We detect
# them by shape (1-D) and by an explicit attribute a layer may set on any parameter.
NO_WEIGHT_DECAY_ATTR = "no_weight_decay"


def wants_weight_decay(name: str, param: torch.nn.Parameter) -> bool:
    if getattr(param, NO_WEIGHT_DECAY_ATTR, False):
        return False
    # 1-D: every bias, every LayerNorm weight and bias. Embeddings and linear weights are 2-D.
    return param.dim() >= 2 and not name.endswith(".bias")


def split_by_size(params: list[torch.nn.Parameter], max_params: int) -> list[list[torch.nn.Parameter]]:
    """Consecutive chunks of `params` with at most `max_params` elements each. A single tensor larger
    than the limit cannot be split (the flat buffer holds whole tensors) and gets a chunk alone."""
    chunks: list[list[torch.nn.Parameter]] = []
    current: list[torch.nn.Parameter] = []
    current_size = 0
    for param in params:
        size = param.numel()
        if current and current_size + size > max_params:
            chunks.append(current)
            current, current_size = [], 0
        current.append(param)
        current_size += size
        if size > max_params:
            log.warning(
                "parameter of %d elements exceeds optimizer.max_group_params=%d: it gets its own group",
                size,
                max_params,
            )
    if current:
        chunks.append(current)
    return chunks


def build_param_groups(
    named_params: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float, max_group_params: int
) -> list[dict[str, Any]]:
    """Optimizer groups: decayed weights, then biases + LayerNorm without decay; each split so that no
    group (= one flat fp32 buffer in BF16_Optimizer) holds more than `max_group_params` elements.
    Each group carries a `name` for logs and tests."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        (decay if wants_weight_decay(name, param) else no_decay).append(param)
    groups: list[dict[str, Any]] = []
    for label, params, wd in (("decay", decay, weight_decay), ("no_decay", no_decay, 0.0)):
        for index, chunk in enumerate(split_by_size(params, max_group_params)):
            groups.append({"params": chunk, "weight_decay": wd, "name": f"{label}_{index}"})
    return groups


def deepspeed_config(cfg, micro_batches: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed JSON for this run. `micro_batches` = gradient-accumulation steps at start
    (the rampup's first batch); the loop changes it later with `set_global_batch`."""
    par = cfg.parallel
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": par.micro_batch_size,
        "gradient_accumulation_steps": micro_batches,
        "train_batch_size": par.micro_batch_size * micro_batches * cfg.dp,
        "gradient_clipping": cfg.optimizer.clip_grad,
        "steps_per_print": 10**9,  # our metrics.jsonl is the log; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
        "pipeline": {"activation_checkpoint_interval": 1 if par.activation_checkpointing else 0},
    }
    if bf16:
        ds["bf16"] = {"enabled": True}
        ds["zero_optimization"] = {"stage": par.zero_stage}
        ds["data_types"] = {"grad_accum_dtype": "fp32"}
    else:
        ds["zero_optimization"] = {"stage": 0}
    return ds


def build_optimizer(cfg, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    opt = cfg.optimizer
    # Decoupled weight decay (AdamW) = Megatron's Adam with --weight-decay. foreach=False keeps the
    # update a plain per-tensor loop: the same bits on every run, which exact resume relies on.
    return torch.optim.AdamW(
        groups,
        lr=opt.lr,
        betas=(opt.adam_beta1, opt.adam_beta2),
        eps=opt.adam_eps,
        weight_decay=opt.weight_decay,
        foreach=False,
    )


def initialize(cfg, module, micro_batches: int, load_universal: bool = False):
    """deepspeed.initialize with our groups and optimizer; returns the PipelineEngine.
    `load_universal`: the checkpoint to resume is a universal one (saved at another layout)."""
    import deepspeed

    bf16 = cfg.model.dtype == "bf16"
    groups = build_param_groups(module.named_parameters(), cfg.optimizer.weight_decay, cfg.optimizer.max_group_params)
    optimizer = build_optimizer(cfg, groups)
    config = deepspeed_config(cfg, micro_batches, bf16)
    if load_universal:
        if not bf16:
            from trainer.parallel.groups import LayoutError

            raise LayoutError("a universal checkpoint loads only through ZeRO-1 (model.dtype: bf16); "
                             "resume an fp32 run at the layout it was saved at")
        from trainer.universal import universal_load_config

        config.update(universal_load_config())
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    if not bf16:
        guard_fp32_step(engine)
    return engine


def set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def set_global_batch(engine, global_batch: int) -> None:
    """Change the number of micro-batches (gradient accumulation) of the next steps."""
    if engine.train_batch_size() != global_batch:
        engine.set_train_batch_size(global_batch)


def step_was_skipped(engine, skipped_before: int) -> bool:
    return engine.skipped_steps > skipped_before


def grad_norm(engine) -> float | None:
    value = engine.get_global_grad_norm()
    if value is None:
        return None
    return float(value.item() if torch.is_tensor(value) else value)


def wrap_instruction(engine, instruction: type, after: Callable[[Any], None] | None = None,
                     before: Callable[[Any], None] | None = None,
                     around: Callable[[], AbstractContextManager] | None = None) -> None:
    """Run `before(engine)` / `after(engine)` around one pipeline-schedule instruction (e.g.
    ReduceGrads, OptimizerStep) of this engine only, or the instruction inside `around()`.
    PipelineEngine dispatches through the class attribute `_INSTRUCTION_MAP`; an instance copy
    shadows it."""
    table = dict(engine._INSTRUCTION_MAP)
    inner = table[instruction]

    def wrapped(self, *args, **kwargs):
        if before is not None:
            before(self)
        with around() if around is not None else nullcontext():
            result = inner(self, *args, **kwargs)
        if after is not None:
            after(self)
        return result

    table[instruction] = wrapped
    engine._INSTRUCTION_MAP = table


def install_progress_marks(engine) -> None:
    """Count this rank's fine progress (orchestrator/contract/client/progress.py) in the pipeline schedule: a mark after
    each micro-batch forward (`eval` when the module is in eval mode: an eval or a probe) and
    backward, WAIT when the gradient reduce begins (this rank's share is done; the time there is
    its peers'), REDUCE when it ends, OPTIMIZER after the step. The pipeline's sends and receives
    are waits for the neighbouring stage (WAIT, then the unit it interrupted): a stage stuck in its
    own forward is then the one rank not waiting, and the controller names it (detection.behind;
    counts alone cannot, stages of a 1F1B schedule are at different counts at any moment). The
    instructions are DeepSpeed's own dispatch, so this is the real schedule, pipeline or not (pp = 1
    is a one-stage pipeline, with no sends or receives)."""
    from deepspeed.runtime.pipe import schedule

    from orchestrator.contract import Mark
    from orchestrator.contract.client.progress import mark, waiting

    def forward(eng) -> None:
        mark(Mark.FORWARD if eng.module.training else Mark.EVAL)

    wrap_instruction(engine, schedule.ForwardPass, after=forward)
    wrap_instruction(engine, schedule.BackwardPass, after=lambda eng: mark(Mark.BACKWARD))
    wrap_instruction(engine, schedule.ReduceTiedGrads, before=lambda eng: mark(Mark.WAIT))
    wrap_instruction(engine, schedule.ReduceGrads, after=lambda eng: mark(Mark.REDUCE))
    wrap_instruction(engine, schedule.OptimizerStep, after=lambda eng: mark(Mark.OPTIMIZER))
    for p2p in (schedule.SendActivation, schedule.RecvActivation, schedule.SendGrad, schedule.RecvGrad):
        wrap_instruction(engine, p2p, around=waiting)


# DeepSpeed's blocking collectives (deepspeed/comm/torch.py's TorchBackend): ZeRO-1's reduce-scatter
# and all-gather, the data-parallel gradient reduce, the tied-embedding reduce, the pipeline's
# sends and receives, the barriers of its checkpoint save and load. The non-blocking ones (isend,
# irecv) return at once and are left alone.
DEEPSPEED_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
    "broadcast_object_list", "all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced",
    "all_gather_object", "all_to_all_single", "all_to_all", "send", "recv", "gather", "scatter", "barrier",
    "monitored_barrier",
)


def install_collective_waits() -> list[str]:
    """Every collective DeepSpeed calls is a wait for the peers (orchestrator.contract.client.progress.waited), like
    ours (trainer/parallel/, trainer/checkpoint_format.py): a rank blocked in ZeRO's reduce-scatter
    or at a barrier is not the rank holding the others up. Every `deepspeed.comm.X` goes to the
    communication backend's `X` (comm.cdb, set by init_distributed), so the hooks are on that one
    object. Idempotent; returns the names wrapped this time."""
    from deepspeed.comm import comm

    from orchestrator.contract.client.progress import waited

    backend = comm.cdb
    wrapped: list[str] = []
    if backend is None:
        return wrapped
    for name in DEEPSPEED_COLLECTIVES:
        inner = getattr(backend, name, None)
        if inner is None or getattr(inner, "marks_wait", False):
            continue

        def collective(*args, _inner=inner, **kwargs):
            return waited(_inner, *args, **kwargs)

        collective.marks_wait = True
        setattr(backend, name, collective)
        wrapped.append(name)
    return wrapped


def uninstall_collective_waits() -> None:
    """Back to DeepSpeed's own calls (bench/progress_counting.py's side-by-side)."""
    from deepspeed.comm import comm

    backend = comm.cdb
    for name in DEEPSPEED_COLLECTIVES:
        if backend is not None and getattr(getattr(backend, name, None), "marks_wait", False):
            delattr(backend, name)


def install_replicated_grad_sync(engine, tp: int) -> None:
    """Average the gradients of TP-replicated parameters (LayerNorm, row-parallel biases) over the
    TP group right before each optimizer step, so their copies stay bit-identical (BLOOM saw them
    drift apart in bf16). The grads are wherever the optimizer reads them: the fp32 accumulation
    buffers (`param._hp_grad`) under BF16_Optimizer, `param.grad` otherwise."""
    if tp == 1:
        return
    from deepspeed.runtime.pipe import schedule

    from trainer.parallel.tensor_parallel import sync_replicated_params_grads, tp_replicated_parameters

    params = [p for _, p in tp_replicated_parameters(engine.module)]

    def sync(eng) -> None:
        if getattr(eng, "using_bf16_optimizer", False):
            grads = [p._hp_grad for p in params if getattr(p, "_hp_grad", None) is not None]
        else:
            grads = [p.grad for p in params if p.grad is not None]
        sync_replicated_params_grads(params, grads=grads)

    wrap_instruction(engine, schedule.OptimizerStep, before=sync)


def guard_fp32_step(engine) -> None:
    """fp32 runs have no BF16_Optimizer to compute the global norm and skip a non-finite step: do it
    here the same way (each gradient counted once across TP/PP, as BF16_Optimizer does; a non-finite
    norm zeroes the gradients, counts the skip and leaves the LR where it is)."""
    from deepspeed.runtime.pipe import schedule
    from deepspeed.runtime.utils import get_global_norm_of_tensors, is_model_parallel_parameter

    table = dict(engine._INSTRUCTION_MAP)
    inner = table[schedule.OptimizerStep]

    def guarded(self, *args, **kwargs):
        tp_rank = self.mpu.get_slice_parallel_rank() if self.mpu is not None else 0
        params = [p for p in self.module.parameters() if p.grad is not None]
        counted = [p.grad for p in params
                   if not getattr(p, "ds_pipe_replicated", False) and (tp_rank == 0 or is_model_parallel_parameter(p))]
        norm = float(get_global_norm_of_tensors(counted, mpu=self.mpu)) if counted else 0.0
        if not math.isfinite(norm) or norm < 0:  # DeepSpeed masks a NaN/inf norm as -1
            for p in params:
                p.grad.zero_()
            self.skipped_steps += 1
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            self._global_grad_norm = float("inf")
            return None
        self._pipeline_grad_norm = norm
        result = inner(self, *args, **kwargs)
        self._global_grad_norm = norm
        return result

    def clip_with_pipeline_norm() -> None:
        # DeepSpeed's own fp32 clipping (runtime.utils.clip_grad_norm_) counts non-TP parameters on
        # the first pipeline stage only and the tied embedding on both ends: with pp > 1 its clip
        # coefficient is off. Clip with the norm computed above instead (docs/parallelism.md).
        clip = engine.gradient_clipping()
        norm = engine._pipeline_grad_norm
        if clip > 0 and norm > clip:
            coef = clip / (norm + 1e-6)
            for p in engine.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)

    table[schedule.OptimizerStep] = guarded
    engine._INSTRUCTION_MAP = table
    engine.clip_fp32_gradients = clip_with_pipeline_norm
