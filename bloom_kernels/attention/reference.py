"""Attention reference (materialises the [b, heads, sq, sk] score matrix): the definition.

  out = softmax(q k^T * scale + alibi, causal) v        q [b,h,sq,d], k/v [b,h,sk,d]

ALiBi: transformers' BLOOM adds slope_h * j (key position) to every row. Under a row softmax any
per-row constant cancels, so we add slope_h * (j - i_abs) instead (i_abs = i + sk - sq, the query's
position among the keys): same probabilities, but the bias is 0 on the diagonal and small nearby,
so fp32 keeps more precision on long sequences than with slope * 8000-sized offsets.
Computation in fp32, output in q.dtype. Causal needs sq <= sk (every query sees key 0).
"""

from __future__ import annotations

import math

import torch


def check_attention_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor,
                         causal: bool) -> None:
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [b,h,sq,d] and k, v [b,h,sk,d]; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if slopes.shape != (q.shape[1],):
        raise ValueError(f"alibi_slopes must be [heads] = [{q.shape[1]}], got {tuple(slopes.shape)}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"causal attention needs sq <= sk, got sq={q.shape[2]} sk={k.shape[2]}")


def alibi_relative_bias(slopes: torch.Tensor, sq: int, sk: int, device: torch.device,
                        q_start: int = 0) -> torch.Tensor:
    """fp32 [h, sq, sk]: slope_h * (j - i_abs) for queries q_start..q_start+sq (of the full sq)."""
    # i_abs = (q_start + i) + (sk_total - sq_total) is passed in via q_start by callers
    rows = torch.arange(q_start, q_start + sq, device=device, dtype=torch.float32)[:, None]
    cols = torch.arange(sk, device=device, dtype=torch.float32)[None, :]
    return slopes.float().to(device)[:, None, None] * (cols - rows)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: torch.Tensor,
                        causal: bool = True, softmax_scale: float | None = None) -> torch.Tensor:
    check_attention_args(q, k, v, alibi_slopes, causal)
    sq, sk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [b, h, sq, sk]
    scores = scores + alibi_relative_bias(alibi_slopes, sq, sk, q.device, q_start=sk - sq)
    if causal:
        rows = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        visible = torch.arange(sk, device=q.device)[None, :] <= rows
        scores = scores.masked_fill(~visible, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.float()).to(q.dtype)
