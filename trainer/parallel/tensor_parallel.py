"""Megatron tensor-parallel layers, exact at tp = 1.

    ColumnParallelLinear   weight [out/tp, in]: each rank computes a slice of the output features
    RowParallelLinear      weight [out, in/tp]: partial sums all-reduced, THEN the (replicated) bias
    VocabParallelEmbedding weight [V/tp, h]: rows of this rank's vocab range, others give 0, all-reduced
    parallel_lm_logits     hidden [.., h] x embedding slice -> logits [.., V/tp] (no gather)

Weight init (Megatron's `_initialize_affine_weight_cpu`): every rank draws the FULL master weight
from a generator seeded by (init seed, parameter name) and keeps its slice. So a tp = 2 model has
exactly the weights of the tp = 1 model with the same seed, whatever the pp stage that builds the
layer, which is what makes the 3D loss-equality tests possible. The cost is a full-size temporary
per weight at build time (BLOOM-176B's embedding: 14 GB of fp32 CPU memory, once); real runs of
that size resume from a checkpoint anyway.

Parameter attributes (read by DeepSpeed and by our helpers):
    tensor_model_parallel = True, partition_dim, partition_stride   sliced over TP (DeepSpeed's
        grad-norm counts these on every TP rank, others only on TP rank 0)
    tp_replicated = True   identical copies on every TP rank (LayerNorm weights/biases, row-parallel
        biases); `sync_replicated_params_grads` keeps them identical (see below).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from orchestrator.contract.client.progress import waited
from trainer.parallel import groups
from trainer.parallel.mappings import (
    copy_to_tp_region,
    gather_from_tp_region,
    reduce_from_tp_region,
    scatter_to_tp_region,
)


def param_seed(init_seed: int, name: str) -> int:
    """A seed per parameter from the model seed and a stable name (same on every rank and stage)."""
    return zlib.crc32(f"{init_seed}/{name}".encode()) & 0x7FFF_FFFF


def master_normal(shape: tuple[int, ...], std: float, seed: int) -> torch.Tensor:
    """The full (unsliced) fp32 weight N(0, std^2) drawn from its own seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator)


def mark_tp_sliced(param: nn.Parameter, partition_dim: int, stride: int = 1) -> None:
    param.tensor_model_parallel = True
    param.partition_dim = partition_dim
    param.partition_stride = stride


def mark_tp_replicated(param: nn.Parameter) -> None:
    param.tensor_model_parallel = False
    param.tp_replicated = True


