"""A simulated month of BLOOM: faults at a published rate against the real controller.

Rate: Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4): 419 unexpected
interruptions in 54 days of pre-training on 16,384 H100 GPUs, i.e. 419 / (54 x 24 x 16,384) =
1.97e-5 per GPU-hour; on BLOOM's 384 GPUs, 7.6e-3 per hour: a job MTBF of 132 h, about 5.5
interruptions in 30 days. Fault times are a seeded Poisson process at that rate.
Mix (their Table 5, grouped, approximate): 58% GPU (faulty GPU, HBM3, SRAM, GSP, thermal: the
rank is killed, srun reports the signal, its node is to blame); 13% software bugs (a rank raises,
exit 1, no node to blame); 12% network (switch/cable, NIC, NCCL watchdog: a collective hangs, and NCCL's
watchdog turns the hang into an abort of every rank: NCCL_* below);
17% host (maintenance, PSU, chassis, CPU, memory, SSD): the node is lost (it stops answering,
SLURM declares it DOWN after SlurmdTimeout) or frozen (a driver or kernel hang that stops its
processes while the node answers: SLURM never notices), HOST_FROZEN_SHARE of them
(orchestrator/plan/restart_paths.py: 4 of Table 5's 44 host rows). Either way its
peers go on to the next collective that needs it and wait there (the other replicas compute on
until the step's gradient reduce). The controller asks the silent node (controller/probe.py):
the world answers as /proc would (world.World._probe): a lost node does not answer, a frozen
one's ranks are stopped (T), a node whose storage stalls has its gatherer in D.

Honest anomalies (`anomalies="heavy"`), none of them a fault, each at a random time: every step's
time times a lognormal factor (STEP_TAIL_SIGMA); every day a step 2.5x its usual time, a 5-minute eval and a 10-minute storage stall on one node (its writes
block, it computes on); every week a 3-minute stall of the whole filesystem and a 2-minute
slurmctld outage (Slurm 22.05's answers: errors, then a queue that lags 2 min); once a month a
4-hour maintenance reservation of 4 nodes. Any `failure` they cause is a false positive.

Accounting: the world's ledger charges every second of the month to one cause (world.py); the
steps whose work survived (the last completion of each step index) are the useful time, the
other step time is "recomputed". Each injected fault is matched with the controller's events: a
`failure` event for the faulted job after the fault is a detection; a `failure` event for a job
with no injected fault is a false positive; a node excluded at any time of the month that no fault
touched is a false exclusion.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import statistics
from pathlib import Path
from typing import Any

from orchestrator.contract import failure_events as fev
from orchestrator.plan.planner import plan_run
from orchestrator.plan.restart_paths import FAULT_SHARES, HOST_FROZEN_SHARE

from .harness import Harness, bloom_config
from .scenarios import bound_seconds

SOURCE = (
    'Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4: 419 unexpected interruptions '
    "in 54 days on 16,384 GPUs"
)
RATE_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
FAULT_MIX = [  # (kind, share, what the simulation does, bound key)
    ("gpu", FAULT_SHARES["gpu"], "a rank is killed by a GPU error (srun: Killed)", "job_end"),
    ("software", FAULT_SHARES["software"], "a rank raises (exit 1)", "job_end"),
    (
        "network",
        FAULT_SHARES["network"],
        "a collective hangs: all ranks beat, none progress; NCCL aborts every rank "
        "(SIGABRT) after an async error (half of them, 8-60 s) or at its 10-min timeout",
        "hang",
    ),
    ("host", FAULT_SHARES["host"], "a node is lost or frozen: its 8 ranks stop beating", "dead_rank"),
]
# The daily honest eval of 5 minutes, on top of the config's: a cost of the injected anomalies that
# no planner can know (bench/soak_month.py compares the planner with and without it).
INJECTED_EVAL_SECONDS = 300.0

BOUND_OF = {kind: bound for kind, _, _, bound in FAULT_MIX}
# NCCL_ASYNC_ERROR_HANDLING=1 (configs/bloom-176b.yaml): PyTorch's NCCL watchdog aborts the process
# (SIGABRT, srun: "Aborted", exit 128 + 6) on an asynchronous NCCL error or when a collective
# exceeds the process group's timeout (torch.distributed's NCCL default: 10 min). Assumed (no
# published split): half of the network faults raise an async error that surfaces after the IB
# transport's retries (8-60 s); the rest are silent hangs that the timeout turns into aborts.
NCCL_TIMEOUT_SECONDS = 600.0
NCCL_ASYNC_ERROR_SHARE = 0.5
NCCL_ASYNC_ERROR_SECONDS = (8.0, 60.0)
# Heavy-tailed step times (`anomalies="heavy"`): each step's time times a lognormal factor,
# sigma 0.1 (median 1, 1 step in 1000 above 1.36x), on top of the daily 2.5x step. An assumption.
STEP_TAIL_SIGMA = 0.1


def draw_faults(rng: random.Random, hours: float, gpus: int, rate_x: float = 1.0) -> list[tuple[float, str]]:
    rate = RATE_PER_GPU_HOUR * gpus * rate_x  # per hour
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


def run_soak(
    run_dir: Path,
    days: float = 30.0,
    seed: int = 0,
    rate_x: float = 1.0,
    anomalies: str = "heavy",
    prior_rate_x: float | None = None,
    checkpoint: dict[str, Any] | None = None,
    probe: bool = True,
) -> dict[str, Any]:
    """One simulated month (`days`) at `rate_x` times the published fault rate; `anomalies`:
    "heavy" (the module docstring's) or "none". The config's `cluster.gpu_mtbf_hours` (the
    planner's MTBF, the adaptive interval's prior) is the published rate times `prior_rate_x`
    (None: `rate_x`, the rate the planner is given below too); `checkpoint` overrides that section;
    `probe`: False, the controller cannot ask a silent node (its silence rule alone decides)."""
    if anomalies not in ("heavy", "none"):
        raise ValueError(f"anomalies={anomalies!r}: use 'heavy' or 'none'")
    rng = random.Random(seed + 1)
    prior = 1 / (RATE_PER_GPU_HOUR * (rate_x if prior_rate_x is None else prior_rate_x))
    cfg = bloom_config(cluster={"gpu_mtbf_hours": prior}, checkpoint=checkpoint or {})
    # The pool beyond the job's nodes and spares: the config's, the figure the planner's pool wait uses.
    pool_extra = cfg.cluster.partition_extra_nodes
    with Harness(run_dir, seed=seed, cfg=cfg, spare_nodes=pool_extra, cap_seconds=3600.0, dense_after_note=0.0,
                 probe=probe) as h:
        injected: list[dict[str, Any]] = []
        for t, kind in draw_faults(rng, days * 24, h.cfg.cluster.gpus, rate_x):
            # Dense from one beat and two polls before the fault (its last beat and marks are seen
            # at poll resolution) until a minute after its detection bound.
            pre = h.cfg.watchdog.heartbeat_seconds + 2 * h.poll
            post = bound_seconds(h, BOUND_OF[kind], {}) + 60
            h.at(t, _injector(h, kind, injected, rng), pre=pre, quiet=post)
        honest = _heavy_tails(h, days, random.Random(seed + 2)) if anomalies == "heavy" else []
        if anomalies == "heavy":
            h.world.step_tail = (random.Random(seed + 3), STEP_TAIL_SIGMA)
        h.run_until(days * 86400)
        result = summarize(h, injected, days, rate_x)
        return {**result, "anomalies": anomalies, "rate_x": rate_x, "seed": seed, "honest_slowness": honest,
                "probe": probe}


def _heavy_tails(h: Harness, days: float, rng: random.Random) -> list[dict[str, Any]]:
    """Honest work that is slow, not stuck, each day at a random time: one step 2.5x its usual
    time (micro-batches moving, slower) and one 5-minute eval. Passes are dense over each: any
    `failure` they cause is a false positive."""
    done: list[dict[str, Any]] = []

    def slow(kind: str):
        def act(t: float) -> None:
            inc = h.world.running_incarnation()
            if inc is None or inc.faulted_at is not None:
                return
            if kind == "step_2.5x":
                inc.slow_steps.append(2.5)
            else:
                inc.forced_eval_seconds = INJECTED_EVAL_SECONDS
            done.append({"t": t, "kind": kind, "job_id": inc.job_id})

        return act

    def node_stall(t: float) -> None:
        inc = h.world.running_incarnation()
        if inc is None:
            return
        node = inc.nodes[
            rng.randrange(1, len(inc.nodes))
        ]  # not rank 0's: its metrics write would block the step
        h.world.stall_node_storage(t, node, 600.0)
        done.append({"t": t, "kind": "node_storage_stall_600", "job_id": inc.job_id, "node": node})

    def fs_stall(t: float) -> None:
        h.world.stall_filesystem(t, 180.0)
        done.append({"t": t, "kind": "fs_stall_180"})

    def slurmctld_down(t: float) -> None:
        h.world.slurm.outage(t, 120.0, "errors", 120.0)
        done.append({"t": t, "kind": "slurmctld_outage_120"})

    def maintenance(t: float) -> None:
        inc = h.world.running_incarnation()
        nodes = list(inc.nodes[-4:]) if inc is not None else []
        if nodes:
            h.world.slurm.reserve(nodes, t, t + 4 * 3600)
            done.append({"t": t, "kind": "maintenance_4h", "nodes": nodes})

    # Dense passes over a slurmctld outage: from one beat before it to a beat and two polls after
    # it ends; over a silence (a node's storage, the filesystem) at its start and end, a pass per
    # dead_after between (Harness.silence). A slow step and an eval keep their marks
    # and beats moving (harness.py's spacing argument): no window; a pass sees each begin and end
    # (the world's notes), tests/simulation/test_spacing.py checks dense passes change nothing.
    w = h.cfg.watchdog
    margin = w.heartbeat_seconds + 2 * w.poll_seconds
    pre = w.heartbeat_seconds + w.poll_seconds
    daily = (("step_2.5x", slow("step_2.5x"), None), ("eval_5min", slow("eval_5min"), None),
             ("node_storage_stall_600", node_stall, 600.0))  # fmt: skip
    weekly = (("fs_stall_180", fs_stall, 180.0), ("slurmctld_outage_120", slurmctld_down, 240.0))
    end = days * 86400
    for period, items in (
        (86400.0, daily),
        (7 * 86400.0, weekly),
        (30 * 86400.0, (("maintenance", maintenance, 0.0),)),
    ):
        for k in range(math.ceil(days * 86400 / period)):
            for _, act, lasts in items:
                t = (k + rng.uniform(0.05, 0.95)) * period
                if t < end:
                    if lasts is None:
                        h.at(t, act, window=False)
                    elif act in (node_stall, fs_stall):
                        h.silence(t, act, lasts)
                    else:
                        h.at(t, act, pre=pre, quiet=lasts + margin)
    return done


def _injector(h: Harness, kind: str, injected: list[dict[str, Any]], rng: random.Random):
    def fire(t: float) -> None:
        inc = h.world.running_incarnation()
        # The phase it hits: where no progress can be seen (init, a save) the bounds are others.
        phase = inc.phase.value if inc is not None else None
        record = {"t": t, "kind": kind, "job_id": getattr(inc, "job_id", None), "node": None, "phase": phase}
        if inc is None or inc.faulted_at is not None:
            record["skipped"] = "no healthy job running (queue, restart): the fault hits idle nodes"
        elif kind in ("gpu", "software"):
            record["node"] = h.world.crash_rank(t, rng.randrange(h.world.world_size), by_signal=kind == "gpu")
        elif kind == "network":
            # A collective of one TP group never completes (a link, a NIC): it blocks first, its
            # peers behind it, every rank ends waiting. Its own stream: the soak's draws stay put.
            h.world.hang(t, random.Random(int(t)).randrange(h.world.world_size), in_collective=True)
            # The other replicas compute on until the step's gradient reduce: the hang is seen
            # from then (every rank waiting), its detection bound counts from then.
            record["all_waiting_after_seconds"] = round((inc.all_waiting_at or t) - t, 1)
            async_error = rng.random() < NCCL_ASYNC_ERROR_SHARE
            delay = rng.uniform(*NCCL_ASYNC_ERROR_SECONDS) if async_error else NCCL_TIMEOUT_SECONDS
            record["nccl_abort_after_seconds"] = round(delay, 1)
            h.world.at(t + delay, lambda when: h.world.abort_all(when, inc))
        else:
            node = inc.nodes[rng.randrange(len(inc.nodes))]
            frozen = random.Random(int(t) + 1).random() < HOST_FROZEN_SHARE  # its own stream too
            record["host_fault"] = "frozen" if frozen else "lost"
            record["node"] = h.world.freeze_node(t, node) if frozen else h.world.lose_node(t, node)
        injected.append(record)

    return fire


def late(fault: dict[str, Any]) -> bool:
    """Detected after its class's bound, counted from when the fault could be seen: a network
    hang from when every rank waits (until then the other replicas compute on, as they would)."""
    seen_after = fault.get("all_waiting_after_seconds", 0.0)
    return fault.get("detected_after_seconds", 0.0) - seen_after > fault.get("bound_seconds", math.inf)


def planned(cfg: Any, rate_x: float) -> tuple[Any, Any]:
    """The planner on the config alone at the soak's fault rate: the plan, and the same with every
    restart job-level (no spares). It depends on the config and the rate only, not on the month."""
    mtbf = 1 / (RATE_PER_GPU_HOUR * rate_x)
    return plan_run(cfg, gpu_mtbf_hours=mtbf), plan_run(cfg, gpu_mtbf_hours=mtbf, spare_nodes=0)


def plan_losses(plan: Any) -> dict[str, float]:
    """The planner's shares of wall time lost, by cause (goodput_model.CycleLosses)."""
    return dataclasses.asdict(plan.losses)


def summarize(h: Harness, injected: list[dict[str, Any]], days: float, rate_x: float = 1.0) -> dict[str, Any]:
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
    failures = [e for e in h.events if isinstance(e[2], fev.Failure)]
    matched, missed = set(), []
    for fault in real:
        hit = [i for i, e in enumerate(failures) if e[2].job_id == fault["job_id"] and e[1] >= fault["t"]]
        if hit:
            matched.add(hit[0])
            fault["detected_after_seconds"] = round(failures[hit[0]][0] - fault["t"], 1)
            fault["bound_seconds"] = bound_seconds(h, BOUND_OF[fault["kind"]], {})
        else:
            missed.append(fault)
    false_positives = [e[2].to_dict() for i, e in enumerate(failures) if i not in matched]
    faulty_nodes = {f["node"] for f in real if f["node"]}
    # Every node excluded during the month, not only those still excluded at its end: a probation
    # that expired before then was an exclusion all the same.
    excluded_ever = {n for e in h.events if isinstance(e[2], fev.NodesExcluded) for n in e[2].nodes}
    false_exclusions = sorted((excluded_ever | set(h.excluded())) - faulty_nodes)
    # Restart cost R: from each fault to the next first step of training.
    trainings = [t for t, what, _ in h.world.notes if what == "training"]
    costs = [min((x for x in trainings if x > f["t"]), default=wall) - f["t"] for f in real]
    for fault, cost in zip(real, costs, strict=True):
        fault["first_step_after_seconds"] = round(cost, 1)
    probes = h.events_named("node_probed")
    answered: set[int] = set()
    for fault in real:  # the first answer of the faulty node's probe, and how long after the fault
        # Until training goes on again: a node a fault did not take (a software fault relaunches in
        # place) may be asked hours later about a storage stall, which is not this fault's answer.
        until = fault["t"] + fault["first_step_after_seconds"]
        mine = [i for i, e in enumerate(probes) if e[2].job_id == fault["job_id"]
                and e[2].node == fault["node"] and fault["t"] <= e[0] <= until]  # fmt: skip
        if fault["node"] and mine:
            answered.update(mine)
            fault["probed_after_seconds"] = round(probes[mine[0]][1] - fault["t"], 1)
            fault["probe_verdict"] = probes[mine[-1]][2].verdict
    # Every probe's verdict: of a node an injected fault stopped, or of one without (a storage
    # stall, or a beat late: an early answer, which decides nothing but "lost").
    probe_verdicts = dict(collections.Counter(
        f"{'fault' if i in answered else 'no fault'}: {e[2].verdict}{' (early)' if e[2].early else ''}{' (before its first beat)' if e[2].before_first_beat else ''}"
        for i, e in enumerate(probes)
    ))  # fmt: skip
    restart_hours = statistics.fmean(costs) / 3600 if costs else 0.0
    saves = _save_durations(h)
    save_seconds = statistics.fmean(saves) if saves else h.timings.save_seconds
    mtbf = 1 / (RATE_PER_GPU_HOUR * rate_x * h.cfg.cluster.gpus)
    # The planner on the config alone, at the soak's fault rate (a rate both sides are given, not a
    # measurement of the simulation).
    plan, job_level = planned(h.cfg, rate_x)
    starved = [t for t, _, _ in h.world.slurm.starved]
    short = [e[0] for e in h.events_named("pool_short")]
    silent_pending = [t for t in starved if not any(s <= t + h.poll for s in short)]
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
        "goodput": useful / wall,
        "lost_seconds": lost,
        "accounted_seconds": useful + sum(lost.values()),
        "faults_injected": injected,
        "faults_real": len(real),
        "missed_faults": len(missed),
        "late_detections": sum(1 for f in real if late(f)),
        "false_positives": len(false_positives),
        "probe_verdicts": probe_verdicts,
        "false_positive_events": false_positives[:10],
        "false_exclusions": false_exclusions,
        "excluded_nodes": h.excluded(),
        "controller_crashes": [err for _, err in h.crashes],
        "restarts": h.controller.state.restarts,
        "jobs": len(h.own_jobs()),
        "restart_hours_measured": restart_hours,
        "save_seconds_measured": save_seconds,
        "pool_starved_passes": len(starved),
        "pool_short_alerts": len(short),
        "silent_pending": len(silent_pending),
        "planner": {
            "plan_run_expected_goodput": plan.expected_goodput,
            "plan_run_expected_goodput_job_level_only": job_level.expected_goodput,
            "plan_run_losses": plan_losses(plan),
            "plan_run_terms": {
                "eval_fraction": plan.eval_fraction,
                "turnover_fraction": plan.turnover_fraction,
                "job_hours": plan.job_hours,
                "checkpoint_interval_hours": plan.checkpoint_interval_hours,
                "save_stall_seconds": plan.save_stall_seconds,
                "mean_restart_hours": plan.mean_restart_hours,
                "job_restart_hours": plan.job_restart_hours,
                "nodes_out_mean": plan.nodes_out_mean,
                "pool_slack_nodes": plan.pool_slack_nodes,
                "pool_wait_hours": plan.pool_wait_hours,
                "pool_wait_goodput_cost": plan.pool_wait_goodput_cost,
            },
        },
        "timings": h.timings.describe(),
        "passes": len(h.passes),
        # Each launch's restart path: started from the warm standby or cold, loaded from which copy.
        "launches": [
            {"t": round(t, 1), "job_id": f["job_id"], "standby": f["standby"], "load_source": f["load_source"]}
            for t, what, f in h.world.notes
            if what == "launch"
        ],
        # The controller's interval fits (checkpoint_interval_fit events), in the soak's own words.
        "interval_fits": [
            {"t": round(t, 1), "hours": e.interval_hours, "was_hours": e.previous_hours, "failures_seen": e.failures,
             "plan_mtbf_hours": e.prior_job_mtbf_hours, "why": e.evidence}
            for t, _, e in h.events_named("checkpoint_interval_fit")
        ],  # fmt: skip
        "save_starts": [round(t, 1) for t, what, _ in h.world.notes if what == "save_start"],
    }


def _save_durations(h: Harness) -> list[float]:
    started, durations = {}, []
    for t, what, fields in h.world.notes:
        if what == "save_start":
            started[fields["job_id"]] = t
        elif what == "save_done" and fields["job_id"] in started:
            durations.append(t - started.pop(fields["job_id"]))
    return durations
