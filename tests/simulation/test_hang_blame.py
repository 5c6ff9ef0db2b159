"""Blame in a hang, simulated at BLOOM's layout (tp=4 x pp=12 x dp=8 on 48 nodes of 8): a hung rank
blocks its collective peers (simulation/incarnation.hang_rank), each with a WAIT mark, as on the
real cluster. The real controller must exclude exactly the hung rank's node when it stopped in its
own work, and no node when every stuck rank waits (a TP group's collective that never completes)."""

from __future__ import annotations

import pytest

from orchestrator.contract import Mark
from simulation.harness import Harness
from simulation.scenarios import bound_seconds

HUNG = 100  # stage 3, replica 1, TP rank 0: node13 of 48 (8 ranks a node)


def _hang(run_dir, in_collective: bool) -> dict:
    seen: dict = {}
    with Harness(run_dir, seed=3, spare_nodes=8, cap_seconds=3600.0, dense_after_note=0.0) as h:
        w = h.cfg.watchdog

        def hang(t):
            inc = h.world.running_incarnation()
            seen.update(t=t, node=h.world.node_of(inc, HUNG), inc=inc)
            h.world.hang(t, HUNG, in_collective=in_collective)
            assert inc.blocked, "mid-step: the peers block behind it"

        def started(t, what, fields):
            if what != "training":
                return False
            h.at(t + 300.4, hang, pre=w.heartbeat_seconds + 2 * w.poll_seconds, quiet=bound_seconds(h, "hang", {}) + 60)
            return True

        h.world.watchers.append(started)
        bound = bound_seconds(h, "hang", {})
        h.run_until(4 * 3600, stop=lambda hh: "t" in seen and hh.t > seen["t"] + bound + 120)
        failures = [e[2] for e in h.events if e[2].KIND == "failure" and e[0] >= seen.get("t", 0)]
        inc = seen["inc"]
        units = {r: inc.beat(r, seen["t"] + 60).progress_unit for r in (HUNG, HUNG + 1, HUNG + 32, 0)}
        return {"failures": failures, "excluded": h.excluded(), "node": seen["node"], "units": units}


@pytest.mark.parametrize("in_collective", [False, True], ids=["own_work", "in_collective"])
def test_a_hung_rank_blocks_its_peers_and_only_its_own_work_excludes_its_node(sim_run_dir, in_collective):
    seen = _hang(sim_run_dir, in_collective)
    wait = Mark.WAIT.value
    # Its TP peer (same node), the next stage's rank of its replica, another replica: all waiting.
    assert seen["units"][HUNG + 1] == seen["units"][HUNG + 32] == seen["units"][0] == wait, seen["units"]
    assert (seen["units"][HUNG] == wait) is in_collective, seen["units"]
    assert seen["failures"] and seen["failures"][0].cause == "hang", seen["failures"]
    hang = seen["failures"][0]
    print(hang.suspects_why, seen["excluded"])
    if in_collective:
        assert seen["excluded"] == [], f"every stuck rank waits: no exclusion on marks alone ({hang.suspects_why})"
    else:
        assert seen["excluded"] == [seen["node"]], hang.suspects_why
        assert [s["rank"] for s in hang.suspects] == [HUNG], hang.suspects
