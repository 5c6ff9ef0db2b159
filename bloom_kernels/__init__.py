"""Fused ops for the BLOOM trainer: a plain-torch reference for each, Triton kernels, one dispatch.

    import bloom_kernels
    bloom_kernels.layer_norm(x, weight, bias, eps)          x [..., h]; fp32 statistics, output x.dtype
    bloom_kernels.bias_gelu(x, bias)                        tanh GeLU(x + bias), BLOOM's formula
    bloom_kernels.scale_mask_softmax(scores, scale, alibi=None, causal=True)
    bloom_kernels.attention(q, k, v, alibi_slopes, causal=True, softmax_scale=None)
    bloom_kernels.alibi_slopes(num_heads)
    bloom_kernels.set_kernel_path("auto"|"reference"|"triton"); bloom_kernels.current_path()
    bloom_kernels.set_attention_impl("auto"|"materialized"|"chunked"|"triton"|"flex"|"sdpa"|"compiled")

Every op is autograd-capable on every path (FlexAttention: forward only on CPU). `bloom_kernels.dispatch`
explains how an implementation is chosen (a measured table, bloom_kernels/dispatch_table.json).
`import bloom_kernels` does not import triton (it is optional).
"""

from __future__ import annotations

import torch

from bloom_kernels import dispatch, implementations
from bloom_kernels.alibi import alibi_slopes, alibi_slopes_for_rank
from bloom_kernels.dispatch import (
    current_attention_impl,
    current_path,
    kernel_path,
    set_attention_impl,
    set_kernel_path,
)

__all__ = [
    "alibi_slopes", "alibi_slopes_for_rank", "attention", "bias_gelu", "current_attention_impl",
    "current_path", "kernel_path", "layer_norm", "scale_mask_softmax", "set_attention_impl",
    "set_kernel_path",
]


def _run(op: str, *args):
    """Run `op` with the implementation the dispatch picks for its tensor arguments."""
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    impl = dispatch.implementation_for(op, *tensors)
    return implementations.implementation(op, impl, tensors[0].device.type)(*args)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return _run("layer_norm", x, weight, bias, eps)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _run("bias_gelu", x, bias)


def scale_mask_softmax(scores: torch.Tensor, scale: float, alibi: torch.Tensor | None = None,
                       causal: bool = True) -> torch.Tensor:
    return _run("scale_mask_softmax", scores, scale, alibi, causal)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: torch.Tensor,
              causal: bool = True, softmax_scale: float | None = None) -> torch.Tensor:
    """q, k, v [b, heads, s, head_dim] -> [b, heads, s, head_dim]; alibi_slopes fp32 [heads]."""
    return _run("attention", q, k, v, alibi_slopes, causal, softmax_scale)