def _sliced_param(full: torch.Tensor, partition_dim: int, dtype: torch.dtype) -> nn.Parameter:
    size = groups.get_tp_world_size()
    if full.shape[partition_dim] % size:
        raise ValueError(f"dim {partition_dim} of a weight {tuple(full.shape)} is not divisible by tp = {size}")
    part = full.chunk(size, dim=partition_dim)[groups.get_tp_rank()]
    param = nn.Parameter(part.to(dtype).contiguous())
    mark_tp_sliced(param, partition_dim)
    return param


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's rows (output features) split over TP ranks.

    x [..., in] (replicated) -> y [..., out/tp], or [..., out] with gather_output.
    skip_bias_add: return (y without bias, bias slice) so the caller fuses it (bias_gelu).
    forward returns (output, bias or None), as Megatron's.
    """

    def __init__(self, input_size: int, output_size: int, *, bias: bool = True, gather_output: bool = False,
                 skip_bias_add: bool = False, init_std: float = 0.02, init_seed: int = 0, name: str = "column",
                 params_dtype: torch.dtype = torch.float32):
        super().__init__()
        tp = groups.get_tp_world_size()
        groups.require_tp_group(tp)
        self.input_size, self.output_size = input_size, output_size
        self.output_size_per_partition = output_size // tp
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        full = master_normal((output_size, input_size), init_std, param_seed(init_seed, name + ".weight"))
        self.weight = _sliced_param(full, 0, params_dtype)
        if bias:
            self.bias = _sliced_param(torch.zeros(output_size), 0, params_dtype)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, skip_bias_add: bool | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`skip_bias_add` overrides the constructor's choice for this call (None: keep it)."""
        skip = self.skip_bias_add if skip_bias_add is None else skip_bias_add
        x = copy_to_tp_region(x)
        y = F.linear(x, self.weight, None if skip else self.bias)  # addmm when the bias is added here
        if self.gather_output:
            y = gather_from_tp_region(y)
        return y, (self.bias if skip else None)


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's columns (input features) split over TP ranks.

    x [..., in/tp] (input_is_parallel) or [..., in] -> y [..., out], all-reduced; the bias is added
    AFTER the all-reduce (once, not tp times) and is replicated on the TP ranks.
    """

    def __init__(self, input_size: int, output_size: int, *, bias: bool = True, input_is_parallel: bool = True,
                 skip_bias_add: bool = False, init_std: float = 0.02, init_seed: int = 0, name: str = "row",
                 params_dtype: torch.dtype = torch.float32):
        super().__init__()
        tp = groups.get_tp_world_size()
        groups.require_tp_group(tp)
        self.input_size, self.output_size = input_size, output_size
        self.input_size_per_partition = input_size // tp
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add
        full = master_normal((output_size, input_size), init_std, param_seed(init_seed, name + ".weight"))
        self.weight = _sliced_param(full, 1, params_dtype)
        if bias:
            self.bias = nn.Parameter(torch.zeros(output_size, dtype=params_dtype))
            mark_tp_replicated(self.bias)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.input_is_parallel:
            x = scatter_to_tp_region(x)
        add_bias_here = self.bias is not None and not self.skip_bias_add
        if groups.get_tp_world_size() == 1:
            # No all-reduce in between: the bias goes into the GEMM (addmm), as nn.Linear does.
            return F.linear(x, self.weight, self.bias if add_bias_here else None), (
                None if add_bias_here else self.bias)
        y = reduce_from_tp_region(F.linear(x, self.weight))
        if not add_bias_here:
            return y, self.bias
        return y + self.bias, None


class VocabParallelEmbedding(nn.Module):
    """Embedding of a padded vocabulary split by rows over TP: ids [b, s] -> [b, s, h] (full, replicated).

    Each rank looks up the ids in its range [start, end), writes 0 for the others, and the
    all-reduce sums the one non-zero contribution. Any LayerNorm goes AFTER this (on full rows).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, init_std: float = 0.02, init_seed: int = 0,
                 name: str = "word_embeddings", params_dtype: torch.dtype = torch.float32):
        super().__init__()
        tp = groups.get_tp_world_size()
        groups.require_tp_group(tp)
        if num_embeddings % tp:
            raise ValueError(f"padded vocab size {num_embeddings} is not divisible by tp = {tp}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        per_rank = num_embeddings // tp
        self.vocab_start = groups.get_tp_rank() * per_rank
        self.vocab_end = self.vocab_start + per_rank
        full = master_normal((num_embeddings, embedding_dim), init_std, param_seed(init_seed, name + ".weight"))
        self.weight = _sliced_param(full, 0, params_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if groups.get_tp_world_size() == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local_ids = (input_ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local_ids, self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp_region(out)


def parallel_lm_logits(hidden: torch.Tensor, word_embedding_weight: torch.Tensor) -> torch.Tensor:
    """hidden [..., h] (replicated) x this rank's embedding rows [V/tp, h] -> logits [..., V/tp].

    The logits stay split over TP: `vocab_parallel_cross_entropy` consumes them without a gather.
    """
    return F.linear(copy_to_tp_region(hidden), word_embedding_weight)


# --- replicated parameters (LayerNorm, row-parallel biases) -----------------------------------------
# In exact arithmetic the TP copies of these parameters get identical gradients. In bf16 on real
# hardware they drifted apart in BLOOM (different reduction orders / kernels per rank), and once they
# differ nothing pulls them back. Averaging their gradients over the TP group before every optimizer
# step makes the updates bit-identical on all TP ranks (the optimizer is deterministic), so the copies
# stay identical; `broadcast_replicated_params` re-syncs the values (after loading, or as a repair).
# With DeepSpeed's pipeline engine + BF16_Optimizer, checked on tp=2 x pp=2: wrap the optimizer's step,
#     step = engine.optimizer.step
#     engine.optimizer.step = lambda *a, **k: (sync_replicated_params_grads(engine.module), step(*a, **k))[1]
# (the fp32 `_hp_grad` buffers are synced before the clip and the update; every TP rank calls it).

def tp_replicated_parameters(module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    for name, param in module.named_parameters():
        if getattr(param, "tp_replicated", False):
            yield name, param


def _coalesced(tensors: list[torch.Tensor], op) -> None:
    """Run collective `op` on one flat buffer per dtype and copy the results back."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        op(flat)
        for t, synced in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            t.copy_(synced)


def _grad_of(param: nn.Parameter) -> torch.Tensor | None:
    """The gradient the optimizer will use: DeepSpeed's BF16_Optimizer accumulates it in fp32 and
    links it as `param._hp_grad` (the bf16 `.grad` may already be cleared); otherwise `.grad`."""
    hp_grad = getattr(param, "_hp_grad", None)
    return hp_grad if hp_grad is not None else param.grad


def sync_replicated_params_grads(module_or_params: nn.Module | Iterable[nn.Parameter], grads=None) -> int:
    """Average the gradients of TP-replicated parameters over the TP group. Call it on every TP rank
    after the last backward of a step and before the optimizer step (with DeepSpeed's BF16_Optimizer:
    after its fp32 accumulation, i.e. before `engine.step()`/the pipeline's optimizer step; the fp32
    `_hp_grad` buffers are the ones synced). `grads` (optional) replaces that choice. Returns how
    many tensors were synced; a no-op at tp = 1."""
    if isinstance(module_or_params, nn.Module):
        params = [p for _, p in tp_replicated_parameters(module_or_params)]
    else:
        params = [p for p in module_or_params if getattr(p, "tp_replicated", False)]
    if grads is not None:
        tensors = list(grads)
    else:
        tensors = [g for g in map(_grad_of, params) if g is not None]
    size = groups.get_tp_world_size()
    if size == 1 or not tensors:
        return 0

    def average(flat: torch.Tensor) -> None:
        waited(dist.all_reduce, flat, group=groups.get_tp_group())  # a wait for the TP peers
        flat.div_(size)

    _coalesced(tensors, average)
    return len(tensors)


@torch.no_grad()
def broadcast_replicated_params(module: nn.Module) -> int:
    """Copy TP rank 0's values of every replicated parameter to the other TP ranks."""
    params = [p.data for _, p in tp_replicated_parameters(module)]
    if groups.get_tp_world_size() == 1 or not params:
        return 0
    _coalesced(params, lambda flat: waited(dist.broadcast, flat, src=groups.get_tp_src_rank(), group=groups.get_tp_group()))
    return len(params)


@torch.no_grad()
def replicated_params_max_diff(module: nn.Module) -> float:
    """Max |p - p on TP rank 0| over replicated parameters and TP ranks (0.0 = identical): a monitor."""
    params = [p.data.float() for _, p in tp_replicated_parameters(module)]
    if groups.get_tp_world_size() == 1 or not params:
        return 0.0
    mine = _flatten_dense_tensors(params)
    reference = mine.clone()
    waited(dist.broadcast, reference, src=groups.get_tp_src_rank(), group=groups.get_tp_group())
    diff = (mine - reference).abs().max()
    waited(dist.all_reduce, diff, op=dist.ReduceOp.MAX, group=groups.get_tp_group())
    return float(diff)
