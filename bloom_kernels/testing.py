"""Helpers for tests that compare implementations: tolerances, max-error reports, path runs.

Tolerance rule (elementwise, like torch.testing): |actual - expected| <= atol + rtol * |expected|
with atol = rtol * max(max|expected|, 1), rtol per dtype:
  fp32: 1e-5  kernels and references do the same fp32 math in a different order (blocked sums,
              online softmax, exp2 vs exp); measured errors are ~1e-6 relative.
  bf16: 2**-6 (two bf16 ulps). Both sides compute in fp32 and round once to bf16, so most values
              agree exactly or by one ulp (2**-7 relative) when the fp32 values straddle a rounding
              boundary; gradients that pass through a bf16-rounded intermediate (the saved softmax
              output, bf16 dO) can differ by one more ulp.
bf16 attention whose matmuls take bf16 operands (the GPU kernels, FlexAttention, SDPA) is held to
FlashAttention's criterion instead: `attention_bf16_bounds`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from bloom_kernels.dispatch import kernel_path

RTOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9}


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.detach().double() - expected.detach().double()).abs().max().item() if expected.numel() else 0.0


def tolerance_check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                    rtol: float | None = None) -> tuple[float, bool]:
    """(max abs error, within the per-dtype tolerance of the module docstring and free of NaN)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    rtol = rtol if rtol is not None else RTOL[dtype or expected.dtype]
    a, e = actual.detach().double(), expected.detach().double()
    err = max_error(a, e)
    scale = e.abs().max().item() if e.numel() else 0.0
    atol = rtol * max(scale, 1.0)  # floor: an exact 0 expected (e.g. dq with one key) vs ~1e-7 rounding
    worst = ((a - e).abs() - (atol + rtol * e.abs())).max().item() if e.numel() else -1.0
    return err, worst <= 0 and not torch.isnan(a).any().item()


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                 rtol: float | None = None) -> float:
    """Print the max error of `actual` vs `expected` and assert the per-dtype tolerance. Returns it."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    rtol = rtol if rtol is not None else RTOL[dtype or expected.dtype]
    err, ok = tolerance_check(actual, expected, dtype, rtol)
    scale = expected.detach().double().abs().max().item() if expected.numel() else 0.0
    print(f"{name}: max abs error {err:.3e} (max |expected| {scale:.3e}, rtol {rtol:.1e})")
    assert not torch.isnan(actual.detach()).any(), f"{name}: NaN in result"
    assert ok, (f"{name}: max abs error {err:.3e} exceeds atol {rtol * max(scale, 1.0):.3e} + rtol {rtol:.1e} * "
                f"|expected| (max |expected| {scale:.3e})")
    return err


def attention_bf16_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slopes: torch.Tensor,
                         causal: bool = True) -> torch.Tensor:
    """transformers' recipe in bf16: bf16 matmuls, fp32 softmax, probs rounded to bf16."""
    from bloom_kernels.attention.reference import alibi_relative_bias

    sq, sk = q.shape[2], k.shape[2]
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[3])
    s = s.float() + alibi_relative_bias(slopes, sq, sk, q.device, q_start=sk - sq)
    if causal:
        visible = torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + sk - sq
        s = s.masked_fill(~visible, torch.finfo(torch.float32).min)
    return torch.matmul(torch.softmax(s, -1).to(q.dtype), v)


def attention_bf16_bounds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          slopes: torch.Tensor) -> dict[str, tuple[torch.Tensor, float]]:
    """{"out"/"dq"/"dk"/"dv": (fp32 gold, max allowed error)} for a bf16 attention with output grad g.

    An attention whose matmuls take bf16 operands is not "fp32 then round once". The criterion is
    FlashAttention's own tests': the error against an fp32 computation on the same bf16 inputs must
    be at most 2x (+ 1e-3 of the largest value) the error of plain bf16 torch (transformers' recipe)
    against that same fp32 computation, plus a floor: a kernel that accumulates in fp32 and takes
    D = rowsum(dO * O) (FlashAttention) where the reference takes dO . V differs by fp32 rounding of
    a d-term sum, scaled into dq by |k| / sqrt(d); where the exact gradient is 0 (one key: dq = 0)
    and bf16 torch is exact too, that is all the error there is (~4e-5 at d=128 against ~0.1 for a
    real bug; measured on an H200: 5.1e-7).
    """
    from bloom_kernels.attention.reference import attention_reference

    def fwd_bwd(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, slopes)
        out.backward(g.to(dtype))
        return [out.detach(), *(t.grad for t in leaves)]

    gold = fwd_bwd(attention_reference, torch.float32)
    base = fwd_bwd(attention_bf16_torch, q.dtype)
    d = q.shape[3]
    mags = [t.float().abs().max().item() for t in (g, v, k)]
    fp32_floor = d * 2**-23 * mags[0] * mags[1] * mags[2] / d**0.5
    return {name: (gold_t, 2 * max_error(base_t, gold_t) + 1e-3 * gold_t.abs().max().item() + fp32_floor)
            for name, gold_t, base_t in zip(("out", "dq", "dk", "dv"), gold, base, strict=True)}


def run_on_path(step: Callable[[], Mapping[str, torch.Tensor]], path: str,
                attention: str | None = None) -> dict[str, torch.Tensor]:
    """Run `step` (builds/loads the model, runs forward + backward, returns named tensors such as
    the loss and gradients) with the kernels forced onto `path`; returns detached copies."""
    with kernel_path(path, attention):
        return {k: v.detach().clone() for k, v in step().items()}


def relative_norm_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (Frobenius), in float64; 0 for two zero tensors."""
    a, e = actual.detach().double(), expected.detach().double()
    denom = e.norm().item()
    return (a - e).norm().item() / denom if denom > 0 else (a - e).norm().item()


def compare_paths(step: Callable[[], Mapping[str, torch.Tensor]], dtype: torch.dtype,
                  path_a: str = "reference", path_b: str = "triton", attention_a: str | None = None,
                  attention_b: str | None = None, rtol: float | None = None,
                  norm_rtol: float | None = None) -> dict[str, float]:
    """Whole-model check: the same `step` on two paths; asserts every returned tensor matches.

    `step` must be deterministic (seed inside it) and return named tensors (loss, gradients).
    Elementwise criterion (`assert_close`, rtol) by default; with `norm_rtol`, each tensor's
    relative Frobenius error must be <= norm_rtol instead: through a whole bf16 model, individual
    elements drift by many ulps while the tensors as a whole stay within a fraction of a percent.
    Returns {name: error used by the criterion}.
    """
    a = run_on_path(step, path_a, attention_a)
    b = run_on_path(step, path_b, attention_b)
    if a.keys() != b.keys():
        raise AssertionError(f"the step returned different tensors on the two paths: {sorted(a)} vs {sorted(b)}")
    label = f"[{path_b}/{attention_b or 'auto'} vs {path_a}/{attention_a or 'auto'}]"
    if norm_rtol is None:
        return {name: assert_close(f"{name} {label}", b[name], a[name], dtype, rtol) for name in a}
    errors = {name: relative_norm_error(b[name], a[name]) for name in a}
    worst = max(errors, key=errors.get)
    print(f"{label}: worst relative norm error {errors[worst]:.3e} ({worst}); loss {a.get('loss')} vs {b.get('loss')}")
    bad = {name: err for name, err in errors.items() if not err <= norm_rtol}
    assert not bad, f"{label}: relative norm error above {norm_rtol:.1e} for {bad}"
    return errors
