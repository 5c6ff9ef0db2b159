"""Every Triton kernel, run on CPU tensors under TRITON_INTERPRET=1, against its reference.

How the interpreter gets switched on: `bloom_kernels.dispatch.triton_ops("cpu")` sets TRITON_INTERPRET=1
before it first imports the kernel modules (triton decides compiled vs interpreted when a
@triton.jit function is defined, not when triton is imported). On a machine with a GPU the kernels
may already be compiled in this pytest process (tests/bloom_kernels/test_gpu.py); then these tests skip:
run them alone with `TRITON_INTERPRET=1 pytest tests/bloom_kernels/test_triton_interpret.py`.

Sizes are small on purpose (the interpreter runs each program in numpy) but odd: dimensions that are
not multiples of the interpreter tiles (16 x 32 for bias+GeLU, 32-key blocks for the softmax,
16 x 16 for attention), sequence length 1, one head, sq != sk, head_dim that is not a power of two.
fp32 and bf16 inputs; outputs and all gradients. Tolerances: bloom_kernels/testing.py (fp32: 1e-5
relative; bf16: two ulps), except bf16 attention gradients (four ulps, see ATTENTION_BF16_GRAD_RTOL). Under the interpreter the attention matmuls take fp32 operands (bf16
`tl.dot` is broken there, see bloom_kernels/_triton_common.py), so bf16 here checks bf16 loads/stores
and the algorithm; bf16 tensor-core matmuls are checked by the GPU tests.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from bloom_kernels import dispatch  # noqa: E402
from bloom_kernels.alibi import alibi_slopes  # noqa: E402
from bloom_kernels.attention.reference import attention_reference  # noqa: E402
from bloom_kernels.bias_gelu.reference import bias_gelu_reference  # noqa: E402
from bloom_kernels.layer_norm.reference import layer_norm_reference  # noqa: E402
from bloom_kernels.softmax.reference import scale_mask_softmax_reference  # noqa: E402
from bloom_kernels.testing import assert_close  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


def _load_ops():
    try:
        return dispatch.triton_ops("cpu"), None
    except RuntimeError as exc:  # triton already imported in compiled mode in this process
        return None, str(exc)


@pytest.fixture(scope="module")
def ops():
    loaded, why = _load_ops()
    if loaded is None:
        pytest.skip(f"interpreter unavailable in this process ({why}); test_rerun_in_fresh_process covers it")
    return loaded


def test_rerun_in_fresh_process(tmp_path):
    """If triton was imported compiled before this module (another directory's tests imported
    transformers/deepspeed first), run this file again in a process that starts interpreted."""
    if _load_ops()[0] is not None:
        pytest.skip("not needed: the interpreter tests below run in this process")
    if torch.cuda.is_available():
        pytest.skip("GPU machine: the compiled kernels are tested by test_gpu.py; run this file alone "
                    "with TRITON_INTERPRET=1 to test the interpreter too")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    junit = tmp_path / "child.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           f"--junitxml={junit}", __file__], env=env, capture_output=True, text=True, timeout=600)
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, f"interpreter tests failed in a fresh process:\n{proc.stdout[-4000:]}"
    # A child in which everything skipped (the interpreter unavailable there too) proves nothing:
    # every kernel test must have RUN; only this test itself skips there ("not needed").
    ran, skipped = child_outcomes(junit)
    print(f"fresh process: {len(ran)} tests ran, skipped: {skipped}")
    assert len(ran) >= MIN_CHILD_TESTS and skipped == ["test_rerun_in_fresh_process"], (len(ran), skipped[:5])


MIN_CHILD_TESTS = 30  # this file has 39 kernel tests besides this one (when written); all must run


def child_outcomes(junit_xml) -> tuple[list[str], list[str]]:
    """(names of the tests that ran, names of the tests that skipped) of a child pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    ran, skipped = [], []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        (skipped if case.find("skipped") is not None else ran).append(case.get("name"))
    return ran, skipped


def _check(name, dtype, reference, kernel, inputs, grad_names, grad_rtol=None):
    """Run both on copies of `inputs` and compare the outputs and the gradients of the first
    len(grad_names) inputs (named by grad_names in the printed report)."""
    wants_grad = [i < len(grad_names) for i in range(len(inputs))]  # the first len(grad_names) inputs
    ref_in = [t.clone().requires_grad_(w) for t, w in zip(inputs, wants_grad, strict=True)]
    ker_in = [t.clone().requires_grad_(w) for t, w in zip(inputs, wants_grad, strict=True)]
    expected = reference(*ref_in)
    actual = kernel(*ker_in)
    assert actual.dtype == expected.dtype == inputs[0].dtype
    assert_close(f"{name} out", actual, expected, dtype)
    g = torch.randn(expected.shape).to(dtype)
    expected.backward(g)
    actual.backward(g)
    for gname, a, e in zip(grad_names, ker_in, ref_in, strict=False):  # inputs beyond grad_names: none
        assert_close(f"{name} {gname}", a.grad, e.grad, dtype, grad_rtol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 100), (1, 1, 1), (1, 1, 33), (2, 5, 257)], ids=str)
