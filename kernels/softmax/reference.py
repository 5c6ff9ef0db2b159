"""scale + ALiBi + causal mask + softmax reference: the definition the Triton kernel must match.

  probs = softmax(scores * scale + alibi, masked causally), computed in fp32, returned in
  scores.dtype.

Causal mask: query row i sees key j iff j <= i + (sk - sq), i.e. the queries are the LAST sq
positions of the sk keys (this is what generation with a KV cache needs, and equals the plain lower
triangle when sq == sk). Rows that see no key at all (only possible when sq > sk) are all zeros,
not NaN. Masked entries are exactly 0. `alibi` is an additive constant: it gets no gradient.
"""

from __future__ import annotations

import torch


def causal_visible(sq: int, sk: int, device: torch.device) -> torch.Tensor:
    """Bool [sq, sk]: True where query i may attend to key j (keys aligned to the end)."""
    rows = torch.arange(sq, device=device)[:, None] + (sk - sq)
    cols = torch.arange(sk, device=device)[None, :]
    return cols <= rows


def as_batched_3d(scores: torch.Tensor, alibi: torch.Tensor | None):
    """[b, h, sq, sk] or [bh, sq, sk] scores (+ alibi) -> 3-D views; alibi broadcast, never copied
    unless its layout forces it."""
    if scores.dim() not in (3, 4):
        raise ValueError(f"scores must be [b*heads, sq, sk] or [b, heads, sq, sk], got {tuple(scores.shape)}")
    if alibi is not None:
        if scores.dim() == 4 and alibi.dim() == 3 and alibi.shape[0] == scores.shape[0] * scores.shape[1]:
            alibi = alibi.view(scores.shape[0], scores.shape[1], *alibi.shape[1:])
        alibi = torch.broadcast_to(alibi, scores.shape)
    if scores.dim() == 4:
        b, h, sq, sk = scores.shape
        scores = scores.reshape(b * h, sq, sk)
        alibi = alibi.reshape(b * h, sq, sk) if alibi is not None else None
    return scores, alibi


def scale_mask_softmax_reference(scores: torch.Tensor, scale: float, alibi: torch.Tensor | None = None,
                                 causal: bool = True) -> torch.Tensor:
    """scores [b*h, sq, sk] or [b, h, sq, sk]; alibi broadcastable to it (or BLOOM's [b*h, 1, sk])."""
    s3, a3 = as_batched_3d(scores, alibi)
    x = s3.float() * scale
    if a3 is not None:
        x = x + a3.float()
    if not causal:
        return torch.softmax(x, dim=-1).to(scores.dtype).view(scores.shape)
    visible = causal_visible(x.shape[-2], x.shape[-1], x.device)
    # finfo.min (not -inf) keeps fully masked rows finite; multiplying by `visible` zeroes them
    # and makes masked entries exactly 0 in the output and in the gradient.
    x = x.masked_fill(~visible, torch.finfo(torch.float32).min)
    return (torch.softmax(x, dim=-1) * visible).to(scores.dtype).view(scores.shape)
