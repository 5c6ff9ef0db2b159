"""Every implementation of every op, by name, with the op's own signature: what `bloom_kernels.dispatch`
chooses from and what bench/kernels_side_by_side.py measures (so the benchmark times exactly what
the dispatch runs).

    implementation(op, impl, device_type)(*args)
      layer_norm(x, weight, bias, eps)
      bias_gelu(x, bias)
      scale_mask_softmax(scores, scale, alibi, causal)
      attention(q, k, v, alibi_slopes, causal, softmax_scale)
Names (bloom_kernels/dispatch_table.IMPLEMENTATIONS): reference (plain torch, the definition), triton
(ours), compiled (torch.compile of the reference), and for attention chunked (flash algorithm in
torch), flex (FlexAttention + ALiBi score_mod), sdpa (SDPA + additive ALiBi bias).

`compiled` uses torch.compile's default backend (inductor) unless the environment variable
BLOOM_COMPILE_BACKEND names another (`aot_eager` traces and differentiates the same graph without
generating code: the CPU tests use it, because inductor's C++ compile of one op takes about a
minute on a cold 2-core machine).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from bloom_kernels import dispatch
from bloom_kernels.attention.chunked import attention_chunked
from bloom_kernels.attention.reference import attention_reference
from bloom_kernels.attention.sdpa import attention_sdpa
from bloom_kernels.bias_gelu.reference import bias_gelu_reference
from bloom_kernels.dispatch_table import IMPLEMENTATIONS
from bloom_kernels.layer_norm.reference import layer_norm_reference
from bloom_kernels.softmax.reference import scale_mask_softmax_reference

ENV_COMPILE_BACKEND = "BLOOM_COMPILE_BACKEND"
REFERENCES: dict[str, Callable] = {
    "layer_norm": layer_norm_reference,
    "bias_gelu": bias_gelu_reference,
    "scale_mask_softmax": scale_mask_softmax_reference,
    "attention": attention_reference,
}
_compiled: dict[tuple[str, str], Callable] = {}


def compile_backend() -> str:
    return os.environ.get(ENV_COMPILE_BACKEND, "").strip() or "inductor"


def compiled_reference(op: str) -> Callable:
    """torch.compile(reference), built once per op and backend; one graph per shape (dynamic=False:
    a training run has a few fixed shapes, and static shapes compile to the fastest code)."""
    key = (op, compile_backend())
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = torch.compile(REFERENCES[op], dynamic=False, backend=key[1])
    return fn


def _attention_flex(*args, **kwargs):
    from bloom_kernels.attention.flex import attention_flex  # imports torch's flex module: only when used

    return attention_flex(*args, **kwargs)


_ATTENTION_ONLY = {"chunked": attention_chunked, "flex": _attention_flex, "sdpa": attention_sdpa}


def implementation(op: str, impl: str, device_type: str) -> Callable:
    if impl not in IMPLEMENTATIONS.get(op, ()):
        raise ValueError(f"{op!r} has no implementation {impl!r}; it has {', '.join(IMPLEMENTATIONS.get(op, ()))}")
    if impl == "reference":
        return REFERENCES[op]
    if impl == "triton":
        return getattr(dispatch.triton_ops(device_type), f"{op}_triton")
    if impl == "compiled":
        return compiled_reference(op)
    return _ATTENTION_ONLY[impl]