def test_layer_norm(ops, shape, dtype):
    torch.manual_seed(0)
    h = shape[-1]
    x = (torch.randn(shape) * 3 + 0.5).to(dtype)
    w, b = (torch.randn(h) * 0.5 + 1).to(dtype), torch.randn(h).to(dtype)
    _check(f"layer_norm {shape} {dtype}", dtype, lambda x, w, b: layer_norm_reference(x, w, b, 1e-5),
           lambda x, w, b: ops.layer_norm_triton(x, w, b, 1e-5), [x, w, b], ("dx", "dweight", "dbias"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 70), (1, 1, 1), (1, 1, 33), (2, 3, 64)], ids=str)
def test_bias_gelu(ops, shape, dtype):
    torch.manual_seed(0)
    x = (torch.randn(shape) * 3).to(dtype)
    bias = torch.randn(shape[-1]).to(dtype)
    _check(f"bias_gelu {shape} {dtype}", dtype, bias_gelu_reference, ops.bias_gelu_triton, [x, bias],
           ("dx", "dbias"))


SOFTMAX_CASES = [  # (scores shape, alibi shape or None, causal)
    ((6, 21, 45), (6, 1, 45), True),    # sk > one 32-key block, queries end-aligned
    ((1, 1, 1), None, True),            # sequence length 1
    ((4, 1, 37), (4, 1, 37), True),     # one query (decode step)
    ((2, 45, 21), None, True),          # sq > sk: first rows see nothing -> zeros
    ((3, 17, 17), (3, 1, 17), False),   # not causal
    ((2, 3, 9, 9), (6, 1, 9), True),    # 4-D scores with BLOOM's [b*h, 1, sk] alibi
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=lambda c: f"{c[0]}-alibi{c[1] is not None}-causal{c[2]}")
def test_scale_mask_softmax(ops, case, dtype):
    shape, alibi_shape, causal = case
    torch.manual_seed(0)
    scores = (torch.randn(shape) * 4).to(dtype)
    alibi = (torch.randn(alibi_shape) * 2).to(dtype) if alibi_shape else None
    _check(f"scale_mask_softmax {case} {dtype}", dtype,
           lambda s: scale_mask_softmax_reference(s, 0.37, alibi, causal),
           lambda s: ops.scale_mask_softmax_triton(s, 0.37, alibi, causal), [scores], ("dscores",))


# bf16 attention gradients: the backward uses the bf16-rounded output O in delta = sum_d dO*O (as
# every flash implementation does; the reference keeps O in fp32), an error ~ sqrt(head_dim) * 2**-8
# relative; measured up to 2.7e-2 on values of 1.4 for head_dim 64. Four ulps (2**-5) covers it.
ATTENTION_BF16_GRAD_RTOL = 2.0 ** -5

ATTENTION_CASES = [  # (b, h, sq, sk, d, causal, softmax_scale)
    (2, 3, 37, 37, 24, True, None),     # several 16-tiles + ragged edge, head_dim not a power of 2
    (1, 1, 1, 1, 16, True, None),       # sequence length 1, one head
    (1, 2, 20, 37, 16, True, None),     # queries are the last 20 of 37 keys
    (1, 2, 19, 19, 32, False, 0.2),     # not causal, explicit scale
    (1, 1, 33, 33, 64, True, None),     # head_dim 64
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: "b{}h{}sq{}sk{}d{}-causal{}-scale{}".format(*c))
def test_flash_attention(ops, case, dtype):
    b, h, sq, sk, d, causal, scale = case
    torch.manual_seed(0)
    q = torch.randn(b, h, sq, d).to(dtype)
    k, v = torch.randn(b, h, sk, d).to(dtype), torch.randn(b, h, sk, d).to(dtype)
    slopes = alibi_slopes(8)[:h] * 4  # steep slopes so that the bias visibly matters
    _check(f"attention {case} {dtype}", dtype, lambda q, k, v: attention_reference(q, k, v, slopes, causal, scale),
           lambda q, k, v: ops.attention_triton(q, k, v, slopes, causal, scale), [q, k, v], ("dq", "dk", "dv"),
           grad_rtol=ATTENTION_BF16_GRAD_RTOL if dtype == torch.bfloat16 else None)


def test_public_api_uses_triton_when_forced(ops):
    """kernels.* with the path forced to triton run the kernels (not the reference) on CPU."""
    import bloom_kernels

    x = torch.randn(4, 40, requires_grad=True)
    with bloom_kernels.kernel_path("triton"):
        assert bloom_kernels.current_path("cpu") == "triton"
        assert bloom_kernels.current_attention_impl("cpu") == "triton"
        y = bloom_kernels.bias_gelu(x, torch.zeros(40))
        q = torch.randn(1, 2, 5, 16, requires_grad=True)
        out = bloom_kernels.attention(q, q, q, bloom_kernels.alibi_slopes(2))
    assert type(y.grad_fn).__name__ == "BiasGeluTritonBackward"
    assert type(out.grad_fn).__name__ == "FlashAttentionTritonBackward"
    assert_close("public bias_gelu (triton)", y, bias_gelu_reference(x, torch.zeros(40)))
    assert_close("public attention (triton)", out, attention_reference(q, q, q, bloom_kernels.alibi_slopes(2)))
