"""Sparse passes change nothing: the soak's pass spacing against one pass per poll.

The soak (simulation/soak.py) keeps passes sparse through honest work that stays slow but moves
(a 2.5x step, a 5-minute eval, lognormal step noise): a pass at each one's begin and end, none in
between. The oracle here is the same slice of a run with a pass every poll_seconds from the first
step on: the same world (seed) under both spacings must leave the controller with the same learned
hang limits, the same events in the same order, the same exclusions, and the hang detected within
a poll of the dense run's detection. The slice: a 2.5x step, a 5-minute eval, a 10-minute storage
stall of one node (Harness.silence), then a network hang."""

from __future__ import annotations

import math
import random

from simulation.harness import Harness
from simulation.scenarios import bound_seconds
from simulation.soak import STEP_TAIL_SIGMA

TRIVIAL = {"controller_started", "permissions_warning", "disk", "job_adopted"}


def _slice(run_dir, dense: bool) -> dict:
    seen: dict = {}
    with Harness(run_dir, seed=5, spare_nodes=8, cap_seconds=3600.0, dense_after_note=0.0) as h:
        h.world.step_tail = (random.Random(11), STEP_TAIL_SIGMA)
        w = h.cfg.watchdog

        def slow(t):
            h.world.running_incarnation().slow_steps.append(2.5)

        def evaluate(t):
            h.world.running_incarnation().forced_eval_seconds = 300.0

        def stall(t):
            inc = h.world.running_incarnation()
            h.world.stall_node_storage(t, inc.nodes[7], 600.0)

        def hang(t):
            seen["limits"] = h.controller.timeouts.as_dict()
            seen["hang"] = t
            h.world.hang(t)

        def started(t, what, fields):
            if what != "training":
                return False
            if dense:
                h.dense_from = t
            h.at(t + 150, slow, window=False)
            h.at(t + 500, evaluate, window=False)
            h.silence(t + 950, stall, 600.0)
            h.at(
                t + 1650,
                hang,
                pre=w.heartbeat_seconds + 2 * w.poll_seconds,
                quiet=bound_seconds(h, "hang", {}) + 60,
            )
            return True

        h.world.watchers.append(started)
        h.run_until(6 * 3600, stop=lambda hh: "hang" in seen and hh.t > seen["hang"] + 300)
        assert "hang" in seen, "the slice never reached its hang"
        events = [(e[2].KIND, getattr(e[2], "job_id", None)) for e in h.events if e[2].KIND not in TRIVIAL]
        failures = [e[0] for e in h.events if e[2].KIND == "failure" and e[0] >= seen["hang"]]
        return {
            "limits": seen["limits"],
            "events": events,
            "detected_after": failures[0] - seen["hang"] if failures else math.inf,
            "excluded": h.excluded(),
            "slow_steps": [f["seconds"] for _, what, f in h.world.notes if what == "slow_step_done"],
            "passes": len(h.passes),
            "poll": w.poll_seconds,
        }


def test_sparse_passes_learn_and_act_as_dense_ones(sim_run_dir):
    sparse = _slice(sim_run_dir / "sparse", dense=False)
    dense = _slice(sim_run_dir / "dense", dense=True)
    print(
        {k: v for k, v in sparse.items() if k != "events"}, {k: v for k, v in dense.items() if k != "events"}
    )
    assert dense["slow_steps"] and dense["slow_steps"] == sparse["slow_steps"], "the same world under both"
    assert dense["passes"] > 1.5 * sparse["passes"], "the oracle must be the denser run"
    assert sparse["limits"] == dense["limits"], "learned hang limits differ"
    assert sparse["events"] == dense["events"]
    assert sparse["excluded"] == dense["excluded"]
    assert math.isfinite(dense["detected_after"]), "the dense run must detect the hang"
    assert abs(sparse["detected_after"] - dense["detected_after"]) <= dense["poll"]
