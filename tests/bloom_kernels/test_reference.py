"""The plain-torch references against independent oracles, and the chunked attention path.

Oracles: transformers' own BLOOM functions (`bloom_gelu_forward`, `bloom_gelu_back`,
`build_alibi_tensor`, and BloomAttention's baddbmm + additive-mask + fp32 softmax recipe),
torch's `F.layer_norm`, and the materialised reference attention for the chunked path.
Tolerances: see bloom_kernels/testing.py (fp32 1e-5 relative, bf16 two ulps). The oracle comparisons
in fp32 are tight because the formulas are the same; where transformers computes in bf16 (BloomGelu,
attention in bf16) we compare in fp32 only, since transformers rounds intermediates that our
references keep in fp32 by design.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.models.bloom import modeling_bloom

from bloom_kernels.alibi import alibi_slopes, alibi_slopes_for_rank
from bloom_kernels.attention.chunked import attention_chunked
from bloom_kernels.attention.reference import attention_reference
from bloom_kernels.bias_gelu.reference import bias_gelu_reference, gelu_tanh_grad_fp32
from bloom_kernels.layer_norm.reference import layer_norm_reference
from bloom_kernels.softmax.reference import scale_mask_softmax_reference
from bloom_kernels.testing import assert_close

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("num_heads", [1, 2, 3, 8, 12, 16, 28, 112])
def test_alibi_slopes_match_transformers(num_heads):
    # build_alibi_tensor returns slope_h * position: position 1 of an all-ones mask is the slope
    alibi = modeling_bloom.build_alibi_tensor(torch.ones(1, 4), num_heads, torch.float32)  # [h, 1, 4]
    assert_close(f"alibi slopes h={num_heads}", alibi_slopes(num_heads), alibi[:, 0, 1], rtol=0.0)
    assert alibi_slopes(num_heads).dtype == torch.float32


def test_alibi_slopes_for_rank_split_heads_in_blocks():
    full = alibi_slopes(112)
    parts = [alibi_slopes_for_rank(112, r, 4) for r in range(4)]
    assert torch.equal(torch.cat(parts), full)
    with pytest.raises(ValueError, match="not divisible"):
        alibi_slopes_for_rank(10, 0, 4)


def test_bias_gelu_matches_transformers_fp32():
    torch.manual_seed(0)
    x = torch.randn(7, 33, dtype=torch.float64).float() * 3
    bias = torch.randn(33)
    x_ref = x.clone().requires_grad_()
    ours = bias_gelu_reference(x_ref, bias)
    theirs = modeling_bloom.bloom_gelu_forward(x + bias)
    assert_close("bias_gelu vs bloom_gelu_forward", ours, theirs)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs_grad = modeling_bloom.bloom_gelu_back(g, (x + bias,))  # it takes a 1-tuple, as saved by autograd
    assert_close("bias_gelu autograd vs bloom_gelu_back", x_ref.grad, theirs_grad)
    assert_close("gelu_tanh_grad_fp32 vs bloom_gelu_back", gelu_tanh_grad_fp32(x + bias) * g, theirs_grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_matches_torch(dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 5, 100) * 2 + 1).to(dtype)
    w, b = torch.randn(100).to(dtype), torch.randn(100).to(dtype)
    tensors = [t.clone().requires_grad_() for t in (x, w, b)]
    ours = layer_norm_reference(*tensors, 1e-5)
    theirs_in = [t.clone().requires_grad_() for t in (x, w, b)]
    theirs = F.layer_norm(theirs_in[0], (100,), theirs_in[1], theirs_in[2], 1e-5)
    assert ours.dtype == dtype
    assert_close(f"layer_norm vs F.layer_norm {dtype}", ours, theirs, dtype)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs.backward(g)
    for name, a, e in zip(("dx", "dw", "db"), tensors, theirs_in, strict=True):
        # torch's bf16 layer_norm backward accumulates dw/db in bf16-rounded steps; allow 4 ulps there
        assert_close(f"layer_norm {name} vs F.layer_norm {dtype}", a.grad, e.grad, dtype,
                     rtol=2.0 ** -5 if dtype == torch.bfloat16 else None)


def test_scale_mask_softmax_matches_transformers_recipe():
    """BLOOM adds alibi (slope*j) and an additive finfo.min causal mask, softmax in fp32."""
    torch.manual_seed(0)
    b, h, s = 2, 3, 11
    scores = torch.randn(b * h, s, s)
    alibi = modeling_bloom.build_alibi_tensor(torch.ones(b, s), h, torch.float32)  # [b*h, 1, s]
    scale = 0.37
    ours = scale_mask_softmax_reference(scores, scale, alibi, causal=True)
    mask = torch.triu(torch.full((s, s), torch.finfo(torch.float32).min), diagonal=1)
    theirs = F.softmax(scores * scale + alibi + mask, dim=-1, dtype=torch.float32)
    assert_close("scale_mask_softmax vs BLOOM recipe", ours, theirs)
    # 4-D input with the 3-D alibi gives the same
    ours4 = scale_mask_softmax_reference(scores.view(b, h, s, s), scale, alibi.view(b, h, 1, s))
    assert_close("scale_mask_softmax 4-D", ours4.view(b * h, s, s), theirs)


def test_scale_mask_softmax_fully_masked_rows_are_zero():
    probs = scale_mask_softmax_reference(torch.randn(2, 5, 3), 1.0, causal=True)  # sq > sk
    assert torch.equal(probs[:, :2], torch.zeros(2, 2, 3))  # rows 0, 1 see no key
    assert_close("visible rows sum to 1", probs[:, 2:].sum(-1), torch.ones(2, 3))


def _bloom_attention_oracle(q, k, v, num_heads):
    """BloomAttention's core: alibi.baddbmm(q, k^T), additive causal mask, fp32 softmax, bmm."""
    b, h, s, d = q.shape
    alibi = modeling_bloom.build_alibi_tensor(torch.ones(b, s), num_heads, torch.float32)
    scores = alibi.baddbmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(-1, -2),
                           beta=1.0, alpha=1.0 / math.sqrt(d)).view(b, h, s, s)
    scores = scores + torch.triu(torch.full((s, s), torch.finfo(torch.float32).min), diagonal=1)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.matmul(probs, v)


