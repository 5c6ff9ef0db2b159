"""LayerNorm reference: the definition the Triton kernel must match.

Statistics (mean, variance) and the affine transform are computed in fp32 whatever the input
dtype; the output is rounded once to the input dtype. This is what Megatron's fused LayerNorm does
for bf16 and what `torch.nn.functional.layer_norm` does for bf16 on CPU and GPU.

The row mean is subtracted explicitly, then torch's fused `F.layer_norm` normalises the centred
rows: fused forward and backward (the spelled-out formula cost ~10 elementwise passes and their
autograd nodes: 3x slower on the CPU training path), while keeping the precision of the centred
formula. (`F.layer_norm` alone computes x * rstd - mean * rstd on CPU, which cancels badly when
|mean| >> std, e.g. a constant row normalises to ~1e-5 instead of exactly 0.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         eps: float = 1e-5) -> torch.Tensor:
    """x [..., h], weight/bias [h] -> [..., h] in x.dtype; differentiable by torch autograd."""
    xf = x.float()
    centered = xf - xf.mean(dim=-1, keepdim=True)
    y = F.layer_norm(centered, (x.shape[-1],), weight.float(), bias.float(), eps)
    return y.to(x.dtype)
