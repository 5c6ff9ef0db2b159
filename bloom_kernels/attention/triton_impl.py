"""Causal ALiBi flash attention in Triton (FlashAttention-2 schedule): forward and backward.

Never builds the [sq, sk] matrix: forward keeps, per BLOCK_M queries, a running max m, sum l and
output accumulator over BLOCK_N key tiles, and stores out plus the row log-sum-exp (LSE, log2
domain) [b*h, sq] fp32. Backward recomputes P from the LSE: one kernel per key tile accumulates
dK, dV over query tiles; one per query tile accumulates dQ over key tiles (no atomics).
Scores live in the log2 domain (exp2 is the fast instruction): s2 = (q.k * scale + slope*(j-i_abs))
* log2(e). Semantics are exactly `attention_reference` (relative ALiBi, end-aligned causal mask).
q/k/v are made contiguous [b, h, s, d]; any head_dim works (padded to a power of two >= 16).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from bloom_kernels._triton_common import INTERPRETED, next_pow2
from bloom_kernels.attention.reference import check_attention_args

LOG2E = 1.4426950408889634


@triton.jit
def _attn_fwd(Q, K, V, Slopes, Out, LSE, H, SQ, SK, D, qk_scale,
              CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr,
              PRECISION: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(Slopes + bh % H) * 1.4426950408889634
    offset = SK - SQ
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = bh.to(tl.int64) * SQ * D
    k_base = bh.to(tl.int64) * SK * D
    q = tl.load(Q + q_base + rows[:, None] * D + offs_d[None, :],
                mask=(rows[:, None] < SQ) & (offs_d[None, :] < D), other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    q_pos = rows + offset  # query position among the keys
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = SK
    if CAUSAL:
        hi = tl.minimum(SK, (start_m + 1) * BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < SK) & (offs_d[None, :] < D)
        k = tl.load(K + k_base + cols[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + k_base + cols[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        alibi = slope * (cols[None, :] - q_pos[:, None]).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale + alibi
        valid = cols[None, :] < SK
        if CAUSAL:
            valid = valid & (cols[None, :] <= q_pos[:, None])
        s = tl.where(valid, s, float("-inf"))
        # key 0 is visible to every row and lies in the first tile, so m_new is finite from then on
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(Out + q_base + rows[:, None] * D + offs_d[None, :], acc.to(Out.dtype.element_ty),
             mask=(rows[:, None] < SQ) & (offs_d[None, :] < D))
    tl.store(LSE + bh.to(tl.int64) * SQ + rows, m_i + tl.log2(l_i), mask=rows < SQ)


@triton.jit
def _attn_bwd_delta(Out, DO, Delta, SQ, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    # delta_i = sum_d dO_id * O_id (= sum_j P_ij dP_ij), the row term of the softmax backward
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < SQ) & (offs_d[None, :] < D)
    ptrs = bh * SQ * D + rows[:, None] * D + offs_d[None, :]
    o = tl.load(Out + ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Delta + bh * SQ + rows, tl.sum(o * do, axis=1), mask=rows < SQ)


@triton.jit
def _attn_bwd_dkdv(Q, K, V, Slopes, DO, DK, DV, LSE, Delta, H, SQ, SK, D, qk_scale, sm_scale,
                   CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr,
              PRECISION: tl.constexpr):
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(Slopes + bh % H) * 1.4426950408889634
    offset = SK - SQ
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = bh.to(tl.int64) * SQ * D
    k_base = bh.to(tl.int64) * SK * D
    kv_mask = (cols[:, None] < SK) & (offs_d[None, :] < D)
    k = tl.load(K + k_base + cols[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + k_base + cols[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    # causal: queries at positions < start of this key tile cannot see it
    lo = 0
    if CAUSAL:
        lo = (tl.maximum(start_n * BLOCK_N - offset, 0) // BLOCK_M) * BLOCK_M
    for start_m in range(lo, SQ, BLOCK_M):
        rows = start_m + offs_m
        q_mask = (rows[:, None] < SQ) & (offs_d[None, :] < D)
        q = tl.load(Q + q_base + rows[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + q_base + rows[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        lse = tl.load(LSE + bh.to(tl.int64) * SQ + rows, mask=rows < SQ, other=0.0)
        delta = tl.load(Delta + bh.to(tl.int64) * SQ + rows, mask=rows < SQ, other=0.0)
        q_pos = rows + offset
        # transposed scores sT [BLOCK_N, BLOCK_M], so that dK/dV accumulate without transposing
        alibi_t = slope * (cols[:, None] - q_pos[None, :]).to(tl.float32)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale + alibi_t
        valid = (rows[None, :] < SQ) & (cols[:, None] < SK)
        if CAUSAL:
            valid = valid & (cols[:, None] <= q_pos[None, :])
        p_t = tl.where(valid, tl.exp2(s_t - lse[None, :]), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)
    tl.store(DK + k_base + cols[:, None] * D + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + k_base + cols[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _attn_bwd_dq(Q, K, V, Slopes, DO, DQ, LSE, Delta, H, SQ, SK, D, qk_scale, sm_scale,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, DOT_FP32: tl.constexpr,
              PRECISION: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    slope = tl.load(Slopes + bh % H) * 1.4426950408889634
    offset = SK - SQ
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = bh.to(tl.int64) * SQ * D
    k_base = bh.to(tl.int64) * SK * D
    q_mask = (rows[:, None] < SQ) & (offs_d[None, :] < D)
    q = tl.load(Q + q_base + rows[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + q_base + rows[:, None] * D + offs_d[None, :], mask=q_mask, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + bh.to(tl.int64) * SQ + rows, mask=rows < SQ, other=0.0)
    delta = tl.load(Delta + bh.to(tl.int64) * SQ + rows, mask=rows < SQ, other=0.0)
    q_pos = rows + offset
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = SK
    if CAUSAL:
        hi = tl.minimum(SK, (start_m + 1) * BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols[:, None] < SK) & (offs_d[None, :] < D)
        k = tl.load(K + k_base + cols[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + k_base + cols[:, None] * D + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        alibi = slope * (cols[None, :] - q_pos[:, None]).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale + alibi
        valid = (rows[:, None] < SQ) & (cols[None, :] < SK)
        if CAUSAL:
            valid = valid & (cols[None, :] <= q_pos[:, None])
        p = tl.where(valid, tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + q_base + rows[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=q_mask)


def _config(head_dim: int, dtype: torch.dtype) -> dict:
    block_d = max(16, next_pow2(head_dim))
    if INTERPRETED:  # small tiles: the tests then cover several tiles and ragged edges cheaply
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_D=block_d, DOT_FP32=True, PRECISION="ieee")
    big = block_d <= 64
    # fp32 inputs: exact fp32 products ("ieee"), not tf32, so fp32 matches the reference to ~1e-6
    precision = "ieee" if dtype == torch.float32 else "tf32"
    return dict(BLOCK_M=128 if big else 64, BLOCK_N=64, BLOCK_D=block_d, DOT_FP32=False, PRECISION=precision,
                num_warps=4 if big else 8, num_stages=2)


class FlashAttentionTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, slopes, causal, scale):
        b, h, sq, d = q.shape
        sk = k.shape[2]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        slopes = slopes.to(device=q.device, dtype=torch.float32).contiguous()
        out = torch.empty_like(q)
        lse = torch.empty(b * h, sq, dtype=torch.float32, device=q.device)
        cfg = _config(d, q.dtype)
        grid = (triton.cdiv(sq, cfg["BLOCK_M"]), b * h)
        _attn_fwd[grid](q, k, v, slopes, out, lse, h, sq, sk, d, scale * LOG2E, CAUSAL=causal, **cfg)
        ctx.save_for_backward(q, k, v, slopes, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, out, lse = ctx.saved_tensors
        b, h, sq, d = q.shape
        sk = k.shape[2]
        do = grad_out.contiguous()
        cfg = _config(d, q.dtype)
        delta = torch.empty_like(lse)
        _attn_bwd_delta[(triton.cdiv(sq, cfg["BLOCK_M"]), b * h)](out, do, delta, sq, d,
                                                                   BLOCK_M=cfg["BLOCK_M"], BLOCK_D=cfg["BLOCK_D"])
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        args = (h, sq, sk, d, ctx.scale * LOG2E, ctx.scale)
        _attn_bwd_dkdv[(triton.cdiv(sk, cfg["BLOCK_N"]), b * h)](q, k, v, slopes, do, dk, dv, lse, delta, *args,
                                                                  CAUSAL=ctx.causal, **cfg)
        _attn_bwd_dq[(triton.cdiv(sq, cfg["BLOCK_M"]), b * h)](q, k, v, slopes, do, dq, lse, delta, *args,
                                                                CAUSAL=ctx.causal, **cfg)
        return dq, dk, dv, None, None, None


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: torch.Tensor,
                     causal: bool = True, softmax_scale: float | None = None) -> torch.Tensor:
    check_attention_args(q, k, v, alibi_slopes, causal)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
    return FlashAttentionTriton.apply(q, k, v, alibi_slopes, bool(causal), float(scale))
