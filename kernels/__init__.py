"""Fused ops for the BLOOM trainer: a plain-torch reference for each, Triton kernels, one dispatch.

    import kernels
    kernels.layer_norm(x, weight, bias, eps)          x [..., h]; fp32 statistics, output x.dtype
    kernels.bias_gelu(x, bias)                        tanh GeLU(x + bias), BLOOM's formula
    kernels.scale_mask_softmax(scores, scale, alibi=None, causal=True)
    kernels.attention(q, k, v, alibi_slopes, causal=True, softmax_scale=None)
    kernels.alibi_slopes(num_heads)
    kernels.set_kernel_path("auto"|"reference"|"triton"); kernels.current_path()
    kernels.set_attention_impl("auto"|"materialized"|"chunked")

Every op is autograd-capable on every path. `kernels.dispatch` explains how a path is chosen.
`import kernels` does not import triton (it is optional).
"""

from __future__ import annotations

import torch

from kernels import dispatch
from kernels.alibi import alibi_slopes, alibi_slopes_for_rank
from kernels.attention.chunked import attention_chunked
from kernels.attention.reference import attention_reference
from kernels.bias_gelu.reference import bias_gelu_reference
from kernels.dispatch import (
    current_attention_impl,
    current_path,
    kernel_path,
    set_attention_impl,
    set_kernel_path,
)
from kernels.layer_norm.reference import layer_norm_reference
from kernels.softmax.reference import scale_mask_softmax_reference

__all__ = [
    "alibi_slopes", "alibi_slopes_for_rank", "attention", "bias_gelu", "current_attention_impl",
    "current_path", "kernel_path", "layer_norm", "scale_mask_softmax", "set_attention_impl",
    "set_kernel_path",
]


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    if dispatch.path_for(x) == "triton":
        return dispatch.triton_ops(x.device.type).layer_norm_triton(x, weight, bias, eps)
    return layer_norm_reference(x, weight, bias, eps)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    if dispatch.path_for(x) == "triton":
        return dispatch.triton_ops(x.device.type).bias_gelu_triton(x, bias)
    return bias_gelu_reference(x, bias)


def scale_mask_softmax(scores: torch.Tensor, scale: float, alibi: torch.Tensor | None = None,
                       causal: bool = True) -> torch.Tensor:
    if dispatch.path_for(scores) == "triton":
        return dispatch.triton_ops(scores.device.type).scale_mask_softmax_triton(scores, scale, alibi, causal)
    return scale_mask_softmax_reference(scores, scale, alibi, causal)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: torch.Tensor,
              causal: bool = True, softmax_scale: float | None = None) -> torch.Tensor:
    """q, k, v [b, heads, s, head_dim] -> [b, heads, s, head_dim]; alibi_slopes fp32 [heads]."""
    impl = dispatch.attention_impl_for(q)
    if impl == "triton":
        return dispatch.triton_ops(q.device.type).attention_triton(q, k, v, alibi_slopes, causal, softmax_scale)
    if impl == "chunked":
        return attention_chunked(q, k, v, alibi_slopes, causal, softmax_scale)
    return attention_reference(q, k, v, alibi_slopes, causal, softmax_scale)
