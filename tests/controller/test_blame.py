"""Whom one incident may exclude (controller/blame.py) and the pool's early return of a hang's
collective peers (controller/pool.hunches): pure rules over plain data."""

from __future__ import annotations

import json

from orchestrator.contract import Exclusion
from orchestrator.contract.state import ControllerState
from orchestrator.controller.actions import Record, ReleaseExclusions
from orchestrator.controller.blame import REPEAT_WINDOW_SECONDS, HangSuspicions, affordable, spare_the_pool
from orchestrator.controller.pool import judge
from orchestrator.controller.recovery import Incident
from orchestrator.slurm.base import NodeInfo

FIVE = {f"node0{i}": NodeInfo(f"node0{i}", frozenset({"IDLE"})) for i in range(1, 6)}


def test_marks_sure_blame_their_nodes_unsure_ones_only_on_a_repeat():
    seen = HangSuspicions()
    assert seen.judge(["node02"], True, "7", 0.0).nodes == ("node02",)
    first = seen.judge(["node02"], False, "7", 0.0)
    assert first.nodes == () and "no node excluded" in first.why
    assert seen.judge(["node02"], False, "7", 60.0).nodes == (), "the same job's hang seen twice is one incident"
    again = seen.judge(["node02"], False, "9", 600.0)
    assert again.nodes == ("node02",) and "job 7" in again.why and "repeat" in again.why
    assert seen.judge(["node03", "node04"], False, "9", 700.0).nodes == (), "several nodes: none on a hunch"
    late = HangSuspicions()
    late.judge(["node05"], False, "7", 0.0)
    assert late.judge(["node05"], False, "9", REPEAT_WINDOW_SECONDS + 1).nodes == (), "days apart: unrelated"



def test_a_suspicion_survives_a_controller_restart_through_state_json():
    state = ControllerState()
    assert HangSuspicions(state.hang_suspects).judge(["node02"], False, "7", 0.0).nodes == ()
    restarted = ControllerState.from_dict(json.loads(json.dumps(state.to_dict())))  # what state.json keeps
    again = HangSuspicions(restarted.hang_suspects).judge(["node02"], False, "9", 600.0)
    assert again.nodes == ("node02",) and "job 7" in again.why
    HangSuspicions(restarted.hang_suspects).judge(["node03"], False, "9", REPEAT_WINDOW_SECONDS + 700.0)
    assert set(restarted.hang_suspects) == {"node03"}, "entries older than the window are dropped"

def test_exclusions_never_leave_the_job_fewer_nodes_than_it_needs():
    # The layout: 4 nodes needed of 5, no spare; the old rule named node02 and its TP peer node01.
    assert affordable(("node02",), FIVE, {}, needed=4, partition=None) == (("node02",), None)
    kept, why = affordable(("node02", "node01"), FIVE, {}, needed=4, partition=None)
    assert kept == ("node02",) and "only the strongest suspect node02" in why and "node01 kept" in why
    held = {"node05": Exclusion("node05", 1.0, None, cause="dead_rank")}
    kept, why = affordable(("node02",), FIVE, held, needed=4, partition=None)
    assert kept == () and "none excluded" in why
    assert affordable(("node02", "node01"), None, {}, needed=4, partition=None)[0] == ("node02", "node01")
    kept, actions = spare_the_pool(Incident("7", "hang", 0.0, 3, ("node02", "node01")), FIVE, {}, needed=4,
                                   partition=None)  # fmt: skip
    assert kept == ("node02",) and isinstance(actions[0], Record) and actions[0].event.KIND == "exclusion_capped"


def test_a_pool_short_because_of_a_hangs_peer_gets_it_back_whatever_the_policy():
    """What the old rule left: node01 and node02 excluded for one hang, 3 usable of 4 needed."""
    held = {n: Exclusion(n, 10.0 + i, None, cause="hang", job_id="7") for i, n in enumerate(["node01", "node02"])}
    actions = judge(ControllerState(), FIVE, held, nodes=4, spares=0, partition=None, policy="wait", now=100.0, run_dir="/r")
    released = [a for a in actions if isinstance(a, ReleaseExclusions)]
    assert [a.nodes for a in released] == [("node01",)] and "probation ended early" in released[0].why, actions
    alone = {"node02": held["node02"]}  # one node for one hang: the culprit, kept (policy wait)
    actions = judge(ControllerState(), FIVE, alone, nodes=5, spares=0, partition=None, policy="wait", now=100.0, run_dir="/r")
    assert not [a for a in actions if isinstance(a, ReleaseExclusions)], actions
