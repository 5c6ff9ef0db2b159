"""Running the harness (bench and the SLURM job test): one layout's run as a dict of results, and the
comparisons. The layout equivalence of the trainer itself: tests/parallel/trainer_layouts.py.

Tolerances (see docs/parallelism.md for the derivation):
- fp32: relative error of every loss and gradient norm <= 1e-5 (the issue's bound). Layouts differ
  only in the order of fp32 sums (TP all-reduce of partial products, DP all-reduce of gradients,
  micro-batch accumulation), each ~1e-7 relative; measured max is ~1e-7 for losses, ~4e-6 for the
  norm trainer.engine reports (float32 sums of squares of this model's 256 x 48 embedding gradient).
- bf16: relative error <= 2e-3 for losses and <= 5e-3 for gradient norms. The weights are bf16
  (8 significant bits: a rounding moves a value by up to 2^-9 = 1.95e-3 relative). A different
  reduction order (bf16 TP partial sums all-reduced then rounded, vs one bf16 matmul) rounds some
  activations differently by one bf16 ulp, and the updates that follow differ by up to one ulp of
  the bf16 weight; the loss, a mean over 8x16 tokens, averages those errors down. One half-ulp
  (2^-9) bounds the loss error; the gradient norm is a 2-norm of bf16-rounded products whose error
  does not average as well, so it gets 2.5x that. Measured: <= 2e-4 (loss), <= 8e-4 (grad norm).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.parallel.spawn import spawn_ranks

TOLERANCE = {"fp32": {"loss": 1e-5, "grad_norm": 1e-5}, "bf16": {"loss": 2e-3, "grad_norm": 5e-3}}


def run_layout(work: Path, dp: int, tp: int, pp: int, dtype: str, steps: int = 10, **spec) -> dict:
    """Train the tiny BLOOM at (dp, tp, pp) with dp*tp*pp local ranks; returns rank 0's results."""
    extras = "".join(f"-{k}{spec[k]}" for k in sorted(spec))
    name = f"dp{dp}-tp{tp}-pp{pp}-{dtype}{extras}".replace("/", "_")
    out = work / f"{name}.json"
    full = {"tp": tp, "pp": pp, "dp": dp, "dtype": dtype, "steps": steps, "out": str(out), **spec}
    wall = spawn_ranks(dp * tp * pp, ["-m", "tests.parallel.three_d_harness", json.dumps(full)], work / f"logs-{name}")
    result = json.loads(out.read_text())
    result["wall_seconds"] = wall
    return result


def max_rel_error(values: list[float | None], reference: list[float | None]) -> float:
    if len(values) != len(reference) or any(v is None for v in values + reference):
        raise AssertionError(f"cannot compare {values} with {reference}")
    return max(abs(v - r) / max(abs(r), 1e-12) for v, r in zip(values, reference, strict=True))


def compare(result: dict, reference: dict, dtype: str, what: str) -> tuple[float, float]:
    """Assert losses and grad norms of `result` match `reference` within the dtype's tolerance."""
    loss_err = max_rel_error(result["losses"], reference["losses"])
    norm_err = max_rel_error(result["grad_norms"], reference["grad_norms"])
    tol = TOLERANCE[dtype]
    print(f"{what}: max rel error loss {loss_err:.2e} (tol {tol['loss']:.0e}), grad norm {norm_err:.2e} "
          f"(tol {tol['grad_norm']:.0e}), wall {result.get('wall_seconds', 0):.1f} s")
    assert loss_err <= tol["loss"], f"{what}: losses {result['losses']} vs {reference['losses']}"
    assert norm_err <= tol["grad_norm"], f"{what}: grad norms {result['grad_norms']} vs {reference['grad_norms']}"
    return loss_err, norm_err
