"""How long a new job waits for nodes while failed nodes are out of service (pure arithmetic).

The model, from config values only:
- which failures take a node out: the controller excludes the node of a GPU fault and of a host
  fault (lost or frozen) for `exclusions.probation_hours`; a lost host's node is excluded before
  SLURM declares it DOWN, so its repair hides inside the probation when it takes no longer. A
  software fault relaunches on the same nodes, a network hang excludes none. So a share
  NODE_TAKING_SHARE = FAULT_SHARES gpu + host = 0.75 of the failures (Llama 3, Table 5) takes a
  node out, at rate r = NODE_TAKING_SHARE / M per training hour (job MTBF M);
- when it matters: a running job keeps its nodes (a node-taking failure inside it takes a spare), so the pool
  is asked only when a job starts, after a job-level restart or a time limit. The controller then
  asks for the spares the pool has (controller/pool.py: min(spare_nodes, usable - nodes)): the job
  waits only while fewer than `nodes` are usable, i.e. while more than
  slack = spare_nodes + cluster.partition_extra_nodes nodes are out;
- how many are out when a job starts: looking back from a job start, the failures before it form a
  Poisson process in training time (a job ends at a failure or at its limit, both independent of
  the failures before them), so K ~ Poisson(m) of them, m = r x P (P = probation_hours), lie in
  the last probation window, each with a probation left uniform on (0, P); the failure that ended
  the job (with probability q = P(N >= S + 1), the planner's out_of_spares_probability) adds one
  with all of P left;
- the wait: until only `slack` are out, i.e. until the j-th of them returns, j = K + e - slack
  (e = 1 after a failure, 0 after a time limit): E[wait | K, e] = P j / (K + 1) (the j-th smallest
  of K uniforms), P when j = K + 1 (slack 0: the newest must return too), 0 when j <= 0:
      E[W] = P sum_K Poisson(K; m) [q w(K + 1 - slack, K) + (1 - q) w(K - slack, K)],
      w(j, K) = 0 if j <= 0, j / (K + 1) if j <= K, else 1.
  The planner adds E[W] to every job's start (goodput_model.cycle_losses: the renewal cycle).
Where it is exact, and where not (tests/unit/test_pool_wait.py simulates the outages on a
timeline): jobs without a time limit, failures going on in training time: exact. With a time limit,
a job that ends at a failure had its failures close together, so more of them are still out than
Poisson(m) says (the formula low); a waiting job takes no failures, so fewer are (the formula high).
For BLOOM at 10x Llama 3's rate with 8 nodes of slack the two leave the formula 10% under the
simulated timeline (0.54 h against 0.59 h per job start). Not modelled: a pool short beyond the
controller's own exclusions makes it return probations (controller/refusal.py); `exclusions.
on_pool_short: release_oldest` returns them at once (no wait is counted then); a node SLURM keeps
DOWN longer than its probation.
"""

from __future__ import annotations

import math

from orchestrator.plan.restart_paths import FAULT_SHARES

NODE_TAKING_SHARE = FAULT_SHARES["gpu"] + FAULT_SHARES["host"]


def nodes_out_mean(job_mtbf_hours: float, out_hours: float) -> float:
    """m: nodes out of service on average while the run trains (failures x probation)."""
    if job_mtbf_hours <= 0 or math.isinf(job_mtbf_hours):
        return 0.0
    return NODE_TAKING_SHARE * out_hours / job_mtbf_hours


def _returned_share(j: int, k: int) -> float:
    """E[j-th smallest of k uniforms on (0, 1)], 1 when j = k + 1 (a node with the whole probation)."""
    if j <= 0:
        return 0.0
    return j / (k + 1) if j <= k else 1.0


def pool_wait_hours(mean_out: float, slack: int, out_hours: float, ends_on_failure: float) -> float:
    """E[W]: hours a job start waits for nodes (the module docstring has the model)."""
    if mean_out <= 0 or out_hours <= 0:
        return 0.0
    total, k, term = 0.0, 0, math.exp(-mean_out)
    # Sum until the Poisson tail is negligible (terms below the mean + 12 sd and past the slack).
    last = max(slack + 2, int(mean_out + 12 * math.sqrt(mean_out) + 12))
    while k <= last:
        share = ends_on_failure * _returned_share(k + 1 - slack, k)
        share += (1 - ends_on_failure) * _returned_share(k - slack, k)
        total += term * share
        k += 1
        term *= mean_out / k
    return out_hours * total
