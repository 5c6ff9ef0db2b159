"""The planner's wait for nodes (orchestrator/plan/pool_wait.py) against a Monte-Carlo of node
outages on a timeline: failures at random times, each node out for its probation, a job that ends
at its (spares + 1)-th failure or at its time limit, and a new job that waits until no more than
`slack` nodes are out. The simulation knows nothing of the formula (no Poisson counts, no order
statistics): it keeps the return time of every node and sorts them."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from orchestrator.plan.goodput_model import poisson_at_least
from orchestrator.plan.pool_wait import pool_wait_hours


def simulated_wait(
    rate: float, out: float, slack: int, spares: int, limit: float, jobs: int, seed: int, feedback: bool
) -> tuple[float, float]:
    """(mean hours a job start waited for nodes, its standard error). `feedback`: a waiting job
    takes no failures (the real run); without it the failures go on in training time as the
    formula assumes."""
    rng = random.Random(seed)
    t, returns, waits = 0.0, [], []
    for _ in range(jobs):
        start, failures = t, 0
        while True:
            gap = rng.expovariate(rate)
            if t + gap > start + limit:
                t = start + limit
                break
            t += gap
            failures += 1
            returns.append(t + out)
            if failures == spares + 1:
                break
        returns = sorted(r for r in returns if r > t)
        wait = returns[len(returns) - slack - 1] - t if len(returns) > slack else 0.0
        waits.append(wait)
        if feedback:
            t += wait
    return statistics.fmean(waits), statistics.stdev(waits) / math.sqrt(len(waits))


@pytest.mark.parametrize(
    ("rate", "out", "slack", "spares"),
    [(0.05, 72.0, 4, 4), (0.06, 72.0, 8, 4), (0.2, 24.0, 1, 1), (0.1, 48.0, 3, 0)],
)
def test_the_wait_matches_a_simulated_timeline_within_its_sampling_error(rate, out, slack, spares):
    # Jobs without a time limit end at a failure: seen from there, the other failures of the last
    # probation are exactly the formula's Poisson count (the formula's premise, not its algebra).
    simulated, error = simulated_wait(rate, out, slack, spares, math.inf, 20000, seed=7, feedback=False)
    formula = pool_wait_hours(rate * out, slack, out, ends_on_failure=1.0)
    print(f"formula {formula:.3f} h, simulated {simulated:.3f} +- {error:.3f} h")
    assert abs(formula - simulated) < 4 * error + 1e-9


def test_bloom_at_ten_times_llama3s_rate_the_formula_is_within_a_quarter_of_the_simulated_run():
    # BLOOM at x10 with the simulated month's pool: 0.0568 node-taking failures an hour (0.75 of
    # 384 GPUs x 10 x Llama 3's rate), 72 h probation, 4 spares, 100 h jobs, 8 nodes of slack. With
    # time limits and a waiting job taking no failures, the formula is an approximation (the
    # module docstring says which way each error goes): say how far, within sampling error.
    rate, out, slack, spares, limit = 0.0568, 72.0, 8, 4, 100.0
    simulated, error = simulated_wait(rate, out, slack, spares, limit, 20000, seed=3, feedback=True)
    formula = pool_wait_hours(rate * out, slack, out, poisson_at_least(rate * limit, spares + 1))
    print(f"formula {formula:.3f} h, simulated {simulated:.3f} +- {error:.3f} h")
    assert abs(formula - simulated) < 0.25 * simulated + 3 * error


def test_no_wait_without_nodes_out_or_with_room_for_all_of_them():
    assert pool_wait_hours(0.0, 0, 72.0, 1.0) == 0.0
    assert pool_wait_hours(0.41, 12, 72.0, 0.001) < 1e-9
    # Slack 0 after a failure: the newest node out must return too, a whole probation.
    assert pool_wait_hours(1e-9, 0, 72.0, 1.0) == pytest.approx(72.0)
