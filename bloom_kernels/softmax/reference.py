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


_MASKS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def causal_additive_mask(sq: int, sk: int, device: torch.device) -> torch.Tensor:
    """fp32 [sq, sk]: 0 where visible, finfo.min where masked (transformers' additive mask).

    Built once per (sq, sk, device) and cached (a few shapes per run; read-only, never requires
    grad). Added in place to the fresh fp32 scores: unlike masked_fill, an add has a free backward."""
    key = (sq, sk, torch.device(device))
    mask = _MASKS.get(key)
    if mask is None:
        if len(_MASKS) > 64:  # many shapes (generation tests): do not grow without bound
            _MASKS.clear()
        visible = causal_visible(sq, sk, device)
        mask = torch.zeros(sq, sk, dtype=torch.float32, device=device).masked_fill_(
            ~visible, torch.finfo(torch.float32).min)
        _MASKS[key] = mask
    return mask


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
    # scale * scores + alibi in one pass (alibi broadcast, not copied); the result is a fresh fp32
    # tensor, so the mask below is added in place (neither op's backward needs its output).
    if a3 is not None:
        x = torch.add(a3.float(), s3.float(), alpha=scale)
    elif scale != 1.0 or not causal:
        x = s3.float() * scale
    else:
        x = None  # scale 1, no alibi: the mask add below makes the fresh tensor
    if not causal:
        return torch.softmax(x, dim=-1).to(scores.dtype).view(scores.shape)
    sq, sk = s3.shape[-2], s3.shape[-1]
    mask = causal_additive_mask(sq, sk, s3.device)
    # finfo.min (not -inf) keeps fully masked rows finite; masked entries of a row that sees at
    # least one key underflow to exactly 0 in the output and in the gradient.
    x = s3.float() + mask if x is None else x.add_(mask)
    probs = torch.softmax(x, dim=-1)
    if sq > sk:  # rows that see no key at all (only then) would be uniform: make them zeros
        probs = probs * causal_visible(sq, sk, s3.device)
    return probs.to(scores.dtype).view(scores.shape)
