"""The shapes bench/kernels_side_by_side.py measures, and how to build each op's inputs.

BLOOM's shapes, bf16: the bloom-1b7 training step of bench/train_step_gpu.py (micro-batch 4, seq
2048, hidden 2048, 16 heads of 128) and one tensor-parallel rank of BLOOM-176B (TP=4: hidden 14336,
ffn 4*14336/4 = 14336 per rank, 112/4 = 28 heads of 128) at seq 2048 and 4096. One shape per
shape class (bloom_kernels/dispatch_table.py): at seq 2048 the bloom-1b7 step's attention stands for the
class. The CPU smoke cases are tiny and odd-sized: they exercise the script, not the speed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Case:
    op: str
    label: str
    shape: tuple[int, ...]  # x (layer_norm, bias_gelu), scores [heads, s, s], or q [b, heads, s, d]


GPU_CASES = [
    Case("attention", "bloom-1b7 step, s=2048", (4, 16, 2048, 128)),
    Case("attention", "bloom-176b tp=4, s=4096", (1, 28, 4096, 128)),
    Case("layer_norm", "bloom-1b7 step", (8192, 2048)),
    Case("layer_norm", "bloom-176b", (8192, 14336)),
    Case("bias_gelu", "bloom-1b7 step (4h)", (8192, 8192)),
    Case("bias_gelu", "bloom-176b tp=4 (4h/4)", (8192, 14336)),
    Case("scale_mask_softmax", "bloom-176b tp=4, s=2048", (28, 2048, 2048)),
    Case("scale_mask_softmax", "bloom-176b tp=4, s=4096", (28, 4096, 4096)),
]
CPU_SMOKE_CASES = [
    Case("attention", "cpu smoke", (1, 2, 40, 16)),
    Case("layer_norm", "cpu smoke", (40, 48)),
    Case("bias_gelu", "cpu smoke", (40, 48)),
    Case("scale_mask_softmax", "cpu smoke", (2, 40, 40)),
]


@dataclass
class Inputs:
    args: tuple            # the op's arguments, tensors and scalars, in its signature's order
    leaves: tuple          # the tensors gradients are taken for
    grad_out: torch.Tensor
    tensors: tuple         # the tensor arguments, as the dispatch sees them


def make_inputs(case: Case, device: str, dtype: torch.dtype, seed: int = 0) -> Inputs:
    """Random inputs at the case's shape; scales as in tests/bloom_kernels/test_gpu.py."""
    from bloom_kernels.alibi import alibi_slopes

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0, grad=True):
        t = (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)
        return t.requires_grad_(grad)

    if case.op == "layer_norm":
        hidden = case.shape[-1]
        x, w, b = randn(*case.shape, scale=2.0), randn(hidden), randn(hidden)
        return Inputs((x, w, b, 1e-5), (x, w, b), randn(*case.shape, grad=False), (x, w, b))
    if case.op == "bias_gelu":
        x, b = randn(*case.shape, scale=3.0), randn(case.shape[-1])
        return Inputs((x, b), (x, b), randn(*case.shape, grad=False), (x, b))
    if case.op == "scale_mask_softmax":
        heads, _, sk = case.shape
        scores = randn(*case.shape, scale=4.0)
        # BLOOM's alibi operand: slope * key position, [heads, 1, sk]; no gradient
        alibi = (alibi_slopes(heads)[:, None, None] * torch.arange(sk)).to(device=device, dtype=dtype)
        return Inputs((scores, 0.088, alibi, True), (scores,), randn(*case.shape, grad=False), (scores, alibi))
    if case.op == "attention":
        q, k, v = (randn(*case.shape) for _ in range(3))
        slopes = alibi_slopes(case.shape[1]).to(device)
        return Inputs((q, k, v, slopes, True, None), (q, k, v), randn(*case.shape, grad=False), (q, k, v, slopes))
    raise ValueError(f"no inputs for op {case.op!r}")


def bytes_moved(case: Case, element_size: int) -> tuple[int, int]:
    """(fwd, fwd+bwd) minimum bytes of the bandwidth-bound ops: fwd reads x and writes y; bwd also
    reads the saved x (or y) and dy and writes dx (parameters are negligible)."""
    n = 1
    for dim in case.shape:
        n *= dim
    fwd = 2 * n * element_size
    return fwd, fwd + 3 * n * element_size


def attention_flops(case: Case) -> tuple[float, float]:
    """(fwd, fwd+bwd) FLOPs of causal attention: QK^T and PV, 2*b*h*s*s*d each, halved by the mask;
    backward = 2.5x forward (FlashAttention's convention)."""
    b, h, s, d = case.shape
    fwd = 4 * b * h * s * s * d / 2
    return fwd, 3.5 * fwd
