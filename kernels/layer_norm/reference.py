"""LayerNorm reference: the definition the Triton kernel must match.

Statistics (mean, variance) and the affine transform are computed in fp32 whatever the input
dtype; the output is rounded once to the input dtype. This is what Megatron's fused LayerNorm does
for bf16 and what `torch.nn.functional.layer_norm` does for bf16 on CPU and GPU.
"""

from __future__ import annotations

import torch


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         eps: float = 1e-5) -> torch.Tensor:
    """x [..., h], weight/bias [h] -> [..., h] in x.dtype; differentiable by torch autograd."""
    xf = x.float()
    mean = xf.mean(dim=-1, keepdim=True)
    centered = xf - mean
    var = (centered * centered).mean(dim=-1, keepdim=True)
    y = centered * torch.rsqrt(var + eps) * weight.float() + bias.float()
    return y.to(x.dtype)
