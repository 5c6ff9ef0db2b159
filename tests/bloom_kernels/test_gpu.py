"""Compiled Triton kernels on a CUDA GPU against the references (skipped without CUDA).

Sizes are BLOOM-like (hidden 14336 / TP 4 = 3584 for the MLP bias, head_dim 128, seq 2048).
Tolerances:
- LayerNorm, bias+GeLU, softmax: fp32 1e-5 relative, bf16 two ulps, as on CPU (bloom_kernels/testing.py):
  both sides compute in fp32 and round once.
- attention: the kernel's matmuls take bf16 operands (tensor cores) and round P to bf16 before P@V,
  so it is not "fp32 then round once". The criterion is the one FlashAttention's own tests use: its
  error against an fp32 computation on the same bf16 inputs must be at most 2x (+ a small floor)
  the error of a plain bf16 torch implementation (transformers' recipe: bf16 matmuls, fp32
  softmax) against that same fp32 computation. fp32 attention uses exact fp32 products ("ieee").
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def ops():
    pytest.importorskip("triton")
    from bloom_kernels import dispatch

    mod = dispatch.triton_ops("cuda")
    if mod.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 in this process: run the GPU tests in a process without it")
    return mod


def _grads(fn, inputs, grad_out):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_gpu(ops, dtype):
    from bloom_kernels.layer_norm.reference import layer_norm_reference
    from bloom_kernels.testing import assert_close

    torch.manual_seed(0)
    x = (torch.randn(4096, 3584, device="cuda") * 2).to(dtype)
    w, b = torch.randn(3584, device="cuda").to(dtype), torch.randn(3584, device="cuda").to(dtype)
    g = torch.randn_like(x)
    out_r, grads_r = _grads(lambda *t: layer_norm_reference(*t, 1e-5), [x, w, b], g)
    out_t, grads_t = _grads(lambda *t: ops.layer_norm_triton(*t, 1e-5), [x, w, b], g)
    assert_close(f"gpu layer_norm {dtype}", out_t, out_r, dtype)
    # dw/db sum 4096 rows: fp32 sums in a different order, compared at 2 ulps of bf16 / 1e-4 in fp32
    for name, a, e in zip(("dx", "dw", "db"), grads_t, grads_r, strict=True):
        assert_close(f"gpu layer_norm {name} {dtype}", a, e, dtype, None if name == "dx" or dtype != torch.float32 else 1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_gelu_gpu(ops, dtype):
    from bloom_kernels.bias_gelu.reference import bias_gelu_reference
    from bloom_kernels.testing import assert_close

    torch.manual_seed(0)
    x = (torch.randn(4096, 3584, device="cuda") * 3).to(dtype)
    b = torch.randn(3584, device="cuda").to(dtype)
    g = torch.randn_like(x)
    out_r, grads_r = _grads(bias_gelu_reference, [x, b], g)
    out_t, grads_t = _grads(ops.bias_gelu_triton, [x, b], g)
    assert_close(f"gpu bias_gelu {dtype}", out_t, out_r, dtype)
    assert_close(f"gpu bias_gelu dx {dtype}", grads_t[0], grads_r[0], dtype)
    assert_close(f"gpu bias_gelu dbias {dtype}", grads_t[1], grads_r[1], dtype, 1e-4 if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq,sk", [(2048, 2048), (1, 5000), (777, 9000)])
def test_scale_mask_softmax_gpu(ops, dtype, sq, sk):
    from bloom_kernels.softmax.reference import scale_mask_softmax_reference
    from bloom_kernels.testing import assert_close

    torch.manual_seed(0)
    scores = (torch.randn(8, sq, sk, device="cuda") * 4).to(dtype)
    alibi = torch.randn(8, 1, sk, device="cuda").to(dtype)
    g = torch.randn_like(scores)
    out_r, (d_r,) = _grads(lambda s: scale_mask_softmax_reference(s, 0.088, alibi), [scores], g)
    out_t, (d_t,) = _grads(lambda s: ops.scale_mask_softmax_triton(s, 0.088, alibi), [scores], g)
    assert_close(f"gpu softmax {sq}x{sk} {dtype}", out_t, out_r, dtype)
    assert_close(f"gpu softmax dscores {sq}x{sk} {dtype}", d_t, d_r, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 8, 2048, 2048, 128), (1, 3, 1000, 1333, 64), (1, 1, 1, 1, 128),
                                   (2, 4, 555, 555, 80)], ids=str)
def test_flash_attention_gpu(ops, dtype, shape):
    from bloom_kernels.alibi import alibi_slopes
    from bloom_kernels.attention.reference import attention_reference
    from bloom_kernels.testing import assert_close, attention_bf16_bounds, max_error

    b, h, sq, sk, d = shape
    torch.manual_seed(0)
    q = torch.randn(b, h, sq, d, device="cuda").to(dtype)
    k, v = torch.randn(b, h, sk, d, device="cuda").to(dtype), torch.randn(b, h, sk, d, device="cuda").to(dtype)
    slopes = alibi_slopes(h).cuda()
    g = torch.randn(b, h, sq, d, device="cuda").to(dtype)
    out_t, grads_t = _grads(lambda *t: ops.attention_triton(*t, slopes), [q, k, v], g)
    if dtype == torch.float32:
        out_r, grads_r = _grads(lambda *t: attention_reference(*t, slopes), [q, k, v], g)
        assert_close(f"gpu attention {shape} fp32", out_t, out_r, dtype, 1e-4)
        for name, a, e in zip(("dq", "dk", "dv"), grads_t, grads_r, strict=True):
            assert_close(f"gpu attention {name} {shape} fp32", a, e, dtype, 1e-4)
        return
    # FlashAttention's criterion against an fp32 computation (bloom_kernels.testing.attention_bf16_bounds)
    bounds = attention_bf16_bounds(q, k, v, g, slopes)
    for name, actual in zip(("out", "dq", "dk", "dv"), [out_t, *grads_t], strict=True):
        gold, bound = bounds[name]
        err = max_error(actual, gold)
        print(f"gpu attention {name} {shape} bf16: kernel error {err:.3e}, allowed {bound:.3e}")
        assert err <= bound, name


def test_flash_attention_memory_is_linear(ops):
    """Peak extra CUDA memory of forward + backward grows linearly with the sequence length."""
    from bloom_kernels.alibi import alibi_slopes

    peaks = []
    for s in (4096, 8192, 16384):
        q, k, v = (torch.randn(1, 8, s, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ops.attention_triton(q, k, v, alibi_slopes(8).cuda()).sum().backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
        del q, k, v
    print(f"flash attention peak extra bytes at s=4k/8k/16k: {peaks}")
    assert peaks[2] <= 2.2 * peaks[1] and peaks[1] <= 2.2 * peaks[0]
