"""bias + GeLU reference (tanh approximation), the definition the Triton kernel must match.

The formula is transformers' `bloom_gelu_forward` (and Megatron's `bias_gelu`):
0.5 * z * (1 + tanh(0.79788456 * z * (1 + 0.044715 * z^2))), z = x + bias; `gelu_tanh_fp32` spells
it out constant for constant. `bias_gelu_reference` evaluates it with torch's fused
`F.gelu(approximate="tanh")`, whose constant sqrt(2/pi) = 0.7978845608... differs from BLOOM's
0.79788456 by 1e-9 relative, 60x below fp32 resolution (2^-24): the same function to fp32 rounding
(measured: forward within 1 ulp, gradient within ~1e-6 of `bloom_gelu_back`), at one fused pass
forward and one backward instead of ~9 and ~15 elementwise passes with their saved intermediates.
It is evaluated in fp32 and rounded once to x.dtype (transformers evaluates it in the input dtype,
so in bf16 the two differ by bf16 rounding only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SQRT_2_OVER_PI = 0.79788456  # the constant BLOOM uses (rounded sqrt(2/pi))
GELU_CUBIC = 0.044715


def gelu_tanh_fp32(z: torch.Tensor) -> torch.Tensor:
    return z * 0.5 * (1.0 + torch.tanh(SQRT_2_OVER_PI * z * (1.0 + GELU_CUBIC * z * z)))


def gelu_tanh_grad_fp32(z: torch.Tensor) -> torch.Tensor:
    """d gelu / dz, same expression as transformers' `bloom_gelu_back` (0.1070322243 = 3*0.044715*0.79788456)."""
    t = torch.tanh(SQRT_2_OVER_PI * z * (1.0 + GELU_CUBIC * z * z))
    return 0.5 * z * ((1.0 - t * t) * (SQRT_2_OVER_PI + 0.1070322243 * z * z)) + 0.5 * (1.0 + t)


def gelu_reference(z: torch.Tensor) -> torch.Tensor:
    """gelu(z) [..., h] in z.dtype, computed in fp32 (for callers that already added the bias, e.g.
    in the GEMM itself on the plain-torch path); differentiable by torch autograd."""
    return F.gelu(z.float(), approximate="tanh").to(z.dtype)


def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """x [..., h], bias [h] -> gelu(x + bias) [..., h] in x.dtype; differentiable by torch autograd."""
    return F.gelu(x.float() + bias.float(), approximate="tanh").to(x.dtype)
