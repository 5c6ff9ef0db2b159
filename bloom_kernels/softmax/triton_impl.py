"""scale + ALiBi + causal mask + softmax in Triton, for any sq and sk.

One program per (tile of ROWS query rows, batch*head). Rows are streamed in BLOCK_K key chunks
twice: pass 1 keeps an online (per-lane) max and sum of exp, pass 2 writes the normalised
probabilities. So sk is not
limited by registers (Megatron's kernel stopped at sk = 16384 and needed sq % 4 == 0); for
sk <= BLOCK_K the second read hits cache. Backward: dx = scale * y * (dy - sum(dy * y)), same two
passes, from the saved output y (as Megatron does). alibi is a constant (no gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bloom_kernels._triton_common import INTERPRETED, next_pow2
from bloom_kernels.softmax.reference import as_batched_3d


@triton.jit
def _softmax_fwd(S, A, Y, sq, sk, stride_ab, stride_aq, stride_ak, scale,
                 HAS_ALIBI: tl.constexpr, CAUSAL: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    # a tile of ROWS query rows x BLOCK_K keys; per-row state is kept per lane, [ROWS, BLOCK_K]
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    bh = tl.program_id(1).to(tl.int64)
    row_ok = rows < sq
    base = (bh * sq + rows) * sk  # [ROWS]
    a_base = bh * stride_ab + rows * stride_aq
    if CAUSAL:
        end = tl.minimum(rows + sk - sq + 1, sk)  # keys < end are visible, per row
    else:
        end = tl.zeros([ROWS], dtype=tl.int32) + sk
    end = tl.where(row_ok, end, 0)
    tile_end = tl.max(end, axis=0)
    lanes = tl.arange(0, BLOCK_K)
    m_lane = tl.full([ROWS, BLOCK_K], float("-inf"), tl.float32)
    l_lane = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    for start in range(0, tile_end, BLOCK_K):
        cols = start + lanes
        valid = cols[None, :] < end[:, None]
        s = tl.load(S + base[:, None] + cols[None, :], mask=valid, other=0.0).to(tl.float32) * scale
        if HAS_ALIBI:
            s += tl.load(A + a_base[:, None] + cols[None, :] * stride_ak, mask=valid, other=0.0).to(tl.float32)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_lane, s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoid (-inf) - (-inf) = nan
        l_lane = l_lane * tl.exp(m_lane - m_safe) + tl.exp(s - m_safe)
        m_lane = m_new
    m_row = tl.max(m_lane, axis=1)
    m_row = tl.where(m_row == float("-inf"), 0.0, m_row)
    l_row = tl.sum(l_lane * tl.exp(m_lane - m_row[:, None]), axis=1)
    # a row with no visible key has l_row = 0: every entry is masked below, so any inv will do
    inv = 1.0 / tl.where(l_row > 0.0, l_row, 1.0)
    for start in range(0, sk, BLOCK_K):
        cols = start + lanes
        in_row = row_ok[:, None] & (cols[None, :] < sk)
        valid = cols[None, :] < end[:, None]
        s = tl.load(S + base[:, None] + cols[None, :], mask=valid, other=0.0).to(tl.float32) * scale
        if HAS_ALIBI:
            s += tl.load(A + a_base[:, None] + cols[None, :] * stride_ak, mask=valid, other=0.0).to(tl.float32)
        y = tl.where(valid, tl.exp(s - m_row[:, None]) * inv[:, None], 0.0)
        tl.store(Y + base[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=in_row)


@triton.jit
def _softmax_bwd(Y, DY, DX, sq, sk, scale, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    bh = tl.program_id(1).to(tl.int64)
    row_ok = rows < sq
    base = (bh * sq + rows) * sk
    lanes = tl.arange(0, BLOCK_K)
    acc = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    for start in range(0, sk, BLOCK_K):
        cols = start + lanes
        mask = row_ok[:, None] & (cols[None, :] < sk)
        y = tl.load(Y + base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += y * dy
    dot = tl.sum(acc, axis=1)
    for start in range(0, sk, BLOCK_K):
        cols = start + lanes
        mask = row_ok[:, None] & (cols[None, :] < sk)
        y = tl.load(Y + base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dx = scale * y * (dy - dot[:, None])
        tl.store(DX + base[:, None] + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)


def _tiles(sq: int, sk: int) -> tuple[int, int]:
    """(ROWS, BLOCK_K): the interpreter pays per program, so it gets 16-row tiles of 32 keys (also
    several key blocks per row in the tests); on a GPU a tile holds up to 4096 elements."""
    if INTERPRETED:
        return min(16, next_pow2(sq)), min(next_pow2(sk), 32)
    block_k = min(next_pow2(sk), 4096)
    return min(max(1, 4096 // block_k), next_pow2(sq)), block_k


def _num_warps(tile: int) -> int:
    return min(max(tile // 256, 1), 16)


class ScaleMaskSoftmaxTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, scale, alibi, causal):
        shape = scores.shape
        s3, a3 = as_batched_3d(scores, alibi)
        s3 = s3.contiguous()
        bh, sq, sk = s3.shape
        y = torch.empty_like(s3)
        rows, block_k = _tiles(sq, sk)
        if s3.numel() > 0:
            a_arg = a3 if a3 is not None else s3  # dummy pointer when there is no alibi
            a_strides = a3.stride() if a3 is not None else (0, 0, 0)
            _softmax_fwd[(triton.cdiv(sq, rows), bh)](
                s3, a_arg, y, sq, sk, a_strides[0], a_strides[1], a_strides[2], float(scale),
                HAS_ALIBI=a3 is not None, CAUSAL=bool(causal), ROWS=rows, BLOCK_K=block_k,
                num_warps=_num_warps(rows * block_k))
        ctx.save_for_backward(y)
        ctx.scale, ctx.shape = float(scale), shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        bh, sq, sk = y.shape
        dy3 = dy.reshape(bh, sq, sk).contiguous()
        dx = torch.empty_like(y)
        rows, block_k = _tiles(sq, sk)
        if y.numel() > 0:
            _softmax_bwd[(triton.cdiv(sq, rows), bh)](y, dy3, dx, sq, sk, ctx.scale, ROWS=rows, BLOCK_K=block_k,
                                                      num_warps=_num_warps(rows * block_k))
        return dx.view(ctx.shape), None, None, None


def scale_mask_softmax_triton(scores: torch.Tensor, scale: float, alibi: torch.Tensor | None = None,
                              causal: bool = True) -> torch.Tensor:
    return ScaleMaskSoftmaxTriton.apply(scores, scale, alibi, causal)
