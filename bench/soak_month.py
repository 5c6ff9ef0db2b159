"""30 days of BLOOM-176B on a virtual clock: the real controller, a simulated SLURM, 384 simulated
ranks, faults at Llama 3's published rate (orchestrator/simulation/soak.py states the source, the
rate and the mix). Writes bench/results/soak.json and prints a short summary.

    .venv/bin/python bench/soak_month.py [--days 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.simulation.soak import run_soak  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = parser.parse_args()
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    holder = Path(tempfile.mkdtemp(prefix="soak-", dir=base))
    start, cpu = time.time(), time.process_time()
    try:
        result = run_soak(holder / "run", days=args.days, seed=args.seed)
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    result["bench"] = {
        "wall_seconds": round(time.time() - start, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "seed": args.seed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(summary(result))
    print(f"written to {args.out}")
    return 0


def summary(r: dict) -> str:
    hours = r["wall_seconds"] / 3600
    lost = "\n".join(
        f"  {k:<18} {v / 3600:7.2f} h  ({100 * v / r['wall_seconds']:.2f}%)"
        for k, v in sorted(r["lost_seconds"].items(), key=lambda kv: -kv[1])
        if v
    )
    p = r["planner"]
    return (
        f"soak: {r['days']:g} days of BLOOM-176B (384 GPUs), seed {r['bench']['seed']}, "
        f"{r['bench']['wall_seconds']} s wall / {r['bench']['cpu_seconds']} s CPU, {r['passes']} controller passes\n"
        f"fault rate: {r['rate_per_gpu_hour']:.3g} per GPU-hour ({r['source']}); job MTBF {r['job_mtbf_hours']:.0f} h\n"
        f"faults: {r['faults_real']} injected, {r['missed_faults']} missed, {r['late_detections']} detected after "
        f"their bound, {r['false_positives']} false positives, "
        f"false exclusions {r['false_exclusions']}, controller crashes {len(r['controller_crashes'])}\n"
        f"goodput: {100 * r['goodput']:.2f}% ({r['useful_seconds'] / 3600:.1f} h useful of {hours:.0f} h)\n"
        f"time lost per cause:\n{lost}\n"
        f"planner (Young/Daly, R = {r['restart_hours_measured']:.2f} h measured, save {r['save_seconds_measured']:.0f} s): "
        f"{100 * p['goodput_at_published_rate']:.2f}% at the published rate, "
        f"{100 * p['goodput_at_realized_faults']:.2f}% at the {r['faults_real']} faults drawn, "
        f"{100 * p['goodput_with_config_restart_minutes']:.2f}% with the config's restart_minutes; "
        f"sim without eval and job turnover (not in the model): {100 * p['goodput_sim_without_eval_and_job_turnover']:.2f}%"
    )


if __name__ == "__main__":
    sys.exit(main())
