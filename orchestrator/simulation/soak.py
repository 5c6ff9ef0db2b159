"""A simulated month of BLOOM: faults at a published rate against the real controller.

Rate: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4): 419 unexpected
interruptions in 54 days of pre-training on 16,384 H100 GPUs, i.e. 419 / (54 x 24 x 16,384) =
1.97e-5 per GPU-hour; on BLOOM's 384 GPUs, 7.6e-3 per hour: a job MTBF of 132 h, about 5.5
interruptions in 30 days. Fault times are a seeded Poisson process at that rate.
Mix (their Table 5, grouped, approximate): 58% GPU (faulty GPU, HBM3, SRAM, GSP, thermal: the
rank is killed, srun reports the signal, its node is to blame); 13% software bugs (a rank raises,
exit 1, no node to blame); 12% network (switch/cable, NIC, NCCL watchdog: a collective hangs);
17% host (maintenance, PSU, chassis, CPU, memory, SSD: the node is lost).

Accounting: the world's ledger charges every second of the month to one cause (world.py); the
steps whose work survived (the last completion of each step index) are the useful time, the
other step time is "recomputed". Each injected fault is matched with the controller's events: a
`failure` event for the faulted job after the fault is a detection; a `failure` event for a job
with no injected fault is a false positive; an excluded node that no fault touched is a false
exclusion.
"""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path
from typing import Any

from orchestrator.planner import goodput

from .harness import Harness
from .scenarios import bound_seconds

SOURCE = (
    'Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4: 419 unexpected interruptions '
    "in 54 days on 16,384 GPUs"
)
RATE_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
FAULT_MIX = [  # (kind, share, what the simulation does, bound key)
    ("gpu", 0.58, "a rank is killed by a GPU error (srun: Killed)", "job_end"),
    ("software", 0.13, "a rank raises (exit 1)", "job_end"),
    ("network", 0.12, "a collective hangs: all ranks beat, none progress", "hang"),
    ("host", 0.17, "a node is lost: its 8 ranks stop beating", "dead_rank"),
]


BOUND_OF = {kind: bound for kind, _, _, bound in FAULT_MIX}


def draw_faults(rng: random.Random, hours: float, gpus: int) -> list[tuple[float, str]]:
    rate = RATE_PER_GPU_HOUR * gpus  # per hour
    faults, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= hours:
            return faults
        pick, kind = rng.random(), FAULT_MIX[-1][0]
        for name, share, _, _ in FAULT_MIX:
            if pick < share:
                kind = name
                break
            pick -= share
        faults.append((t * 3600, kind))


