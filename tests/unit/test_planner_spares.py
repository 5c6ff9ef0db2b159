"""Spare nodes, in-allocation restarts and the async save stall in `runctl plan`: a small case by
hand, a Monte Carlo of the spares inside jobs, properties over a grid, and BLOOM's 48 + 4 nodes."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import yaml

from orchestrator.cli.main import main
from orchestrator.plan.config import parse_config
from orchestrator.plan.goodput_model import spare_outlook
from orchestrator.plan.planner import plan_run
from orchestrator.plan.pool_wait import NODE_TAKING_SHARE
from tests.unit.test_planner import BLOOM, _bloom_with, rel

ROOT = Path(__file__).resolve().parents[2]


def _plan_json(capsys, path: Path, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["plan", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_two_nodes_one_spare_by_hand(tmp_path: Path, capsys) -> None:
    """2 training nodes of 1 GPU + 1 spare; a GPU fails every 40 h, so the job fails every
    40 / 2 = 20 h, and a 10 h job sees mu = 10 / 20 = 0.5 failures on average, 0.75 of them taking
    their node (GPU and host faults: pool_wait.NODE_TAKING_SHARE).
    Saves: sync, 360 s = 0.1 h every 2 h. Restarts: 3 min on the spare, 30 min through the queue.
    No evals (eval_iters 0): the eval term is checked in test_evals_and_turnovers_match_a_simulated_timeline."""
    data = yaml.safe_load((ROOT / "configs" / "tiny-cpu.yaml").read_text())
    data["cluster"].update(nodes=2, spare_nodes=1, time_limit="10:00:00", gpu_mtbf_hours=40, pre_timeout_seconds=600)
    # A partition large enough that no job waits for nodes on probation (tests/unit/test_pool_wait.py).
    data["cluster"].update(partition_extra_nodes=64)
    data["checkpoint"].update(interval_hours=2, interval_steps=None, save_seconds=360, async_save=False)
    # a 360 s save fits the margin and its timeout (the time budget, orchestrator/plan/time_budget.py)
    data["data"].update(eval_iters=0)
    data["watchdog"].update(restart_minutes=30, in_allocation_restart_minutes=3, checkpoint_timeout_seconds=1800)
    path = tmp_path / "two-plus-one.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = _plan_json(capsys, path)

    # Failures in one job: Poisson(0.5); 0.75 of them take the node (GPU, host faults), the others
    # (software, network) restart in place. Node-taking ones: N ~ Poisson(0.375).
    p0, p1 = math.exp(-0.375), 0.375 * math.exp(-0.375)
    first = 1 - p0  # a first node-taking failure happens: it takes the spare   0.312711
    second = 1 - p0 - p1  # a second one: no spare left, the job ends           0.054977
    # A job lasts (20 / 0.75) h x E[min(N, 2)] on average (each node-taking failure 26.7 h after the
    # last, Wald) and reaches its 10 h limit unless it meets a second one; the others come every
    # 20 / 0.25 = 80 h over it, each restarted in place like one on the spare.
    job = 20 / 0.75 * (first + second)  # 9.805012 h
    in_place = 0.25 * job / 20  # 0.122563
    inside = first + in_place  # restarts inside the job, 0.05 h each; `second` go through the queue in 0.5 h
    restart_h = (inside * 0.05 + second * 0.5) / (inside + second)  # 0.100463 h
    # From one save to the next: the 2 h interval, counted from the end of a save (0.1 h), and half a
    # step, since a save waits for the step in which the interval ends: P = 2.1 h + half of
    # tiny-cpu's step. Inside a job: a 0.1 h save every P hours, 1/20 failures per hour each losing
    # half a period and, when it hits a save, the period before (a save is incomplete for its 0.1 h:
    # + 0.1 h on average), `inside` restarts of 0.05 h, and the final 0.1 h save of a job that
    # reaches its limit. Then 0.5 h until the next job trains.
    period = 2 + 0.1 + plan["seconds_per_iteration"] / 2 / 3600  # 2.100002 h
    lost = 0.1 / period + (period / 2 + 0.1) / 20 + inside * 0.05 / job + (1 - second) * 0.1 / job  # 0.116977
    with_spare = (1 - lost) * job / (job + 0.5)  # 0.840179
    turnover = (1 - second) * (0.1 + 0.5) / (job + 0.5)  # 0.055023
    job_none = 20 / 0.75 * first  # no spare: the first node-taking failure ends the job, 8.338953 h
    lost_none = (0.1 / period + (period / 2 + 0.1) / 20 + 0.25 * job_none / 20 * 0.05 / job_none
                 + (1 - first) * 0.1 / job_none)  # fmt: skip
    without = (1 - lost_none) * job_none / (job_none + 0.5)
    with capsys.disabled():
        print(f"P(N>=2) {plan['out_of_spares_probability']:.6f} (by hand {second:.6f}), restart "
              f"{plan['mean_restart_hours']:.6f} h (by hand {restart_h:.6f}), goodput {plan['expected_goodput']:.6f} "
              f"(by hand {with_spare:.6f}), without spares {plan['expected_goodput_without_spares']:.6f} ({without}); "
              f"max error {abs(plan['expected_goodput'] - with_spare):.1e}")
    assert abs(first - 0.312711) < 1e-6 and abs(second - 0.054977) < 1e-6  # the hand numbers themselves
    assert abs(period - 2.100002) < 1e-6 and abs(job - 9.805012) < 1e-6 and abs(with_spare - 0.840179) < 1e-6
    assert abs(plan["save_period_hours"] - period) < 1e-12
    assert plan["eval_fraction"] == 0.0
    assert abs(plan["turnover_fraction"] - turnover) < 1e-12
    assert abs(plan["failures_per_job"] - 0.5) < 1e-12
    assert abs(plan["spares_used_per_job"] - first) < 1e-12
    assert abs(plan["out_of_spares_probability"] - second) < 1e-12
    assert abs(plan["in_allocation_share"] - inside / (inside + second)) < 1e-12
    assert abs(plan["mean_restart_hours"] - restart_h) < 1e-12
    assert abs(plan["expected_goodput"] - with_spare) < 1e-12
    # Where the rest goes, as shares of the cycle's wall time (the soak compares them cause by cause).
    losses, in_job = plan["losses"], job / (job + 0.5)
    assert abs(losses["work_lost"] - (period / 2 + 0.1) / 20 * in_job) < 1e-12
    assert abs(losses["saves"] - 0.1 / period * in_job) < 1e-12 and losses["evals"] == 0.0
    assert abs(losses["job_start"] - 0.5 / (job + 0.5)) < 1e-12
    assert abs(1 - sum(losses.values()) - with_spare) < 1e-12
    assert abs(plan["expected_goodput_without_spares"] - without) < 1e-12
    # Of the 3 allocated nodes only 2 train: the spare's idle hours are overhead and billed.
    assert abs(plan["expected_goodput_allocated"] - with_spare * 2 / 3) < 1e-12
    assert plan["allocated_nodes"] == 3
    assert abs(plan["allocated_gpu_hours"] - plan["gpu_hours"] * 3 / 2) < 1e-9 * plan["gpu_hours"]
    assert abs(plan["spare_gpu_hours"] - plan["gpu_hours"] / 2) < 1e-9 * plan["gpu_hours"]
    # Young/Daly on the stall: sqrt(2 x 0.1 h x 20 h) = 2 h.
    assert abs(plan["optimal_checkpoint_interval_hours"] - 2.0) < 1e-12
    # The same saves asynchronously (no probe), with a host-copy bandwidth that makes the snapshot
    # 18 s = 0.005 h every 2 h.
    async_plan = _plan_json(capsys, path, "--snapshot-gb-per-second", "0.001")
    assert async_plan["save_stall_seconds"] == 360.0, "async_save is off in this config: the stall is the save"
    data["checkpoint"].update(async_save=True, verify_probe=False)
    path.write_text(yaml.safe_dump(data))
    gb_per_second = _plan_json(capsys, path)["snapshot_gib_per_rank"] * 1024**3 / 1e9 / 18
    async_plan = _plan_json(capsys, path, "--snapshot-gb-per-second", repr(gb_per_second))
    assert abs(async_plan["save_stall_seconds"] - 18) < 1e-9
    # The stall shrinks, and so does the period; the final save before the limit does not; a save
    # is incomplete for its stall and its 0.1 h background write: a failure then loses it too.
    async_period = 2 + 0.005 + plan["seconds_per_iteration"] / 2 / 3600
    async_lost = lost - 0.1 / period + 0.005 / async_period - (period / 2 + 0.1) / 20 + (async_period / 2 + 0.105) / 20
    assert abs(async_plan["expected_goodput"] - (1 - async_lost) * job / (job + 0.5)) < 1e-12


def _simulate_jobs(
    mu: float, spares: int, jobs: int, taking: float, seed: int = 3
) -> tuple[float, float, float, float]:
    """Jobs of unit time limit with failures at rate mu, each taking its node with probability
    `taking` (a spare replaces it; the others restart in place); a job ends at its (spares + 1)-th
    node-taking failure. Returns (spares used per job, share of jobs that ran out, share of failures
    restarted inside the job, mean job length)."""
    rng = random.Random(seed)
    used = out = failures = 0
    length = 0.0
    for _ in range(jobs):
        t, took = rng.expovariate(mu), 0
        while t < 1.0 and took <= spares:
            failures += 1
            took += rng.random() < taking
            if took <= spares:
                t += rng.expovariate(mu)
        length += min(t, 1.0)
        used += min(took, spares)
        out += took > spares
    return used / jobs, out / jobs, 1 - out / failures, length / jobs


def test_spares_per_job_match_a_monte_carlo_of_jobs() -> None:
    """BLOOM with 2 spares and a GPU MTBF that gives mu = 1.5 failures per 100 h job, 0.75 of them
    taking a node (GPU and host faults)."""
    mtbf = 100 / 1.5 * 384
    plan = plan_run(parse_config(_bloom_with()), gpu_mtbf_hours=mtbf, spare_nodes=2)
    used, out, share, length = _simulate_jobs(1.5, 2, jobs=100_000, taking=NODE_TAKING_SHARE)
    outlook = spare_outlook(100.0, 100 / 1.5, 2, 0.0, 0.0, node_share=NODE_TAKING_SHARE)
    errors = (abs(plan.spares_used_per_job - used), abs(plan.out_of_spares_probability - out),
              abs(plan.in_allocation_share - share), abs(outlook.job_length_hours / 100 - length))  # fmt: skip
    print(f"simulated: used {used:.4f} out {out:.4f} in-job share {share:.4f} length {length:.4f}; planner "
          f"{plan.spares_used_per_job:.4f} {plan.out_of_spares_probability:.4f} {plan.in_allocation_share:.4f} "
          f"{outlook.job_length_hours / 100:.4f}; max error {max(errors):.4f}")
    assert abs(plan.failures_per_job - 1.5) < 1e-12
    # 100k jobs: standard errors ~0.003 (used), 0.0012 (out), 0.001 (share), 0.001 (length); 4 sigma.
    assert errors[0] < 0.012 and errors[1] < 0.005 and errors[2] < 0.004 and errors[3] < 0.004


def _simulate_timeline(
    limit: float, mtbf: float, spares: int, interval: float, stall: float, in_allocation: float,
    job_start: float, final_save: float, hours: float, seed: int, write: float = 0.0, taking: float = 1.0,
) -> float:
    """The share of `hours` of wall time that is not useful training, jobs laid out one after the
    other: each job runs `limit` hours; failures come every `mtbf` hours on average (on the job's
    clock); saves every `interval` hours of training after each (re)start, each stalling `stall`
    hours; a failure loses the work since the last save; the first `spares` failures of a job
    cost `in_allocation` hours inside it, the next one ends it; a job that reaches its limit also
    loses its `final_save`; the next job trains `job_start` hours after the last one ended; a save
    is complete `write` hours after it (an async save's background write): a failure before then
    loses the interval before it too; a failure takes its node with probability `taking` (the
    others restart in place, as on a spare, and use none)."""
    rng = random.Random(seed)
    wall = lost = 0.0
    while wall < hours:
        clock, used, started = 0.0, 0, 0.0  # started: when training last (re)started, for the saves
        while True:
            failure = clock + rng.expovariate(1 / mtbf)
            end = min(failure, limit)
            lost += ((end - started) // interval - (clock - started) // interval) * stall
            wall += end - clock
            if failure >= limit:  # the job reaches its limit: final save, then the next job starts
                lost += final_save + job_start
                wall += job_start
                break
            since = failure - started
            in_write = since >= interval and since % interval < write  # the newest save not complete yet
            lost += since % interval + (interval if in_write else 0.0)  # the work since the last complete save
            took = rng.random() < taking
            if not took or used < spares:  # in place, or a spare takes over inside the job, from the last save
                used += took
                clock = started = min(limit, failure + in_allocation)
                lost += clock - failure
                wall += clock - failure
                continue
            lost += job_start  # out of spares: the job ends, the next one starts from the last save
            wall += job_start
            break
    return lost / wall


def test_goodput_matches_jobs_laid_out_on_a_timeline() -> None:
    """The planner's goodput (saves, failures, spares, time limits) against a simulated timeline."""
    for limit, spares, in_minutes in ((20.0, 0, 3.0), (20.0, 2, 3.0), (10.0, 4, 3.0), (20.0, 2, 29.0), (100.0, 4, 3.0)):
        cfg = parse_config(_bloom_with(cluster__time_limit=f"{int(limit)}:00:00", checkpoint__adaptive_interval="off"))
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"eval_iters": 0})})
        mtbf = 30.0  # the job fails every 30 h
        plan = plan_run(cfg, gpu_mtbf_hours=mtbf * cfg.cluster.gpus, spare_nodes=spares,
                        in_allocation_restart_minutes=in_minutes)  # fmt: skip
        # Snapshots every save period (the hand test above checks it); a save is incomplete for its
        # stall and, async, its background write.
        write = plan.save_stall_seconds + (plan.save_seconds if cfg.checkpoint.async_save else 0.0)
        simulated = _simulate_timeline(
            limit, mtbf, spares, plan.save_period_hours, plan.save_stall_seconds / 3600, in_minutes / 60,
            plan.job_restart_hours, plan.save_seconds / 3600, hours=3e6, seed=spares, write=write / 3600,
            taking=NODE_TAKING_SHARE,
        )  # fmt: skip
        predicted = 1 - plan.expected_goodput
        print(f"limit {limit:g} h, {spares} spares, {in_minutes:g} min inside: lost {predicted:.5f} predicted, "
              f"{simulated:.5f} simulated; error {abs(predicted - simulated):.5f}")
        # The planner charges half an interval of work per failure (Young/Daly). A failure that comes
        # soon after a (re)start loses less (exponential gaps are mostly short: 1.475 h, not 1.5 h, at
        # 30 h and 3 h), so the planner is conservative: by 1-4% of what is lost here.
        assert simulated <= predicted < 1.05 * simulated


