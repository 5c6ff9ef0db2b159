"""Vocab-parallel cross entropy (Megatron): the loss over logits split by vocabulary over TP ranks,
without gathering the [b, s, V] logits (V = 250,880 for BLOOM).

    logits_local [b, s, V/tp] (this rank's vocab range), labels [b, s] -> loss [b, s] fp32

Per token: loss = log(sum_v exp(z_v - max)) - (z_label - max), where max, the sum and z_label are
each reduced over the TP group. All math in fp32 whatever the logits dtype; equal to
F.cross_entropy(gathered logits, labels, reduction="none") up to fp32 rounding.

At tp = 1 there is nothing to reduce, so it IS `F.cross_entropy` on the fp32 logits: torch's fused
log-softmax + NLL (one pass each way), cheaper than the spelled-out max/exp/sum/divide.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from orchestrator.contract.client.progress import waited
from trainer.parallel import groups


def _all_reduce(x: torch.Tensor, op=dist.ReduceOp.SUM) -> None:
    if groups.get_tp_world_size() > 1:
        waited(dist.all_reduce, x, op=op, group=groups.get_tp_group())  # a wait for the TP peers


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits_local: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits_local.float()
        vocab_per_rank = logits.shape[-1]
        start = groups.get_tp_rank() * vocab_per_rank
        end = start + vocab_per_rank

        logits_max = logits.max(dim=-1).values  # [b, s]
        _all_reduce(logits_max, dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)

        # z_label - max: only the rank that owns the label has it; the others contribute 0.
        outside = (labels < start) | (labels >= end)
        local_labels = (labels - start).masked_fill(outside, 0)
        predicted = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        _all_reduce(predicted)

        exp = shifted.exp_()  # in place: `shifted` is a fresh tensor, not needed any more
        sum_exp = exp.sum(dim=-1)
        _all_reduce(sum_exp)
        loss = sum_exp.log() - predicted

        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_labels, outside)
        ctx.input_dtype = logits_local.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        # d loss / d z_v = softmax_v - [v == label], on this rank's vocab slice.
        # One pass over [b, s, V/tp]: grad * softmax, then -grad at the label (on its owner rank).
        softmax, local_labels, outside = ctx.saved_tensors
        grad_loss = grad_loss.float()
        grad = softmax * grad_loss.unsqueeze(-1)
        at_label = (-grad_loss).masked_fill_(outside, 0.0)
        grad.scatter_add_(-1, local_labels.unsqueeze(-1), at_label.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None


def vocab_parallel_cross_entropy(logits_local: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token loss [b, s] (fp32) from this rank's logits slice [b, s, V/tp] and labels [b, s]."""
    if logits_local.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits_local.shape)} and labels {tuple(labels.shape)} disagree: "
                         "expected logits [b, s, V/tp] and labels [b, s]")
    if groups.get_tp_world_size() == 1:
        vocab = logits_local.shape[-1]
        losses = F.cross_entropy(logits_local.float().reshape(-1, vocab), labels.reshape(-1), reduction="none")
        return losses.view(labels.shape)
    return _VocabParallelCrossEntropy.apply(logits_local, labels)
