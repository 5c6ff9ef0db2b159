"""Attention through `torch.nn.functional.scaled_dot_product_attention` with an additive ALiBi +
causal bias: what a user of plain PyTorch picks for ALiBi (SDPA has no ALiBi argument, and
is_causal cannot be combined with a bias). Measured beside ours; the dispatch takes it only where
the table says it is faster and correct.

    bias [h, sq, sk] = slope_h * (j - i_abs), -inf where j > i_abs     (i_abs = i + sk - sq)
The bias must have q's dtype (SDPA's rule), so in bf16 it is rounded: slope * distance loses
precision far from the diagonal. That is the library path as a user gets it; the benchmark's
correctness check against the fp32 reference decides whether it is good enough.
On CUDA a float bias selects the memory-efficient kernel (flash attention takes no bias); it keeps
an [h, sq, sk] tensor per shape, cached.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F

from bloom_kernels.attention.reference import alibi_relative_bias, check_attention_args

_BIASES: OrderedDict = OrderedDict()  # (id(slopes), version, sq, sk, causal, dtype, device) -> (slopes, bias)
_MAX_ENTRIES = 4  # each is h * sq * sk elements: a few shapes per run


def alibi_causal_bias(slopes: torch.Tensor, sq: int, sk: int, causal: bool, dtype: torch.dtype,
                      device: torch.device) -> torch.Tensor:
    key = (id(slopes), slopes._version, sq, sk, causal, dtype, device)
    entry = _BIASES.get(key)
    if entry is None:
        bias = alibi_relative_bias(slopes, sq, sk, device, q_start=sk - sq)  # fp32 [h, sq, sk]
        if causal:
            rows = torch.arange(sq, device=device)[:, None] + (sk - sq)
            bias = bias.masked_fill(torch.arange(sk, device=device)[None, :] > rows, float("-inf"))
        entry = (slopes, bias.to(dtype))
        _BIASES[key] = entry
        if len(_BIASES) > _MAX_ENTRIES:
            _BIASES.popitem(last=False)
    return entry[1]


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: torch.Tensor,
                   causal: bool = True, softmax_scale: float | None = None) -> torch.Tensor:
    """q [b,h,sq,d], k/v [b,h,sk,d], slopes fp32 [h] -> [b,h,sq,d] in q.dtype."""
    check_attention_args(q, k, v, alibi_slopes, causal)
    sq, sk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    bias = alibi_causal_bias(alibi_slopes, sq, sk, causal, q.dtype, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