def test_attention_reference_matches_transformers_bloom_attention():
    torch.manual_seed(0)
    b, h, s, d = 2, 4, 19, 16
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    ours = attention_reference(q, k, v, alibi_slopes(h))
    assert_close("attention_reference vs BloomAttention recipe", ours, _bloom_attention_oracle(q, k, v, h))


CHUNKED_CASES = [  # (b, h, sq, sk, d, chunk, causal)
    (2, 3, 37, 37, 24, 8, True),    # chunk does not divide s
    (1, 1, 1, 1, 16, 8, True),      # sequence length 1, one head
    (1, 2, 20, 37, 16, 7, True),    # queries are the last 20 of 37 keys
    (1, 2, 19, 19, 32, 5, False),   # not causal
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CHUNKED_CASES, ids=lambda c: "b{}h{}sq{}sk{}d{}c{}{}".format(*c[:6], "" if c[6] else "nc"))
def test_chunked_attention_matches_reference(case, dtype):
    b, h, sq, sk, d, chunk, causal = case
    torch.manual_seed(1)
    q = torch.randn(b, h, sq, d).to(dtype)
    k, v = torch.randn(b, h, sk, d).to(dtype), torch.randn(b, h, sk, d).to(dtype)
    slopes = alibi_slopes(h)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    out_in = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = attention_reference(*ref_in, slopes, causal)
    actual = attention_chunked(*out_in, slopes, causal, chunk=chunk)
    assert_close(f"chunked out {case} {dtype}", actual, expected, dtype)
    g = torch.randn_like(expected)
    expected.backward(g)
    actual.backward(g)
    for name, a, e in zip(("dq", "dk", "dv"), out_in, ref_in, strict=True):
        assert_close(f"chunked {name} {case} {dtype}", a.grad, e.grad, dtype)


def _saved_bytes(fn) -> int:
    """Bytes of tensors autograd keeps for backward while `fn` runs (views of inputs count too)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def test_chunked_attention_saves_linear_memory_for_backward():
    """Doubling s doubles what the chunked path keeps for backward; the reference's quadruples."""
    def run(impl, s):
        q, k, v = (torch.randn(1, 2, s, 16, requires_grad=True) for _ in range(3))
        return _saved_bytes(lambda: impl(q, k, v, alibi_slopes(2)))

    chunked = [run(attention_chunked, s) for s in (256, 512, 1024)]
    reference = [run(attention_reference, s) for s in (256, 512, 1024)]
    print(f"saved-for-backward bytes, s=256/512/1024: chunked {chunked}, materialised {reference}")
    # linear: f(s) = a*s + c, so f(1024) - f(512) == 2 * (f(512) - f(256)); quadratic grows 4x
    assert chunked[2] - chunked[1] == 2 * (chunked[1] - chunked[0])
    assert reference[2] - reference[1] > 3.5 * (reference[1] - reference[0])
