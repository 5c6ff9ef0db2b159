"""`python -m trainer` at several (tp, pp, dp) layouts, started as srun starts it, and the comparisons.

    runs = run_trainer_layouts(work, [("fp32", (1, 1, 1)), ("fp32", (2, 2, 2)), ...])
    runs["fp32", (2, 2, 2)] -> [metrics.jsonl records of steps 1..STEPS]

Every run is a run directory of the tiny config (tests/trainer/runs.py) on the shipped corpus,
changed only in its layout and dtype; its ranks get srun's variables (tests/trainer/launch_local.py).
Runs are started together, up to MAX_RANKS_AT_ONCE processes at a time: every process pays ~5 s of
imports, which overlap with the other runs' steps on the 2 CI cores.

Why this config (LAYOUT_CONFIG):
- 2 layers: pp = 2 puts one on each stage; 4 heads and an MLP of 128 split over tp = 2;
  global batch 8 of micro-batch 2: 4 accumulated micro-batches at dp = 1, 2 at dp = 2.
- clip_grad 0.3 is below every step's gradient norm (~0.5), so every step is clipped.
- adam_eps 1e-4 is larger than most gradient entries (~1e-5 in the layer weights): Adam's update
  is then ~ lr * m / eps, proportional to the gradient's scale, so a wrong clip coefficient changes
  the update in proportion. With a tiny eps, m / sqrt(v) cancels a constant coefficient and a
  clipping bug hides (measured 7e-7 on the loss before this choice; docs/parallelism.md).

Tolerances (relative, every step's loss and gradient norm):
- fp32 loss 1e-5: layouts differ only in the order of fp32 sums (TP all-reduce of partial
  products, DP all-reduce of gradients, micro-batch accumulation), each ~1e-7 relative; a few
  steps of Adam carry that forward without growing it past ~1e-6 (measured: see the test output).
- fp32 gradient norm 1e-4: the norm the trainer reports is DeepSpeed's get_global_norm_of_tensors,
  torch's float32 vector norm per tensor. On this CPU torch accumulates the 131k squares of the
  [4096, 32] embedding gradient in float32 and is off by 3.7e-5 relative from the float64 value
  (measured); a TP split sums different halves, so two layouts can differ by twice that.
- bf16 loss 2e-3, gradient norm 5e-3: bf16 keeps 8 significant bits, a rounding moves a value by
  up to 2^-9 = 1.95e-3 relative; another layout rounds some activations and weights differently by
  one bf16 ulp; the loss, a mean over 256 tokens, averages that down below one half-ulp; the norm
  averages less well and gets 2.5x that.
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.contract import ExitCode, RunPaths, read_jsonl
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir

STEPS = 7
MAX_RANKS_AT_ONCE = 10
LAYOUT_CONFIG = {
    "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32},
    "parallel": {"micro_batch_size": 2, "global_batch_size": 8},
    "optimizer": {"lr": 3e-2, "min_lr": 3e-3, "warmup_samples": 16, "clip_grad": 0.3, "adam_eps": 1e-4},
    "data": {"eval_interval": 1000},
}
TOLERANCE = {"fp32": {"loss": 1e-5, "grad_norm": 1e-4}, "bf16": {"loss": 2e-3, "grad_norm": 5e-3}}
Layout = tuple[int, int, int]  # (tp, pp, dp)


def layout_run_dir(work: Path, dtype: str, layout: Layout, **changes) -> Path:
    tp, pp, dp = layout
    name = f"{dtype}-tp{tp}-pp{pp}-dp{dp}"
    config = {**LAYOUT_CONFIG, **changes}
    config = {**config, "model": {**config["model"], "dtype": dtype},
              "parallel": {**config["parallel"], "tp": tp, "pp": pp, "dp": dp},
              "cluster": {"gpus_per_node": tp * pp * dp}}
    return make_run_dir(work / name, **config)


def run_trainer_layouts(work: Path, runs: list[tuple[str, Layout]], steps: int = STEPS,
                        timeout: float = 900) -> dict[tuple[str, Layout], list[dict]]:
    """Train every (dtype, layout) for `steps` steps; returns each run's metrics records, in order.
    Raises with the failing run's rank-0 log if any rank does not exit FINISHED."""
    pending = [(key, layout_run_dir(work, *key)) for key in runs]
    running: list[tuple[tuple[str, Layout], Path, list]] = []
    done: dict[tuple[str, Layout], list[dict]] = {}
    deadline = time.time() + timeout
    while pending or running:
        busy = sum(len(procs) for _, _, procs in running)
        while pending and (not running or busy + _ranks(pending[0][0][1]) <= MAX_RANKS_AT_ONCE):
            key, run_dir = pending.pop(0)
            procs = launch_local.start(run_dir, _ranks(key[1]), {"TRAINER_MAX_STEPS": str(steps)})
            running.append((key, run_dir, procs))
            busy += len(procs)
        for entry in list(running):
            key, run_dir, procs = entry
            if all(p.poll() is not None for p in procs):
                running.remove(entry)
                codes = launch_local.wait(procs, 1)
                assert codes == [ExitCode.FINISHED] * len(procs), \
                    f"{key}: exit codes {codes}\n{launch_local.read_log(run_dir)[-3000:]}"
                done[key] = read_jsonl(RunPaths.of(run_dir).metrics)
                assert [r["step"] for r in done[key]] == list(range(1, steps + 1)), done[key]
        if time.time() > deadline:
            for _, _, procs in running:
                launch_local.wait(procs, 0)
            raise TimeoutError(f"trainer runs still going after {timeout:.0f} s: {[k for k, _, _ in running]}")
        time.sleep(0.2)
    return done


def _ranks(layout: Layout) -> int:
    return layout[0] * layout[1] * layout[2]


def max_rel_error(values: list[float], reference: list[float]) -> float:
    if len(values) != len(reference) or any(v is None for v in [*values, *reference]):
        raise AssertionError(f"cannot compare {values} with {reference}")
    return max(abs(v - r) / max(abs(r), 1e-12) for v, r in zip(values, reference, strict=True))


def compare_records(records: list[dict], reference: dict[str, list[float]], dtype: str, what: str) -> None:
    """Every step's loss and grad norm of `records` against `reference` ({"loss": [...], "grad_norm": [...]})."""
    tol = TOLERANCE[dtype]
    errors = {k: max_rel_error([r[k] for r in records], reference[k]) for k in ("loss", "grad_norm")}
    print(f"{what}: max rel error loss {errors['loss']:.2e} (tol {tol['loss']:.0e}), "
          f"grad norm {errors['grad_norm']:.2e} (tol {tol['grad_norm']:.0e})")
    for k, err in errors.items():
        assert err <= tol[k], f"{what}: {k} {[r[k] for r in records]} vs {reference[k]} (max rel error {err:.2e})"


def series(records: list[dict]) -> dict[str, list[float]]:
    return {k: [r[k] for r in records] for k in ("loss", "grad_norm", "lr")}
