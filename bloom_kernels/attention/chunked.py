"""Memory-linear attention in plain torch: the flash-attention algorithm, one query chunk at a time.

Forward: for each chunk of `chunk` queries, scores against the keys it can see ([b,h,chunk,<=sk]),
log-sum-exp per row, output. Only `out` and the row LSE ([b,h,sq] fp32) are kept for backward.
Backward recomputes each chunk's probabilities from the LSE, so no [sq, sk] tensor ever exists:
peak extra memory is O(b*h*chunk*sk) per step, linear in the sequence length for a fixed chunk.

This is the CPU path for long sequences (the Triton kernel does the same with key blocks too).
Semantics are those of `attention_reference` (fp32 math, relative ALiBi, end-aligned causal mask).
FlexAttention is no substitute on CPU: compiled it needs inductor's C++ build (minutes on a 2-core
machine), and eagerly torch runs it unfused and forward only (it is a GPU candidate: flex.py).
"""

from __future__ import annotations

import math

import torch

from bloom_kernels.attention.reference import alibi_relative_bias, check_attention_args

DEFAULT_CHUNK = 512  # [b, h, 512, sk] fp32 per step: 16 MiB per head at sk = 8192


def _chunk_scores(q_chunk, k, slopes, q_start_abs, causal, scale):
    """fp32 scores [b,h,c,kend] for queries at absolute positions q_start_abs.. (keys 0..kend)."""
    c = q_chunk.shape[2]
    kend = min(k.shape[2], q_start_abs + c) if causal else k.shape[2]
    s = torch.matmul(q_chunk, k[:, :, :kend].transpose(-1, -2)) * scale
    s = s + alibi_relative_bias(slopes, c, kend, q_chunk.device, q_start=q_start_abs)
    if causal:
        rows = torch.arange(q_start_abs, q_start_abs + c, device=s.device)[:, None]
        visible = torch.arange(kend, device=s.device)[None, :] <= rows
        s = s.masked_fill(~visible, float("-inf"))
    return s, kend


class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, slopes, causal, scale, chunk):
        sq, sk = q.shape[2], k.shape[2]
        offset = sk - sq
        kf, vf = k.float(), v.float()
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        for start in range(0, sq, chunk):
            end = min(sq, start + chunk)
            s, kend = _chunk_scores(q[:, :, start:end].float(), kf, slopes, start + offset, causal, scale)
            row_lse = torch.logsumexp(s, dim=-1)
            out[:, :, start:end] = torch.matmul(torch.exp(s - row_lse[..., None]), vf[:, :, :kend])
            lse[:, :, start:end] = row_lse
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, slopes, out, lse)
        ctx.causal, ctx.scale, ctx.chunk = causal, scale, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, out, lse = ctx.saved_tensors
        sq, sk = q.shape[2], k.shape[2]
        offset = sk - sq
        kf, vf, go = k.float(), v.float(), grad_out.float()
        # delta_i = sum_d dO_i * O_i = sum_j P_ij dP_ij: the softmax backward's row term
        delta = (go * out.float()).sum(dim=-1)
        dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for start in range(0, sq, ctx.chunk):
            end = min(sq, start + ctx.chunk)
            qc = q[:, :, start:end].float()
            s, kend = _chunk_scores(qc, kf, slopes, start + offset, ctx.causal, ctx.scale)
            p = torch.exp(s - lse[:, :, start:end, None])  # [b,h,c,kend]
            goc = go[:, :, start:end]
            dv[:, :, :kend] += torch.matmul(p.transpose(-1, -2), goc)
            dp = torch.matmul(goc, vf[:, :, :kend].transpose(-1, -2))
            ds = p * (dp - delta[:, :, start:end, None]) * ctx.scale
            dq[:, :, start:end] = torch.matmul(ds, kf[:, :, :kend])
            dk[:, :, :kend] += torch.matmul(ds.transpose(-1, -2), qc)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: torch.Tensor,
                      causal: bool = True, softmax_scale: float | None = None,
                      chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """Same contract as `attention_reference`; memory linear in the sequence length."""
    check_attention_args(q, k, v, alibi_slopes, causal)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[3])
    return _ChunkedAttention.apply(q, k, v, alibi_slopes.float(), causal, scale, chunk)
