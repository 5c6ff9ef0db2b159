"""The arithmetic of failures and checkpoints that the planner's goodput is made of (pure): the
Young/Daly interval and its goodput, where a job's failures go when it holds spares, and the
goodput of one job and the start of the next (planner.py's module docstring has the model)."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass


def young_daly_interval_hours(save_seconds: float, job_mtbf_hours: float) -> float:
    return math.sqrt(2 * (save_seconds / 3600) * job_mtbf_hours)


def save_period_hours(interval_hours: float, stall_seconds: float, overshoot_seconds: float) -> float:
    """From one save's snapshot to the next. The trainer restarts its interval clock when a save
    returns (after its stall), and it decides at step ends: a time-based save starts at the end of
    the step in which the interval runs out, half a step late on average (`overshoot_seconds`); a
    step-based one is not late."""
    return interval_hours + (stall_seconds + overshoot_seconds) / 3600


def goodput(interval_hours: float, save_seconds: float, job_mtbf_hours: float, restart_hours: float) -> float:
    """Young/Daly's first-order goodput: minus checkpoint saves, minus per failure the work since the
    last checkpoint (tau/2 on average) and the restart time (no time limit, no evals; `plan_run`
    uses `cycle_losses`, which has both)."""
    save_hours = save_seconds / 3600
    lost = save_hours / interval_hours + (interval_hours / 2 + restart_hours) / job_mtbf_hours
    return max(0.0, 1.0 - lost)


def poisson_at_least(mean: float, k: int) -> float:
    """P(N >= k) for N ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    term = below = math.exp(-mean)
    for i in range(1, k):
        term *= mean / i
        below += term
    return max(0.0, 1.0 - below)


@dataclass(frozen=True)
class SpareOutlook:
    failures_per_job: float  # mu: expected failures of the training GPUs in one time limit
    spares_used_per_job: float  # E[min(N, S)], N the failures that take a node
    out_of_spares_probability: float  # P(N >= S + 1): the job ends on a failure with no spare left
    in_allocation_share: float  # of a job's failures, the share restarted inside it
    mean_restart_hours: float  # the restart times weighted by the two shares
    job_length_hours: float  # E[D]: a job ends at its limit or at its (S + 1)-th node-taking failure
    in_allocation_restarts_per_job: float  # on a spare, or in place for a failure that takes no node


def spare_outlook(
    job_hours: float,
    job_mtbf_hours: float,
    spares: int,
    in_allocation_hours: float,
    job_restart_hours: float,
    node_share: float,
) -> SpareOutlook:
    """Where failures go when a job holds `spares` spare nodes (planner.py's docstring has the model).
    A share `node_share` of the failures takes a node (the controller excludes it: a spare takes
    over); the others restart inside the job on the same nodes, whatever the spares.

    With N ~ Poisson(node_share x mu) node-taking failures in a time limit: E[min(N, S)] =
    sum_{k=1..S} P(N >= k), each k-th of them using the k-th spare; the job ends at the (S + 1)-th,
    so it lasts E[D] = (M / node_share) E[min(N, S + 1)] (Wald), and the others come at rate
    (1 - node_share) / M over it."""
    mu = job_hours / job_mtbf_hours
    taking = node_share * mu
    used = sum(poisson_at_least(taking, k) for k in range(1, spares + 1))
    out = poisson_at_least(taking, spares + 1)
    length = job_mtbf_hours / node_share * (used + out) if taking > 1e-12 else job_hours
    in_place = (1 - node_share) * length / job_mtbf_hours
    failures = used + in_place + out
    if failures > 0:
        share = (used + in_place) / failures
    else:  # a zero time limit: no failure in a job; say what the first one would do
        share = 1.0 if spares else 0.0
    mean = share * in_allocation_hours + (1 - share) * job_restart_hours
    return SpareOutlook(mu, used, out, share, mean, length, used + in_place)


@dataclass(frozen=True)
class CycleLosses:
    """Where the wall time of one job and the next one's start goes (shares of that cycle's wall time)."""

    saves: float  # the save stalls
    work_lost: float  # the work since the newest complete save, per failure
    in_allocation_restarts: float  # restarts inside the job (on a spare, or in place)
    final_save: float  # the save before the time limit, of a job that reaches it
    evals: float
    job_start: float  # the next job's queue, start and load
    node_wait: float  # the next job's wait for nodes on probation (pool_wait.py)

    @property
    def goodput(self) -> float:
        return max(0.0, 1.0 - sum(astuple(self)))


def cycle_losses(
    save_period_hours: float,
    stall_seconds: float,
    job_mtbf_hours: float,
    outlook: SpareOutlook,
    in_allocation_hours: float,
    job_start_hours: float,
    final_save_seconds: float,
    evals: float,
    pool_wait: float = 0.0,
    unsealed_hours: float = 0.0,
) -> CycleLosses:
    """Over one job and the start of the next (the module docstring has the model); goodput is
    useful / wall of that cycle.
    `save_period_hours`: from one save's snapshot to the next (planner.save_period_hours).
    `unsealed_hours`: how long a save stays incomplete after its snapshot begins (the stall, and an
    async save's background write); a failure then loses that save too (the newest complete
    checkpoint is the one before), so a failure loses P/2 + U on average."""
    job_length = outlook.job_length_hours
    if job_length <= 0:
        return CycleLosses(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    reaches_limit = 1 - outlook.out_of_spares_probability
    wall = job_length + job_start_hours + pool_wait  # the next job waits for nodes, then starts
    in_job = job_length / wall
    return CycleLosses(
        saves=stall_seconds / 3600 / save_period_hours * in_job,
        work_lost=(save_period_hours / 2 + min(unsealed_hours, save_period_hours)) / job_mtbf_hours * in_job,
        in_allocation_restarts=outlook.in_allocation_restarts_per_job * in_allocation_hours / wall,
        final_save=reaches_limit * final_save_seconds / 3600 / wall,
        evals=evals * in_job,
        job_start=job_start_hours / wall,
        node_wait=pool_wait / wall,
    )