def test_evals_cost_a_quarter_iteration_per_eval_iteration() -> None:
    """BLOOM recomputes activations: an iteration does 4 forward passes' worth of FLOPs (forward,
    backward twice that, the recompute), an eval iteration one. 5 of them every 1000 iterations."""
    plan = plan_run(parse_config(_bloom_with()))
    assert parse_config(_bloom_with()).parallel.activation_checkpointing
    print(f"eval fraction {plan.eval_fraction:.6f}, by hand {1.25 / 1001.25:.6f}")
    assert abs(plan.eval_fraction - 1.25 / 1001.25) < 1e-12


def test_async_and_optimal_never_lower_training_goodput() -> None:
    sync_cfg = parse_config(_bloom_with(checkpoint__async_save=False))
    async_cfg = parse_config(_bloom_with(checkpoint__async_save=True))
    checked = 0
    for time_limit in ("1:00:00", "100:00:00", "20-00:00:00"):
        cfgs = [parse_config(_bloom_with(cluster__time_limit=time_limit, checkpoint__async_save=a)) for a in (False, True)]
        for mtbf in (2_000.0, 46_000.0, 1e6):
            for minutes in (0.5, 3.0, 29.0):  # in-allocation restarts, all shorter than the 30 min job-level one
                previous = None
                for spares in range(7):
                    kw = dict(gpu_mtbf_hours=mtbf, spare_nodes=spares, in_allocation_restart_minutes=minutes)
                    sync, asy = (plan_run(c, **kw) for c in cfgs)
                    assert asy.expected_goodput >= sync.expected_goodput
                    assert asy.optimal_goodput >= sync.optimal_goodput
                    assert sync.optimal_goodput >= sync.expected_goodput - 1e-12
                    assert sync.expected_goodput_allocated <= sync.expected_goodput
                    if previous is not None:
                        assert sync.out_of_spares_probability <= previous.out_of_spares_probability
                    previous = sync
                    checked += 1
    # Equal restart costs: spares cannot help. They lower goodput a little: a job-level restart gives
    # the next job a whole time limit, a spare restart leaves the job's limit and its turnover where they are.
    same = plan_run(sync_cfg, spare_nodes=4, in_allocation_restart_minutes=30)
    none = plan_run(sync_cfg, spare_nodes=0)
    assert same.turnover_fraction > none.turnover_fraction
    assert none.expected_goodput - 0.01 < same.expected_goodput < none.expected_goodput
    assert plan_run(async_cfg).save_stall_seconds < plan_run(sync_cfg).save_stall_seconds
    print(f"{checked} grid points")


