"""Simulated months of BLOOM-176B on a virtual clock: the real controller, a simulated SLURM, 384
simulated ranks, faults at Llama 3's published rate (simulation/soak.py states the source, the
rate, the mix and the honest anomalies), over many seeds. Writes bench/results/soak.json (or
--out) with, across the seeds: per fault class the detection latency p50/p99/max; false
positives, false exclusions, missed faults and silent pending; goodput mean and 95% interval;
time lost per cause; the planner's prediction (plan_run on the config at the same fault rate).

    .venv/bin/python bench/soak_month.py --seeds 0-19 --rate-x 1 --anomalies heavy [--days 30] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulation.soak import FAULT_MIX, INJECTED_EVAL_SECONDS, late, run_soak  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Student's t, two-sided 95%, by degrees of freedom; 1.96 beyond the table.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


def t95(dof: int) -> float:
    """Student's t at `dof` degrees of freedom (the next tabled one above, 1.96 beyond the table)."""
    return T95.get(dof) or next((v for k, v in sorted(T95.items()) if k >= dof), 1.96)


def seed_range(text: str) -> list[int]:
    """'0-19' -> 0..19; '3' -> [3]; '0,4,7' -> those."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    if not out:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give A-B, A or A,B,C")
    return out


def one_seed(seed: int, days: float, rate_x: float, anomalies: str, prior_rate_x: float | None = None,
             checkpoint: dict | None = None, probe: bool = True) -> dict:  # fmt: skip
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    holder = Path(tempfile.mkdtemp(prefix=f"soak-{seed}-", dir=base))
    start, cpu = time.time(), time.process_time()
    try:
        result = run_soak(holder / "run", days=days, seed=seed, rate_x=rate_x, anomalies=anomalies,
                          prior_rate_x=prior_rate_x, checkpoint=checkpoint, probe=probe)  # fmt: skip
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    result["wall_seconds_to_simulate"] = round(time.time() - start, 1)
    result["cpu_seconds_to_simulate"] = round(time.process_time() - cpu, 1)  # the budget: ~4 a day
    return result


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def aggregate(runs: list[dict]) -> dict:
    goodputs = [r["goodput"] for r in runs]
    n = len(goodputs)
    mean = statistics.fmean(goodputs)
    sd = statistics.stdev(goodputs) if n > 1 else 0.0
    half = t95(n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
    latencies: dict[str, list[float]] = {kind: [] for kind, *_ in FAULT_MIX}
    recoveries: dict[str, list[float]] = {kind: [] for kind, *_ in FAULT_MIX}
    for r in runs:
        for fault in r["faults_injected"]:
            if "detected_after_seconds" in fault:
                latencies[fault["kind"]].append(fault["detected_after_seconds"])
            if "first_step_after_seconds" in fault:
                recoveries[fault["kind"]].append(fault["first_step_after_seconds"])
    causes = sorted({c for r in runs for c in r["lost_seconds"]})
    planner = runs[0]["planner"]
    # What the anomalies' extra evals took of the wall time, which the planner cannot know of.
    injected_evals = statistics.fmean(
        sum(a["kind"] == "eval_5min" for a in r["honest_slowness"]) * INJECTED_EVAL_SECONDS / r["wall_seconds"]
        for r in runs
    )
    less_injected = planner["plan_run_expected_goodput"] - injected_evals
    # The planner's goodput is the steady state; a soak month begins with a submission: the queue
    # and a cold start (no checkpoint to load yet) before its first step, which the run pays once.
    timings = runs[0]["timings"]
    first_start = timings["queue_wait_mean_seconds"] + timings["paths"]["seconds"]["start_cold"]
    window = less_injected * (1 - first_start / runs[0]["wall_seconds"])
    at_expected = goodput_at_expected_faults(runs)
    return {
        "seeds": [r["seed"] for r in runs],
        "days": runs[0]["days"],
        "rate_x": runs[0]["rate_x"],
        "anomalies": runs[0]["anomalies"],
        "detection_seconds": {
            kind: {
                "n": len(v),
                "p50": quantile(v, 0.5),
                "p99": quantile(v, 0.99),
                "max": max(v, default=None),
            }
            for kind, v in latencies.items()
        },
        # Failure -> first training step after it, per fault class (any path: spare or queue).
        "failure_to_first_step_seconds": {
            kind: {"n": len(v), "p50": quantile(v, 0.5), "p99": quantile(v, 0.99)} for kind, v in recoveries.items()
        },
        "failure_to_first_step_by_path": recovery_by_path(runs),
        "faults_real": sum(r["faults_real"] for r in runs),
        "false_positives": sum(r["false_positives"] for r in runs),
        "false_exclusions": sum(len(r["false_exclusions"]) for r in runs),
        "missed": sum(r["missed_faults"] for r in runs),
        "late_detections": sum(1 for r in runs for f in r["faults_injected"] if late(f)),
        # Which fault in which phase was later than its class's bound (a step-phase bound).
        "late_by_kind_and_phase": dict(
            Counter(f"{f['kind']} in {f.get('phase')}" for r in runs for f in r["faults_injected"] if late(f))
        ),
        # Network hangs: from the fault until every rank waits (the other replicas reach the
        # gradient reduce), and the detection counted from the fault.
        "network_all_waiting_after_seconds": [
            (f["all_waiting_after_seconds"], f.get("detected_after_seconds"))
            for r in runs
            for f in r["faults_injected"]
            if "all_waiting_after_seconds" in f
        ],
        "host_by_fault": host_by_fault(runs),
        "probe_verdicts": dict(sum((Counter(r.get("probe_verdicts", {})) for r in runs), Counter())),
        "controller_crashes": sum(len(r["controller_crashes"]) for r in runs),
        "pool_short_alerts": sum(r["pool_short_alerts"] for r in runs),
        "silent_pending": sum(r["silent_pending"] for r in runs),
        "goodput": {"mean": mean, "sd": sd, "ci95": [mean - half, mean + half], "per_seed": goodputs},
        "lost_fraction_mean": {
            c: statistics.fmean(r["lost_seconds"].get(c, 0.0) / r["wall_seconds"] for r in runs)
            for c in causes
        },  # fmt: skip
        "planner": {
            "expected_goodput": planner["plan_run_expected_goodput"],
            "expected_goodput_job_level_only": planner["plan_run_expected_goodput_job_level_only"],
            "terms": planner["plan_run_terms"],
            "lost_fraction": planner.get("plan_run_losses"),
            "inside_ci95": mean - half <= planner["plan_run_expected_goodput"] <= mean + half
            if n > 1
            else None,
            "injected_eval_fraction": injected_evals,
            "expected_goodput_less_injected_evals": less_injected,
            "inside_ci95_less_injected_evals": mean - half <= less_injected <= mean + half if n > 1 else None,
            "first_start_seconds": first_start,
            "expected_goodput_for_the_month": window,
            "inside_ci95_for_the_month": mean - half <= window <= mean + half if n > 1 else None,
            "inside_ci95_at_expected_faults_for_the_month": (
                at_expected["ci95"][0] <= window <= at_expected["ci95"][1] if at_expected else None
            ),
        },
        "goodput_at_expected_faults": at_expected,
    }


def goodput_at_expected_faults(runs: list[dict]) -> dict | None:
    """The seeds' goodput at the fault count the rate gives (a least-squares line of goodput on each
    month's fault count, and its 95% interval there): the same comparison as the plain mean with
    the Poisson luck of the fault count taken out, so what stays is what the model gets wrong."""
    n = len(runs)
    xs = [float(r["faults_real"]) for r in runs]
    ys = [r["goodput"] for r in runs]
    if n < 3 or len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    mean_x = statistics.fmean(xs)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    residual = math.sqrt(sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True)) / (n - 2))
    expected = runs[0]["days"] * 24 / runs[0]["job_mtbf_hours"]
    at = intercept + slope * expected
    half = t95(n - 2) * residual * math.sqrt(1 / n + (expected - mean_x) ** 2 / sxx)
    return {
        "faults_expected": expected,
        "faults_mean": mean_x,
        "goodput_per_fault": slope,
        "mean": at,
        "ci95": [at - half, at + half],
    }


def host_by_fault(runs: list[dict]) -> dict:
    """Host faults by what happened to the node (lost, frozen): detection, the probe's first
    answer and failure -> first step, p50/p99/max, and the probe's verdicts."""
    out: dict[str, dict] = {}
    for r in runs:
        for f in r["faults_injected"]:
            if f["kind"] == "host" and "skipped" not in f:
                d = out.setdefault(f.get("host_fault", "lost"), {"detected": [], "probed": [], "first_step": [],
                                                                  "verdicts": Counter()})  # fmt: skip
                for key, field in (("detected", "detected_after_seconds"), ("probed", "probed_after_seconds"),
                                   ("first_step", "first_step_after_seconds")):  # fmt: skip
                    if field in f:
                        d[key].append(f[field])
                d["verdicts"][f.get("probe_verdict", "not asked")] += 1
    return {
        what: {
            **{key: {"n": len(v), "p50": quantile(v, 0.5), "p99": quantile(v, 0.99), "max": max(v, default=None)}
               for key, v in d.items() if key != "verdicts"},  # fmt: skip
            "verdicts": dict(d["verdicts"]),
        }
        for what, d in out.items()
    }


