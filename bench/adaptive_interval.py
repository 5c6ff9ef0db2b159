"""Does the checkpoint interval learn? Simulated months of BLOOM (the real controller, simulation/)
whose planner MTBF (the prior) is Llama 3's published rate, in three cases per seed:

- learn_4x: the true failure rate is 4x the prior, `checkpoint.adaptive_interval: apply`;
- fixed_4x: the same faults (same seed), the interval fixed at the plan's Young/Daly for the prior
  (what a run without learning would use: 0.60 h at the soak's prior rate and the planner's 4.9 s async-save stall);
- learn_1x: the true rate is the prior's, adaptive: how far the interval moves from the plan's.
Writes bench/results/adaptive_interval.json: per seed the goodput of each case, the fits (time,
interval, failures, evidence), when learn_4x came within 25% of Young/Daly for the true rate, and
learn_1x's largest move.

    .venv/bin/python bench/adaptive_interval.py --seeds 0-4 [--days 30] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.soak_month import one_seed, seed_range  # noqa: E402
from orchestrator.plan.goodput_model import young_daly_interval_hours  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CASES = {  # name: (true rate x, adaptive, fixed interval hours or None)
    "learn_4x": (4.0, "apply", None),
    "fixed_4x": (4.0, "off", "prior"),
    "learn_1x": (1.0, "apply", None),
}


def run_case(job: tuple[int, str, float]) -> dict:
    seed, case, days = job
    rate_x, adaptive, fixed = CASES[case]
    checkpoint: dict = {"adaptive_interval": adaptive}
    if fixed == "prior":
        checkpoint.update(interval_hours=round(_prior_young_daly(), 3))
    result = one_seed(seed, days, rate_x, "heavy", prior_rate_x=1.0, checkpoint=checkpoint)
    keep = ("goodput", "faults_real", "missed_faults", "false_positives", "false_exclusions", "interval_fits",
            "cpu_seconds_to_simulate", "job_mtbf_hours")  # fmt: skip
    return {"seed": seed, "case": case, **{k: result[k] for k in keep}}


def _planned_stall_seconds() -> float:
    """The save stall the planner (hence the simulation and the learner's prior) charges BLOOM."""
    from orchestrator.plan.planner import plan_run
    from simulation import bloom_config

    return plan_run(bloom_config()).save_stall_seconds


def _prior_young_daly() -> float:
    from simulation.soak import RATE_PER_GPU_HOUR

    return young_daly_interval_hours(_planned_stall_seconds(), 1 / (RATE_PER_GPU_HOUR * 384))


def converged_after_hours(fits: list[dict], target: float, tolerance: float = 0.25) -> float | None:
    """When the applied interval first came within `tolerance` of `target` (hours of the month)."""
    for fit in fits:
        if abs(fit["hours"] / target - 1) <= tolerance:
            return fit["t"] / 3600
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seed_range, default=[0, 1, 2, 3, 4])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=RESULTS / "adaptive_interval.json")
    args = parser.parse_args()
    start = time.time()
    jobs = [(seed, case, args.days) for seed in args.seeds for case in CASES]
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs))) as pool:
        runs = list(pool.map(run_case, jobs))
    prior_mtbf = runs[0]["interval_fits"][0]["plan_mtbf_hours"] if runs[0]["interval_fits"] else None
    target_4x = young_daly_interval_hours(_planned_stall_seconds(), prior_mtbf / 4) if prior_mtbf else None
    per_seed = []
    for seed in args.seeds:
        case = {r["case"]: r for r in runs if r["seed"] == seed}
        learn, fixed, calm = case["learn_4x"], case["fixed_4x"], case["learn_1x"]
        planned = calm["interval_fits"][0]["hours"] if calm["interval_fits"] else None
        moves = [abs(f["hours"] / planned - 1) for f in calm["interval_fits"][1:]] if planned else []
        per_seed.append({
            "seed": seed,
            "goodput_learn_4x": learn["goodput"], "goodput_fixed_4x": fixed["goodput"],
            "gain_points": 100 * (learn["goodput"] - fixed["goodput"]),
            "learn_4x_within_25pct_after_hours": converged_after_hours(learn["interval_fits"], target_4x),
            "learn_4x_last_interval_hours": learn["interval_fits"][-1]["hours"] if learn["interval_fits"] else None,
            "learn_1x_planned_interval_hours": planned,
            "learn_1x_largest_move": max(moves, default=0.0),
            "goodput_learn_1x": calm["goodput"],
            "missed": sum(r["missed_faults"] for r in case.values()),
            "false_positives": sum(r["false_positives"] for r in case.values()),
            "false_exclusions": sum(len(r["false_exclusions"]) for r in case.values()),
        })  # fmt: skip
    converged = [s["learn_4x_within_25pct_after_hours"] for s in per_seed]
    summary = {
        "prior_job_mtbf_hours": prior_mtbf,
        "young_daly_hours_prior": _prior_young_daly(),
        "young_daly_hours_true_4x": target_4x,
        "goodput_learn_4x_mean": statistics.fmean(s["goodput_learn_4x"] for s in per_seed),
        "goodput_fixed_4x_mean": statistics.fmean(s["goodput_fixed_4x"] for s in per_seed),
        "gain_points_mean": statistics.fmean(s["gain_points"] for s in per_seed),
        "converged_within_a_week": sum(1 for c in converged if c is not None and c <= 168),
        "seeds": len(per_seed),
        "learn_1x_largest_move_max": max(s["learn_1x_largest_move"] for s in per_seed),
        "learn_1x_months_within_20pct": sum(1 for s in per_seed if s["learn_1x_largest_move"] <= 0.2),
        "missed": sum(s["missed"] for s in per_seed),
        "false_positives": sum(s["false_positives"] for s in per_seed),
        "false_exclusions": sum(s["false_exclusions"] for s in per_seed),
    }
    out = {"summary": summary, "per_seed": per_seed, "runs": runs,
           "bench": {"wall_seconds": round(time.time() - start, 1), "days": args.days}}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(json.dumps(summary, indent=1))
    for s in per_seed:
        print(s)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
