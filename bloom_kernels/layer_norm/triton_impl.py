"""LayerNorm in Triton: row tiles forward; backward with per-program partial dw/db.

Forward: x [M, N] -> y [M, N] (x.dtype), mean/rstd [M] fp32 saved for backward.
Backward: dx per row; dweight/dbias are summed over rows in fp32 by `G` programs into a [G, N]
buffer, then reduced by one torch `sum(0)` (G is small, ~4 per SM, so that reduction is cheap).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from bloom_kernels._triton_common import INTERPRETED, next_pow2, row_programs


@triton.jit
def _layer_norm_fwd(X, Y, W, B, Mean, Rstd, M, N, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # a tile of ROWS rows x the whole row (BLOCK_N >= N); statistics per row in fp32
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offs = rows[:, None].to(tl.int64) * N + cols[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + rows, mean, mask=rows < M)
    tl.store(Rstd + rows, rstd, mask=rows < M)


@triton.jit
def _layer_norm_bwd(X, DY, DX, W, Mean, Rstd, DW_part, DB_part, M, N, rows_per_prog,
                    BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    base = row_start.to(tl.int64) * N  # int64: M * N may pass 2**31
    for row in range(row_start, row_end):
        off = base + (row - row_start) * N
        x = tl.load(X + off + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + off + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(Mean + row)
        rstd = tl.load(Rstd + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(DX + off + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        db_acc += dy
    tl.store(DW_part + pid * N + cols, dw_acc, mask=mask)
    tl.store(DB_part + pid * N + cols, db_acc, mask=mask)


def _num_warps(block_n: int) -> int:
    return min(max(block_n // 256, 1), 16)


class LayerNormTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        n = x.shape[-1]
        x2 = x.reshape(-1, n).contiguous()
        m = x2.shape[0]
        y = torch.empty_like(x2)
        mean = torch.empty(m, dtype=torch.float32, device=x.device)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        block_n = next_pow2(n)
        # the interpreter pays per program: 16 rows each; on a GPU, several rows only for small n
        rows = min(16 if INTERPRETED else max(1, 2048 // block_n), next_pow2(m))
        if m > 0:
            _layer_norm_fwd[(triton.cdiv(m, rows),)](x2, y, weight.contiguous(), bias.contiguous(), mean, rstd,
                                                     m, n, eps, ROWS=rows, BLOCK_N=block_n,
                                                     num_warps=_num_warps(rows * block_n))
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.x_shape, ctx.bias_dtype = x.shape, bias.dtype
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        m, n = x2.shape
        dy2 = dy.reshape(-1, n).contiguous()
        dx = torch.empty_like(x2)
        programs = max(row_programs(m, x2.device.type), 1)
        rows_per_prog = triton.cdiv(max(m, 1), programs)
        dw_part = torch.zeros(programs, n, dtype=torch.float32, device=x2.device)
        db_part = torch.zeros(programs, n, dtype=torch.float32, device=x2.device)
        block_n = next_pow2(n)
        if m > 0:
            _layer_norm_bwd[(programs,)](x2, dy2, dx, weight.contiguous(), mean, rstd, dw_part, db_part,
                                         m, n, rows_per_prog, BLOCK_N=block_n, num_warps=_num_warps(block_n))
        dweight = dw_part.sum(0).to(weight.dtype)
        dbias = db_part.sum(0).to(ctx.bias_dtype)
        return dx.view(ctx.x_shape), dweight, dbias, None


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5):
    return LayerNormTriton.apply(x, weight, bias, eps)