def restart_path_of(fault: dict, launches: list[dict]) -> str:
    """How training came back after `fault`: the first launch after it, in the same job (a spare
    left: in_allocation, warm or cold, and the copy it loaded) or in a new one (job_level)."""
    after = next((x for x in launches if x["t"] > fault["t"]), None)
    if after is None:
        return "none"
    if after["job_id"] != fault.get("job_id"):
        return "job_level"
    return f"in_allocation_{'standby' if after['standby'] else 'cold'}_{after['load_source'] or 'no_checkpoint'}"


def recovery_by_path(runs: list[dict]) -> dict:
    """Failure -> first step per fault class and restart path, p50/p99 (runs that list launches)."""
    seen: dict[str, dict[str, list[float]]] = {}
    for r in runs:
        for fault in r["faults_injected"]:
            if "first_step_after_seconds" in fault and "launches" in r:
                path = restart_path_of(fault, r["launches"])
                seen.setdefault(fault["kind"], {}).setdefault(path, []).append(fault["first_step_after_seconds"])
    return {
        kind: {path: {"n": len(v), "p50": quantile(v, 0.5), "p99": quantile(v, 0.99)} for path, v in paths.items()}
        for kind, paths in seen.items()
    }


def replan(runs: list[dict]) -> None:
    """Each run's planner goodput from this tree's planner, on the soak's config at its rate (as
    simulation/soak.py asks it: the published rate is the planner's MTBF too), marked "replanned"."""
    from simulation.harness import bloom_config  # noqa: PLC0415
    from simulation.soak import RATE_PER_GPU_HOUR, plan_losses, planned  # noqa: PLC0415

    for run in runs:
        cfg = bloom_config(cluster={"gpu_mtbf_hours": 1 / (RATE_PER_GPU_HOUR * run["rate_x"])})
        plan, job_level = planned(cfg, run["rate_x"])
        run["planner"].update(
            plan_run_expected_goodput=plan.expected_goodput,
            plan_run_expected_goodput_job_level_only=job_level.expected_goodput,
            plan_run_losses=plan_losses(plan),
            replanned=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=seed_range, default=[0])
    parser.add_argument("--rate-x", type=float, default=1.0, help="times the published fault rate")
    parser.add_argument("--anomalies", choices=("none", "heavy"), default="heavy")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="seeds simulated at once")
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    parser.add_argument("--no-probe", action="store_true", help="the controller never asks a silent node")
    parser.add_argument("--resummarize", action="store_true", help="recompute --out's summary from its runs")
    parser.add_argument("--replan", action="store_true",
                        help="with --resummarize: the planner's figures again, from this tree's planner (they "
                        "depend on the config and the rate only, not on the simulated month)")  # fmt: skip
    args = parser.parse_args()
    if args.resummarize:
        result = json.loads(args.out.read_text())
        if args.replan:
            replan(result["runs"])
        result["summary"] = aggregate(result["runs"])
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
        print(summary(result))
        return 0
    if args.rate_x <= 0 or args.days <= 0 or args.jobs < 1:
        parser.error("--rate-x and --days must be positive, --jobs at least 1")
    start, cpu = time.time(), time.process_time()
    runs: list[dict] = []
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(args.seeds))) as pool:
        month = partial(one_seed, days=args.days, rate_x=args.rate_x, anomalies=args.anomalies, probe=not args.no_probe)
        for done in as_completed([pool.submit(month, seed) for seed in args.seeds]):
            runs.append(done.result())  # written after each seed: a cut-short bench keeps what it has
            write_result(args, sorted(runs, key=lambda r: r["seed"]), start, cpu)
    print(summary(write_result(args, sorted(runs, key=lambda r: r["seed"]), start, cpu)))
    print(f"written to {args.out}")
    return 0


