"""3D-parallel layouts of the tiny BLOOM on the CPU: time per step, and the measured pipeline bubble.

    python bench/parallel_layouts.py [--steps 6] [--dtype bf16] [--quick]

1. Time per step for each (dp, tp, pp) layout of the tests (tests/parallel/three_d_harness.py:
   real DeepSpeed PipelineEngine + ZeRO-1 BF16_Optimizer, gloo ranks, one thread each), median
   over the steps after the first two. On a 2-core machine more than 2 ranks time-share the
   cores, so these numbers measure overheads (collectives, schedule, process oversubscription),
   not scaling: read them as "what a layout costs on this box", not as speedups.
2. The pipeline bubble at pp = 2 (dp = tp = 1: one core per stage) for m = 1, 2, 4, 8
   micro-batches. Every schedule instruction is timed on each stage; the bubble is the part of
   the schedule (everything except ReduceGrads/ReduceTiedGrads/OptimizerStep) a stage spends not
   computing (ForwardPass, BackwardPass, LoadMicroBatch): waiting in RecvActivation/RecvGrad and
   sending. DeepSpeed's 1F1B schedule's ideal bubble is (pp-1)/(m+pp-1), for equal stage times and
   free communication.

Results go to bench/results/parallel_layouts.json (with the machine's core count and the date).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.parallel.three_d_runs import run_layout  # noqa: E402

LAYOUTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 2, 2), (2, 2, 2)]
COMPUTE = ("ForwardPass", "BackwardPass", "LoadMicroBatch")
OUTSIDE_SCHEDULE = ("ReduceGrads", "ReduceTiedGrads", "OptimizerStep")


def time_layouts(work: Path, steps: int, dtype: str, layouts) -> list[dict]:
    rows = []
    for dp, tp, pp in layouts:
        result = run_layout(work, dp, tp, pp, dtype, steps)
        timed = result["step_seconds"][2:] or result["step_seconds"]
        row = {"dp": dp, "tp": tp, "pp": pp, "ranks": dp * tp * pp, "dtype": dtype,
               "micro_batches": result["micro_batches"], "step_seconds_median": statistics.median(timed),
               "step_seconds": result["step_seconds"], "launch_wall_seconds": result["wall_seconds"]}
        print(f"(dp,tp,pp)=({dp},{tp},{pp}) {dtype}: {row['step_seconds_median'] * 1e3:.1f} ms/step "
              f"(m={row['micro_batches']}, {row['ranks']} ranks, launch+init+steps {result['wall_seconds']:.0f} s)")  # not a beat or event: a layout's rank count
        rows.append(row)
    return rows


def stage_bubble(step: dict) -> tuple[float, float, float]:
    """(bubble fraction, compute seconds, schedule seconds) of one stage in one step."""
    schedule = sum(v for k, v in step.items() if k not in OUTSIDE_SCHEDULE)
    compute = sum(step.get(k, 0.0) for k in COMPUTE)
    return 1.0 - compute / schedule, compute, schedule


def measure_bubble(work: Path, steps: int, micro_batches: list[int], hidden: int) -> list[dict]:
    rows = []
    pp = 2
    for m in micro_batches:
        result = run_layout(work, 1, 1, pp, "fp32", steps, global_batch=2 * m, hidden_size=hidden, instrument=True)
        per_stage = []
        for rank_record in result["instruction_seconds"]:
            stage = rank_record["coords"][2]
            samples = [stage_bubble(s) for s in rank_record["steps"][2:] or rank_record["steps"]]
            compute = statistics.median(c for _, c, _ in samples)
            schedule = statistics.median(t for _, _, t in samples)
            # 1F1B with equal stages idles (pp-1) micro-batches' compute; the rest of the idle time is
            # the cost of the point-to-point transfers (and waiting on a slower neighbour), per micro-batch.
            ideal_idle = (pp - 1) * compute / m
            per_stage.append({"stage": stage, "bubble": statistics.median(b for b, _, _ in samples),
                              "compute_seconds": compute, "schedule_seconds": schedule,
                              "excess_idle_per_micro_batch_seconds": (schedule - compute - ideal_idle) / m})
        measured = statistics.mean(s["bubble"] for s in per_stage)
        ideal = (pp - 1) / (m + pp - 1)
        rows.append({"pp": pp, "micro_batches": m, "measured_bubble": measured, "ideal_bubble": ideal,
                     "per_stage": per_stage, "hidden_size": hidden,
                     "step_seconds_median": statistics.median(result["step_seconds"][2:] or result["step_seconds"])})
        stages = ", ".join(f"{s['bubble']:.3f}" for s in per_stage)
        print(f"pp={pp} m={m}: measured bubble {measured:.3f} vs (pp-1)/(m+pp-1) = {ideal:.3f} (stages: {stages})")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--hidden", type=int, default=192, help="hidden size of the bubble runs (more compute per stage)")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--quick", action="store_true", help="only (1,1,1), (1,1,2), (2,2,2) and m = 1, 4")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "parallel_layouts.json"))
    args = parser.parse_args(argv)
    layouts = [(1, 1, 1), (1, 1, 2), (2, 2, 2)] if args.quick else LAYOUTS
    micro_batches = [1, 4] if args.quick else args.micro_batches
    with tempfile.TemporaryDirectory(prefix="bench-3d-") as tmp:
        work = Path(tmp)
        layout_rows = time_layouts(work, args.steps, args.dtype, layouts)
        bubble_rows = measure_bubble(work, args.steps, micro_batches, args.hidden)
    results = {"machine": {"cpus": os.cpu_count(), "threads_per_rank": 1},
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "model": "tests/parallel/three_d_harness.py tiny BLOOM (4 layers, h=48, 6 heads, s=16, V=256)",
               "layouts": layout_rows, "pipeline_bubble": bubble_rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
