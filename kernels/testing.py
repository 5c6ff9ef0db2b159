"""Helpers for tests that compare implementations: tolerances, max-error reports, path runs.

Tolerance rule (elementwise, like torch.testing): |actual - expected| <= atol + rtol * |expected|
with atol = rtol * max(max|expected|, 1), rtol per dtype:
  fp32: 1e-5  kernels and references do the same fp32 math in a different order (blocked sums,
              online softmax, exp2 vs exp); measured errors are ~1e-6 relative.
  bf16: 2**-6 (two bf16 ulps). Both sides compute in fp32 and round once to bf16, so most values
              agree exactly or by one ulp (2**-7 relative) when the fp32 values straddle a rounding
              boundary; gradients that pass through a bf16-rounded intermediate (the saved softmax
              output, bf16 dO) can differ by one more ulp.
The GPU tests use looser bf16 bounds for attention (see tests/kernels/test_gpu.py): there the
kernel's matmuls take bf16 operands.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from kernels.dispatch import kernel_path

RTOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -6, torch.float16: 2.0 ** -9}


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (actual.detach().double() - expected.detach().double()).abs().max().item() if expected.numel() else 0.0


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None,
                 rtol: float | None = None) -> float:
    """Print the max error of `actual` vs `expected` and assert the per-dtype tolerance. Returns it."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    rtol = rtol if rtol is not None else RTOL[dtype or expected.dtype]
    a, e = actual.detach().double(), expected.detach().double()
    err = max_error(a, e)
    scale = e.abs().max().item() if e.numel() else 0.0
    atol = rtol * max(scale, 1.0)  # floor: an exact 0 expected (e.g. dq with one key) vs ~1e-7 rounding
    worst = ((a - e).abs() - (atol + rtol * e.abs())).max().item() if e.numel() else -1.0
    print(f"{name}: max abs error {err:.3e} (max |expected| {scale:.3e}, rtol {rtol:.1e})")
    assert not torch.isnan(a).any(), f"{name}: NaN in result"
    assert worst <= 0, (f"{name}: max abs error {err:.3e} exceeds atol {atol:.3e} + rtol {rtol:.1e} * |expected| "
                        f"(max |expected| {scale:.3e})")
    return err


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