def write_result(args: argparse.Namespace, runs: list[dict], start: float, cpu: float) -> dict:
    result = {
        "summary": aggregate(runs),
        "runs": runs,
        "bench": {
            "wall_seconds": round(time.time() - start, 1),
            "cpu_seconds_parent": round(time.process_time() - cpu, 1),
            "max_rss_mib_parent": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "jobs": args.jobs,
            "seeds_asked": args.seeds,
            "cpu_seconds_per_simulated_day": round(
                sum(r["cpu_seconds_to_simulate"] for r in runs) / (args.days * len(runs)), 2
            ),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    return result


def summary(result: dict) -> str:
    s = result["summary"]
    g, p = s["goodput"], s["planner"]
    lines = [
        f"soak: {len(s['seeds'])} seed(s) x {s['days']:g} days, rate x{s['rate_x']:g}, anomalies {s['anomalies']}, "
        f"{result['bench']['wall_seconds']} s, {result['bench']['cpu_seconds_per_simulated_day']} CPU s a simulated day",
        f"faults {s['faults_real']}: missed {s['missed']}, late {s['late_detections']}, false positives "
        f"{s['false_positives']}, false exclusions {s['false_exclusions']}, controller crashes {s['controller_crashes']}",
        f"late: {s['late_by_kind_and_phase'] or 'none'}",
        f"pool: {s['pool_short_alerts']} shortage alert(s), {s['silent_pending']} silent pending pass(es)",
        f"goodput {100 * g['mean']:.2f}% (95% interval {100 * g['ci95'][0]:.2f}-{100 * g['ci95'][1]:.2f}%); planner "
        f"{100 * p['expected_goodput']:.2f}% ({100 * p['expected_goodput_job_level_only']:.2f}% with job-level restarts only; "
        f"{100 * p.get('expected_goodput_less_injected_evals', p['expected_goodput']):.2f}% less the anomalies' extra evals, "
        f"{100 * p.get('injected_eval_fraction', 0.0):.2f}% of the wall time)",
    ]
    if "expected_goodput_for_the_month" in p:
        lines.append(
            f"  planner for the month (less those evals, and the month's first start, "
            f"{p['first_start_seconds']:.0f} s): {100 * p['expected_goodput_for_the_month']:.2f}%"
        )
    e = s.get("goodput_at_expected_faults")
    if e:
        lines.append(
            f"  goodput at the expected {e['faults_expected']:.1f} faults a month (seeds had {e['faults_mean']:.2f}): "
            f"{100 * e['mean']:.2f}% ({100 * e['ci95'][0]:.2f}-{100 * e['ci95'][1]:.2f}%), "
            f"{100 * e['goodput_per_fault']:.3f} points a fault"
        )
    for what, d in s.get("host_by_fault", {}).items():
        lines.append(
            f"  host {what:<6} (n={d['detected']['n']}) probe answered p50 {d['probed']['p50']} s, max "
            f"{d['probed']['max']} s {d['verdicts']}; detected p50 {d['detected']['p50']} s, max "
            f"{d['detected']['max']} s; training again p50 {d['first_step']['p50']} s, p99 {d['first_step']['p99']} s"
        )
    lines.append(f"  probes: {s.get('probe_verdicts')}")
    for kind, d in s["detection_seconds"].items():
        if d["n"]:
            back = s["failure_to_first_step_seconds"][kind]
            lines.append(
                f"  {kind:<9} detected in p50 {d['p50']:.0f} s, p99 {d['p99']:.0f} s, max {d['max']:.0f} s (n={d['n']}); "
                f"training again after p50 {back['p50']:.0f} s, p99 {back['p99']:.0f} s"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
