"""Autograd functions that move activations into and out of the tensor-parallel region (Megatron).

    copy_to_tp_region       forward: identity          backward: all-reduce (sum) over TP
    reduce_from_tp_region   forward: all-reduce (sum)  backward: identity
    scatter_to_tp_region    forward: keep my slice of the last dim   backward: all-gather last dim
    gather_from_tp_region   forward: all-gather last dim             backward: keep my slice

At tp = 1 all four are the identity and touch no process group (single-process use). Every
collective is a wait for the TP peers (orchestrator.contract.client.progress.waited): a rank blocked in one is not the
rank holding the group up.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from orchestrator.contract.client.progress import waited
from trainer.parallel import groups


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    if groups.get_tp_world_size() == 1:
        return x
    x = x.contiguous()
    waited(dist.all_reduce, x, group=groups.get_tp_group())
    return x


def _split_last_dim(x: torch.Tensor) -> torch.Tensor:
    size = groups.get_tp_world_size()
    if size == 1:
        return x
    if x.shape[-1] % size:
        raise ValueError(f"last dim {x.shape[-1]} is not divisible by tp = {size}")
    return x.chunk(size, dim=-1)[groups.get_tp_rank()].contiguous()


def _gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    size = groups.get_tp_world_size()
    if size == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    waited(dist.all_gather, parts, x, group=groups.get_tp_group())
    return torch.cat(parts, dim=-1)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone())


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _all_reduce(x.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _split_last_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last_dim(grad)


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _gather_last_dim(x)

    @staticmethod
    def backward(ctx, grad):
        return _split_last_dim(grad)


def copy_to_tp_region(x: torch.Tensor) -> torch.Tensor:
    return x if groups.get_tp_world_size() == 1 else _CopyToTP.apply(x)


def reduce_from_tp_region(x: torch.Tensor) -> torch.Tensor:
    return x if groups.get_tp_world_size() == 1 else _ReduceFromTP.apply(x)


def scatter_to_tp_region(x: torch.Tensor) -> torch.Tensor:
    return x if groups.get_tp_world_size() == 1 else _ScatterToTP.apply(x)


def gather_from_tp_region(x: torch.Tensor) -> torch.Tensor:
    return x if groups.get_tp_world_size() == 1 else _GatherFromTP.apply(x)
