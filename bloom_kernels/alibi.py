"""ALiBi slopes, exactly as BLOOM (and transformers' `build_alibi_tensor`) computes them."""

from __future__ import annotations

import math

import torch


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes, fp32 [num_heads].

    For a power of two n the slopes are the geometric sequence 2^(-8/n), 2^(-16/n), ...; for other
    head counts (BLOOM-176B has 112 heads) the closest lower power of two is used and the missing
    heads take every other slope of the sequence for twice that power (Press et al., ALiBi).
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    closest_power_of_2 = 2 ** math.floor(math.log2(num_heads))
    base = 2 ** (-(2 ** -(math.log2(closest_power_of_2) - 3)))
    slopes = torch.pow(torch.tensor(base, dtype=torch.float32),
                       torch.arange(1, 1 + closest_power_of_2, dtype=torch.int32))
    if closest_power_of_2 != num_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest_power_of_2) - 3)))
        num_remaining = min(closest_power_of_2, num_heads - closest_power_of_2)
        extra_powers = torch.arange(1, 1 + 2 * num_remaining, 2, dtype=torch.int32)
        extra = torch.pow(torch.tensor(extra_base, dtype=torch.float32), extra_powers)
        slopes = torch.cat([slopes, extra], dim=0)
    return slopes.to(torch.float32)


def alibi_slopes_for_rank(num_heads: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The slopes of the heads that tensor-parallel rank `tp_rank` holds (contiguous head blocks)."""
    if num_heads % tp_size:
        raise ValueError(f"num_heads = {num_heads} is not divisible by tp = {tp_size}")
    per_rank = num_heads // tp_size
    return alibi_slopes(num_heads)[tp_rank * per_rank:(tp_rank + 1) * per_rank].contiguous()