def test_bloom_plan_shows_48_plus_4_nodes(capsys, monkeypatch) -> None:
    plan = _plan_json(capsys, BLOOM)
    # 107,421.875 iterations x 104.67 s on 52 nodes x 8 GPUs; the 4 spares alone: 32 GPUs.
    by_hand = 107_421.875 * 104.67 * 416 / 3600
    with capsys.disabled():
        print(f"allocated GPU-hours {plan['allocated_gpu_hours']:,.0f} (by hand {by_hand:,.0f})")
    assert plan["spare_nodes"] == 4 and plan["allocated_nodes"] == 52
    assert rel(plan["allocated_gpu_hours"], by_hand) < 1e-4
    assert rel(plan["spare_gpu_hours"], 107_421.875 * 104.67 * 32 / 3600) < 1e-4
    # 46,000 h per GPU on 384 GPUs: a job fails every 119.8 h; a 100 h job sees 100 / 119.8 failures.
    assert abs(plan["failures_per_job"] - 100 * 384 / 46_000) < 1e-12
    # async: 13.94 GB of stage 0 per rank / 5.7 GB/s + the probe's forward (104.67 s / 4 x 12 / 128)
    assert rel(plan["save_stall_seconds"], 3_982_551_552 * 3.5 / 5.7e9 + 104.674 / 4 * 12 / 128) < 2e-4
    # P(N >= 5): the 5th failure that takes a node (GPU, host: 0.75 of them) finds no spare.
    mu = 0.75 * 100 * 384 / 46_000
    out_of_spares = 1 - math.exp(-mu) * (1 + mu + mu**2 / 2 + mu**3 / 6 + mu**4 / 24)
    assert abs(plan["out_of_spares_probability"] - out_of_spares) < 1e-12 and f"{out_of_spares:.2%}" == "0.05%"
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["plan", str(BLOOM)]) == 0
    out = capsys.readouterr().out
    assert "48 nodes + 4 spares = 52 allocated (416 GPUs, 384 training)" in out, out
    assert "idle spares" in out and "of the training GPUs" in out and "of the allocated GPUs" in out
    assert "a job runs out of spares with probability 0.05%" in out, out
    assert "4.9 s per save (async: the host snapshot, 13.9 GB per rank / 5.7 GB/s (checkpoint.snapshot_gb_per_second)" in out, out