def run_soak(run_dir: Path, days: float = 30.0, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    with Harness(run_dir, seed=seed, spare_nodes=8, cap_seconds=3600.0, dense_after_note=0.0) as h:
        injected: list[dict[str, Any]] = []
        for t, kind in draw_faults(rng, days * 24, h.cfg.cluster.gpus):
            h.at(t, _injector(h, kind, injected, rng), post=bound_seconds(h, BOUND_OF[kind], {}) + 60)
        h.run_until(days * 86400)
        return summarize(h, injected, days)


def _injector(h: Harness, kind: str, injected: list[dict[str, Any]], rng: random.Random):
    def fire(t: float) -> None:
        inc = h.world.running_incarnation()
        record = {"t": t, "kind": kind, "job_id": getattr(inc, "job_id", None), "node": None}
        if inc is None or inc.faulted_at is not None:
            record["skipped"] = "no healthy job running (queue, restart): the fault hits idle nodes"
        elif kind in ("gpu", "software"):
            record["node"] = h.world.crash_rank(t, rng.randrange(h.world.world_size), by_signal=kind == "gpu")
        elif kind == "network":
            h.world.hang(t)
        else:
            record["node"] = h.world.lose_node(t, inc.nodes[rng.randrange(len(inc.nodes))])
        injected.append(record)

    return fire


def summarize(h: Harness, injected: list[dict[str, Any]], days: float) -> dict[str, Any]:
    wall = days * 86400
    ledger = dict(h.world.ledger)
    last_completion: dict[int, float] = {}
    for index, seconds, _, _ in h.world.steps:
        last_completion[index] = seconds
    useful = sum(last_completion.values())
    step_time = ledger.pop("step", 0.0)
    lost = {
        "detection_wait": ledger.pop("detection", 0.0),
        "queue_wait": ledger.pop("queue", 0.0),
        "startup": ledger.pop("startup", 0.0),
        "checkpoint_load": ledger.pop("load", 0.0),
        "recomputed_steps": step_time - useful,
        "saves": ledger.pop("save", 0.0),
        "eval": ledger.pop("eval", 0.0),
        "exit": ledger.pop("exit", 0.0),
        "no_job": ledger.pop("idle", 0.0),
    }
    lost.update({f"other_{k}": v for k, v in ledger.items()})
    real = [f for f in injected if "skipped" not in f]
    failures = [e for e in h.events if e[2].get("event") == "failure"]
    matched, missed = set(), []
    for fault in real:
        hit = [
            i
            for i, e in enumerate(failures)
            if str(e[2].get("job_id")) == fault["job_id"] and e[1] >= fault["t"]
        ]
        if hit:
            matched.add(hit[0])
            fault["detected_after_seconds"] = round(failures[hit[0]][0] - fault["t"], 1)
            fault["bound_seconds"] = bound_seconds(h, BOUND_OF[fault["kind"]], {})
        else:
            missed.append(fault)
    false_positives = [e[2] for i, e in enumerate(failures) if i not in matched]
    faulty_nodes = {f["node"] for f in real if f["node"]}
    false_exclusions = sorted(set(h.excluded()) - faulty_nodes)
    # Restart cost R: from each fault to the next first step of training.
    trainings = [t for t, what, _ in h.world.notes if what == "training"]
    costs = [min((x for x in trainings if x > f["t"]), default=wall) - f["t"] for f in real]
    restart_hours = statistics.fmean(costs) / 3600 if costs else 0.0
    saves = _save_durations(h)
    save_seconds = statistics.fmean(saves) if saves else h.timings.save_seconds
    interval = h.cfg.checkpoint.interval_hours or h.timings.save_interval_seconds / 3600
    mtbf = 1 / (RATE_PER_GPU_HOUR * h.cfg.cluster.gpus)
    realized_mtbf = days * 24 / len(real) if real else math.inf
    goodput_sim = useful / wall
    planned_turnover = lost["eval"] + lost["exit"] + _turnover(h)
    return {
        "source": SOURCE,
        "rate_per_gpu_hour": RATE_PER_GPU_HOUR,
        "gpus": h.cfg.cluster.gpus,
        "job_mtbf_hours": mtbf,
        "fault_mix": [{"kind": k, "share": s, "simulated_as": what} for k, s, what, _ in FAULT_MIX],
        "days": days,
        "wall_seconds": wall,
        "useful_seconds": useful,
        "distinct_steps": len(last_completion),
        "saves_done": len(_save_durations(h)),
        "goodput": goodput_sim,
        "lost_seconds": lost,
        "accounted_seconds": useful + sum(lost.values()),
        "faults_injected": injected,
        "faults_real": len(real),
        "missed_faults": len(missed),
        "late_detections": sum(
            1 for f in real if f.get("detected_after_seconds", 0) > f.get("bound_seconds", 1e18)
        ),
        "false_positives": len(false_positives),
        "false_positive_events": false_positives[:10],
        "false_exclusions": false_exclusions,
        "excluded_nodes": h.excluded(),
        "controller_crashes": [err for _, err in h.crashes],
        "restarts": h.controller.state.restarts,
        "jobs": len(h.own_jobs()),
        "restart_hours_measured": restart_hours,
        "save_seconds_measured": save_seconds,
        "planner": {
            "formula": "orchestrator.planner.goodput(interval_hours, save_seconds, job_mtbf_hours, restart_hours)",
            "goodput_at_published_rate": goodput(interval, save_seconds, mtbf, restart_hours),
            "goodput_with_config_restart_minutes": goodput(
                interval, h.cfg.checkpoint.save_seconds, mtbf, h.cfg.watchdog.restart_minutes / 60
            ),
            "goodput_at_realized_faults": goodput(interval, save_seconds, realized_mtbf, restart_hours)
            if real
            else goodput(interval, save_seconds, math.inf, 0.0),
            "not_in_the_model_seconds": planned_turnover,
            "goodput_sim_without_eval_and_job_turnover": (useful + planned_turnover) / wall,
            "gap_explained": {
                "faults_expected": days * 24 / mtbf,
                "faults_drawn": len(real),
                "work_lost_per_fault_hours_model": interval / 2,
                "work_lost_per_fault_hours_sim": lost["recomputed_steps"] / 3600 / len(real) if real else 0.0,
                "eval_and_job_turnover_fraction": planned_turnover / wall,
                "why": "the model has no evals and no planned job turnovers (100 h time limit: exit save, "
                "queue, init, load), and charges tau/2 of recomputed work per fault where the sim charges "
                "the real time since the last save; with ~6 faults a month both the fault count and the "
                "work lost per fault carry Poisson/uniform noise of +-0.3 to 0.4 points of goodput",
            },
        },
        "timings": h.timings.describe(),
        "passes": len(h.passes),
    }


def _save_durations(h: Harness) -> list[float]:
    started, durations = {}, []
    for t, what, fields in h.world.notes:
        if what == "save_start":
            started[fields["job_id"]] = t
        elif what == "save_done" and fields["job_id"] in started:
            durations.append(t - started.pop(fields["job_id"]))
    return durations


def _turnover(h: Harness) -> float:
    """Queue, startup and load of jobs that followed a planned exit (time budget), not a fault."""
    total = 0.0
    exits = [i for i in h.world.incarnations if i.exit_code == 18 and i.gone_at is not None]
    for inc in exits:
        nxt = [t for t, what, _ in h.world.notes if what == "training" and t > inc.gone_at]
        if nxt:
            total += nxt[0] - inc.gone_at
    return total
