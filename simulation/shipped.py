"""Scenarios of the paths BLOOM's config ships: a relaunch on a spare inside the
job, the 20 h time-limit chain with the pre-timeout save, a straggler node. Each judge reads what
the controller wrote (events.jsonl, allocation.json through the contract, the exclude list) and
what the simulated world did (its launches, their nodes, the checkpoint each one loaded).
"""

from __future__ import annotations

from typing import Any

from orchestrator.contract import ExitCode, read_allocation
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import Cause

from .harness import Harness
from .scenarios import Scenario, fault_after, lose_node

FAILURE_ACTIONS = ("failure", "restart", "nodes_excluded", "jobs_cancelled")


def _acted(h: Harness) -> list[tuple[int, str]]:
    return [(round(e[0]), e[2].KIND) for e in h.events if e[2].KIND in FAILURE_ACTIONS]


# -- in_allocation_relaunch ------------------------------------------------------------------------------
def relaunched_on_a_spare(h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = []
    t0, culprit, job_id = facts["t"], facts["culprit"], facts["job_id"]
    first = next(i for i in h.world.incarnations if i.job_id == job_id)
    spares = [n for n in h.world.slurm.jobs_by_id[job_id].nodes + [culprit] if n not in first.nodes]
    restarts = [e[2] for e in h.events if isinstance(e[2], fev.Restart) and e[1] >= t0]
    if not restarts or not restarts[0].in_allocation or restarts[0].job_id != job_id:
        problems.append(
            f"expected a restart inside job {job_id}; restarts: {[r.to_dict() for r in restarts]}"
        )
    resubmitted = [j.job_id for j in h.own_jobs() if j.submit_time >= t0]
    if resubmitted:
        problems.append(f"resubmitted {resubmitted}: the job had spares")
    later = [i for i in h.world.incarnations if i.job_id == job_id and i.launch > 0]
    if not later:
        return [*problems, f"no launch after launch 0 in job {job_id}"]
    relaunch = later[0]
    if culprit in relaunch.nodes:
        problems.append(f"launch {relaunch.launch} runs on {culprit}, the node that died")
    taken = set(relaunch.nodes) - set(first.nodes)
    if len(taken) != 1 or not taken <= set(spares):
        problems.append(f"launch {relaunch.launch} took {sorted(taken)}, expected one of the spares {spares}")
    if relaunch.step <= (relaunch.resume_step or 0):
        problems.append(f"launch {relaunch.launch} never trained (step {relaunch.step})")
    record = read_allocation(h.paths.allocation(job_id))
    if record is None or culprit not in record.left_out:
        problems.append(f"allocation.json does not leave out {culprit}: {record and record.left_out}")
    return problems


# -- time_limit_chain_20h ---------------------------------------------------------------------------------
def watch_two_jobs(h: Harness, facts: dict[str, Any]) -> None:
    """Judged once the chain's second job trains; t: when the first job started."""

    def second_trains(t: float, what: str, fields: dict) -> bool:
        if what != "training" or len({i.job_id for i in h.world.incarnations}) < 2:
            return False
        facts.update(t=0.0, bound=0.0, second_training=t)
        return True

    h.world.watchers.append(second_trains)


def chain_goes_on(h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = []
    if "second_training" not in facts:
        return ["the chain's second job never trained"]
    first, second = h.world.incarnations[0], h.world.incarnations[1]
    if first.exit_code != ExitCode.TIME_BUDGET:
        problems.append(
            f"the first job exited {first.exit_code}, expected {int(ExitCode.TIME_BUDGET)} (time budget)"
        )
    ran = (first.gone_at or 0) - first.started
    limit = h.timings.time_limit_seconds
    if not limit - h.timings.pre_timeout_seconds <= ran + h.timings.launch_seconds <= limit:
        problems.append(
            f"the first job ran {ran:.0f} s: not ended by the pre-timeout signal of a {limit:.0f} s limit"
        )
    saves = [f["step"] for t, what, f in h.world.notes if what == "save_done" and f["job_id"] == first.job_id]
    if second.job_id == first.job_id or second.resume_step != (saves[-1] if saves else None):
        problems.append(
            f"job {second.job_id} resumed from {second.resume_step}, the last save was {saves[-1:]}"
        )
    if second.resume_step != first.step:
        problems.append(f"the pre-timeout save (step {first.step}) is not where the chain resumed")
    ended = [e[2] for e in h.events if isinstance(e[2], ev.JobEnded) and e[2].job_id == first.job_id]
    if not ended or ended[0].outcome != "time_budget" or not h.events_named("continue"):
        problems.append(f"the controller did not read a time-budget end: {[e.to_dict() for e in ended]}")
    if _acted(h) or h.excluded():
        problems.append(f"treated the time limit as a failure: {_acted(h)[:6]}, excluded {h.excluded()}")
    return problems


# -- straggler_node ---------------------------------------------------------------------------------------
SLOW_NODE, SLOWNESS = "node010", 1.3


def slow_node(h: Harness, facts: dict[str, Any]) -> None:
    h.world.slowness[SLOW_NODE] = SLOWNESS  # given: from the start, every step of its 8 ranks
    fault_after("training", 60, "none", lambda h2, t, f: None, quiet=1800)(h, facts)


def straggler_flagged(h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = []
    flagged = [e[2] for e in h.events if isinstance(e[2], fev.Straggler)]
    if [e.node for e in flagged] != [SLOW_NODE]:
        problems.append(f"straggler events name {[e.node for e in flagged]}, expected [{SLOW_NODE}]")
    elif flagged[0].score is None or abs(flagged[0].score - SLOWNESS) > 0.05:
        problems.append(f"{SLOW_NODE} scored {flagged[0].score}, its ranks compute {SLOWNESS}x their peers'")
    if _acted(h) or h.excluded():
        problems.append(f"a straggler is not a failure: {_acted(h)[:6]}, excluded {h.excluded()}")
    if not any(end > facts["t"] + 1500 for _, _, _, end in h.world.steps):
        problems.append("training did not go on")
    return problems


# fmt: off
SHIPPED = [
    Scenario("in_allocation_relaunch", given="BLOOM's job: 48 nodes + 4 spares, --no-kill, 20 min after the first save",
             fault="node021 dies", bound=Cause.DEAD_RANK, expect="custom", exclude="culprit",
             inject=fault_after("save_done", 1200, Cause.DEAD_RANK, lose_node()), watch_after=1800,
             check=relaunched_on_a_spare),
    Scenario("time_limit_chain_20h", given="Jean Zay's 20 h limit, pre-timeout signal 10 min before",
             fault="none: the first job reaches its limit", bound="none", expect="custom", exclude="none",
             inject=watch_two_jobs, watch_after=0, config={"cluster": {"time_limit": "20:00:00"}},
             check=chain_goes_on),
    Scenario("straggler_node", given=f"{SLOW_NODE}'s 8 ranks compute {SLOWNESS}x slower than their peers",
             fault="none: every step waits for it", bound="none", expect="custom", exclude="none",
             inject=slow_node, watch_after=1800, check=straggler_flagged),
]
# fmt: on
