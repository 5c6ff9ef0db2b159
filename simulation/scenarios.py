"""Named fault scenarios at BLOOM's scale: each is policy, read as data.

A scenario says: given (the state of the run), fault (what breaks, when), bound (how fast the
controller must notice, derived from the config), expect (what it must do) and exclude (which
nodes must and must not end up excluded). `run_scenario` is the one runner; it returns the
problems found (empty: the controller behaved) and a report of what happened.

Bounds (from `watchdog` in the config and the simulated trainer's own record of durations, never
from the controller's state):
- dead_rank:  dead_after + 2 polls: the last beat comes before the death; the controller sees it
  change at its next pass (<= 1 poll), and finds it unchanged for dead_after at a pass (<= 1 poll
  more). (The issue's looser dead_after + poll + heartbeat is 15 s more with BLOOM's watchdog.)
- job_end:    poll + 5 s: srun ends the job ~3 s after a rank dies (--kill-on-bad-exit);
- hang:       the step's hang limit + heartbeat + 2 polls, from the hang: the last beat before the
  hang reports the last marks (<= 1 beat), the controller sees it (<= 1 poll) and finds no
  progress for the limit at a pass (<= 1 poll more). The limit is min(progress_cap, max(floor,
  progress_factor x the longest gap between marks the simulated ranks reported in this launch)),
  or the phase's timeout while none is reported;
- hang_in_save: the same with the save's limit;
A hang scenario also has `within`: the issue's target in seconds (90 at BLOOM's timings),
independent of the formula.
- controller_back: the controller's downtime + 2 polls (it must act on its first passes).
A restart must be submitted within stack_wait + 2 polls of the detection (no terabyte hashing).
Exclusion rules: "culprit" = exactly the faulty node; "none" = nobody; "at_most_culprit" = a
subset of the faulty node; "slurm" = nobody, and the faulty node named as SLURM's problem (SLURM
had declared it DOWN before the controller could blame it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import Cause
from orchestrator.contract.codes import ExitCode
from orchestrator.controller.probing import PROBE_TIMEOUT_SECONDS
from orchestrator.controller.timeouts import probe_after

from .harness import Harness

DETECTIONS = ("failure",)
ACTIONS = ("failure", "restart", "nodes_excluded", "jobs_cancelled", "job_submitted")
STACK_WAIT = 5.0  # Controller's default stack_wait_seconds


@dataclass(frozen=True)
class Scenario:
    name: str
    given: str
    fault: str
    bound: str  # a key of `bound_seconds`, or "none" when there is nothing to detect
    expect: str  # restart | nothing | killed | crash_loop | survive
    exclude: str  # culprit | none | at_most_culprit
    inject: Callable[[Harness, dict[str, Any]], None]
    watch_after: float = 1800.0  # seconds watched after the bound (recovery, false positives)
    small_filesystem: bool = False
    config: dict[str, Any] | None = None  # overrides of the BLOOM config (bloom_config's sections)
    check: Callable[[Harness, dict[str, Any]], list[str]] | None = None  # the judge ("custom") or more
    pool_spares: int = 4  # nodes in the simulated pool beside cluster.nodes
    within: float | None = None  # the target detection time, besides the derived bound


def hang_limit(h: Harness, phase: str, gaps: dict[str, float]) -> float:
    """The hang limit of `phase` from the config and the gaps the simulated ranks reported."""
    w = h.cfg.watchdog
    if phase not in gaps:
        return float(getattr(w, f"{phase}_timeout_seconds"))
    floor = getattr(w.progress_floor_seconds, phase)
    return min(w.progress_cap_seconds, max(floor, w.progress_factor * gaps[phase]))


def reported_gaps(h: Harness) -> dict[str, float]:
    """The longest gaps between marks the running launch's ranks report now."""
    inc = h.world.running_incarnation()
    return inc.snapshot_state().progress(h.world.now)[2] if inc is not None else {}


def bound_seconds(h: Harness, key: str, facts: dict[str, Any]) -> float:
    w = h.cfg.watchdog
    extra = w.heartbeat_seconds + 2 * w.poll_seconds
    if key in (Cause.HANG, "hang_in_save"):
        phase = facts.get("phase") or ("checkpoint" if key == "hang_in_save" else "step")
        return hang_limit(h, phase, facts.get("gaps", reported_gaps(h))) + extra
    return {
        Cause.DEAD_RANK: w.dead_after_seconds + 2 * w.poll_seconds,
        "job_end": w.poll_seconds + 5.0,
        "controller_back": facts.get("down_seconds", 0.0) + 2 * w.poll_seconds,
        "none": 0.0,
    }[key]


# -- fault injection helpers: `when(note, delay)` and what breaks --------------------------------------
def fault_after(
    note: str,
    delay: float,
    bound: str,
    action: Callable[[Harness, float, dict], None],
    nth: int = 1,
    quiet: float = 0.0,
) -> Callable[[Harness, dict[str, Any]], None]:
    """Fire `action` `delay` s after the nth world note `note`; `quiet`: how long the anomaly lasts
    when it must not be acted on (passes stay dense over all of it)."""

    def inject(h: Harness, facts: dict[str, Any]) -> None:
        def fire(t: float) -> None:
            facts.setdefault("t", t)
            facts["gaps"] = reported_gaps(h)
            facts["bound"] = bound_seconds(h, bound, facts)
            facts["job_id"] = getattr(h.world.running_incarnation(), "job_id", None)
            action(h, t, facts)

        post = bound_seconds(h, bound, facts) + 120
        h.when(note, delay, fire, nth=nth, post=post, quiet=quiet + 120 if quiet else 0.0)

    return inject


def crash(by_signal: bool = False, rank: int = 100, exit_code: int = 1):
    def act(h: Harness, t: float, facts: dict) -> None:
        facts["culprit"] = h.world.crash_rank(t, rank, by_signal, exit_code)

    return act


def lose_node(node_index: int = 20, requeue: bool = False):
    def act(h: Harness, t: float, facts: dict) -> None:
        inc = h.world.running_incarnation()
        facts["culprit"] = h.world.lose_node(t, inc.nodes[node_index], requeue=requeue)

    return act


def hang(h: Harness, t: float, facts: dict) -> None:
    """Every rank stops mid-work (a micro-batch, a chunk of a save): beats go on, marks stop."""
    h.world.hang(t)


def hang_in_reduce(h: Harness, t: float, facts: dict) -> None:
    """The next gradient reduce never completes: every rank made its WAIT mark and waits there
    (nobody is hung on its own; everyone is stuck). The fault time is when they entered it."""
    h.world.running_incarnation().hang_in_next_reduce(t)

    def entered(when: float, what: str, fields: dict) -> bool:
        if what != "hung_in_reduce":
            return False
        facts["t"], facts["gaps"] = when, reported_gaps(h)
        h.windows.append((when, when + facts["bound"] + 120))  # passes dense until detection is due
        return True

    h.world.watchers.append(entered)


def honest_slowness(h: Harness, t: float, facts: dict) -> None:
    """A 2.5x step, a normal one, three at 5x (micro-batches keep moving, slower), then an eval of
    5 minutes after the next step that starts 2,100 s from now."""
    inc = h.world.running_incarnation()
    inc.slow_steps = [2.5, 1.0, 5.0, 5.0, 5.0]

    def long_eval(when: float) -> None:
        inc.forced_eval_seconds = 300.0

    h.world.at(t + 2100, long_eval)
    facts["clear"] = t + 2100 + 2 * h.timings.step_seconds + 300


def stall(seconds: float):
    def act(h: Harness, t: float, facts: dict) -> None:
        h.world.stall_filesystem(t, seconds)
        facts["clear"] = t + seconds

    return act


def stall_one_node(seconds: float, node_index: int = 7):
    def act(h: Harness, t: float, facts: dict) -> None:
        inc = h.world.running_incarnation()
        node = inc.nodes[node_index]
        h.world.stall_node_storage(t, node, seconds)
        facts.update(clear=t + seconds, stalled_node=node)

    return act


def lose_node_then_stall_one_at_relaunch(seconds: float, node_index: int = 7):
    """node021 dies; as the relaunch on a spare begins, another node's storage stalls for
    `seconds`: its new ranks cannot write a first beat, and it was never quiet to be asked."""
    lose = lose_node()

    def act(h: Harness, t: float, facts: dict) -> None:
        lose(h, t, facts)

        def stall_at_relaunch(when: float) -> None:
            node = h.world.running_incarnation().nodes[node_index]
            h.world.stall_node_storage(when, node, seconds)
            facts.update(stalled_node=node, clear=when + seconds)

        h.when("relaunch", 0.0, stall_at_relaunch, quiet=seconds + 600)

    return act


def stall_at_relaunch_waited_for(h: Harness, facts: dict) -> list[str]:
    """The stalled node was asked before its first beat and said stall; no second failure."""
    node = facts.get("stalled_node")
    asked = [e for _, _, e in h.events_named("node_probed") if e.node == node]
    problems = []
    if not any(e.before_first_beat and e.verdict == "stall" for e in asked):
        problems.append(f"{node} was not found in a stall before its first beat: {[e.to_dict() for e in asked]}")
    failures = [e for e in h.events if e[1] >= facts["t"] and isinstance(e[2], fev.Failure)]
    if len(failures) != 1:
        problems.append(f"{len(failures)} failures after the node loss, expected 1: "
                        f"{[(e[2].cause, [r.get('rank') for r in e[2].ranks][:3]) for e in failures]}")  # fmt: skip
    return problems


def stalled_node_recorded(h: Harness, facts: dict) -> list[str]:
    """The stall was seen and said (node_stalled), and excluded nothing."""
    said = [e for _, _, e in h.events_named("node_stalled") if e.node == facts.get("stalled_node")]
    if not said:
        return [f"no node_stalled event for {facts.get('stalled_node')}"]
    if said[0].excluded or not 500 <= said[0].seconds <= 700:
        return [f"node_stalled said {said[0]}: expected ~600 s, not excluded"]
    return []


def slurm_down(seconds: float, kind: str = "errors", lag: float = 0.0):
    """slurmctld stops answering as Slurm 22.05's tools then answer (simulation/slurm.py)."""

    def act(h: Harness, t: float, facts: dict) -> None:
        h.world.slurm.outage(t, seconds, kind, lag)
        facts["clear"] = t + seconds + lag

    return act


def requeue(h: Harness, t: float, facts: dict) -> None:
    h.world.slurm.requeue(h.world.running_incarnation().job_id, t)


# -- scenarios whose setup is more than one fault ------------------------------------------------------
def hang_after_restart(h: Harness, facts: dict) -> None:
    h.when("training", 1800, lambda t: h.world.crash_rank(t, 100, False), post=120)
    fault_after("training", 900, Cause.HANG, hang, nth=2)(h, facts)


def slow_save(h: Harness, facts: dict) -> None:
    """The second save takes 10x the first; its bytes keep moving (10x slower)."""

    def slow(t: float) -> None:
        h.world.running_incarnation().next_save_factor = 10.0

    h.when("save_done", 60, slow, post=0)
    fault_after("save_start", 1, "none", lambda h, t, f: None, nth=2, quiet=10.5 * h.timings.save_seconds)(
        h, facts
    )


def freeze_node(node_index: int):
    """Every process of the node stops (a driver hang, SIGSTOP); the node answers, SLURM sees nothing."""

    def act(h: Harness, t: float, facts: dict) -> None:
        inc = h.world.running_incarnation()
        facts["culprit"] = h.world.freeze_node(t, inc.nodes[node_index])

    return act


def skewed_then_frozen_node(h: Harness, facts: dict) -> None:
    for i in range(5, 9):
        h.world.skew[f"node{i:03d}"] = +60.0
    for i in range(9, 13):
        h.world.skew[f"node{i:03d}"] = -60.0
    fault_after("training", 3600, Cause.DEAD_RANK, freeze_node(node_index=5))(h, facts)  # node006: +60 s


def probe_said(verdict: str, node_key: str = "culprit") -> Callable[[Harness, dict[str, Any]], list[str]]:
    """The silent node (facts[node_key]) was first asked within probe_after + 2 polls of the fault
    (a frozen node is found in 30 s at BLOOM's beats; a lost one after the probe's timeout more),
    at most twice (an early answer is asked again once the node is silent: controller/probing.py),
    and its last answer was `verdict`."""

    def check(h: Harness, facts: dict[str, Any]) -> list[str]:
        node, w = facts.get(node_key), h.cfg.watchdog
        asked = [(end, e) for _, end, e in h.events_named("node_probed") if e.node == node]
        if not 1 <= len(asked) <= 2 or asked[-1][1].verdict != verdict:
            return [f"{node}: expected one or two node_probed, the last saying {verdict!r}, "
                    f"got {[e.to_dict() for _, e in asked]}"]  # fmt: skip
        timeout = PROBE_TIMEOUT_SECONDS if verdict == "lost" else 0.0
        took, limit = asked[0][0] - facts["t"], probe_after(w) + 2 * w.poll_seconds + timeout
        return (
            []
            if took <= limit
            else [f"{node} first asked {took:.0f} s after the fault, more than {limit:.0f} s"]
        )

    return check


def both(
    *checks: Callable[[Harness, dict[str, Any]], list[str]],
) -> Callable[[Harness, dict[str, Any]], list[str]]:
    return lambda h, facts: [problem for check in checks for problem in check(h, facts)]


def outage_while_queued(h: Harness, facts: dict) -> None:
    """A rank raises; while the job that replaces it waits in the queue, slurmctld is down 2 min
    and then lists none of the run's jobs for 2 min (soak x10 seed 18: that ended the queued job
    and its resubmission as failures)."""

    def crash_into_a_busy_queue(t: float) -> None:
        h.world.slurm.queue_wait_mean = 3600.0  # the replacement waits past the outage and the lag
        h.world.crash_rank(t, 100, False)

    h.when("training", 1800, crash_into_a_busy_queue, post=0)
    fault_after("job_stop", 60, "none", slurm_down(120, "errors", lag=120), quiet=240)(h, facts)


def replacement_was_queued(h: Harness, facts: dict) -> list[str]:
    queued = [j for j in h.own_jobs() if j.submit_time < facts["t"]][-1:]
    if not queued or (queued[0].start_time is not None and queued[0].start_time < facts["clear"]):
        return [f"the replacement job was not queued all through the outage and the lag: {queued}"]
    return []


def controller_dies_mid_incident(h: Harness, facts: dict) -> None:
    # Killed before the node is quiet long enough to be asked (probe_after: 17.5 s), so before its
    # probe and death.
    kill_after = 15.0
    down = 60.0 + h.timings.slurmd_timeout_seconds + 60.0
    facts["down_seconds"] = kill_after + down

    def kill_then_revive(h2: Harness, t: float, f: dict) -> None:
        lose_node(node_index=20)(h2, t, f)
        h2.at(t + kill_after, lambda when: h2.kill_controller(), pre=0, post=0)
        h2.at(t + kill_after + down, lambda when: h2.start_controller(), pre=0, post=300)

    fault_after("training", 1800, "controller_back", kill_then_revive)(h, facts)


def kill_during_save(h: Harness, facts: dict) -> None:
    def kill(h2: Harness, t: float, f: dict) -> None:
        h2.operator_kill(t)

    fault_after("save_start", 60, "none", kill)(h, facts)


def corrupt_newest_then_crash(h: Harness, facts: dict) -> None:
    def corrupt(t: float) -> None:
        steps = sorted(p for p in h.world.ckpt_dir.iterdir() if p.name.startswith("step_"))
        newest, previous = steps[-1], steps[-2]
        shard = sorted(newest.glob("*.pt"))[3]
        os.truncate(shard, shard.stat().st_size // 2)  # a half-written shard: the sizes disagree
        facts.update(corrupt=newest.name, previous=int(previous.name.split("_")[1]))

    h.when("save_done", 1200, corrupt, nth=2, post=0)
    fault_after("save_done", 1260, "job_end", crash(), nth=2)(h, facts)


def crash_loop(h: Harness, facts: dict) -> None:
    def every_incarnation(t: float, what: str, fields: dict) -> bool:
        if what == "training":
            h.at(t + 600, lambda when: h.world.crash_rank(when, 100, False), post=120)
            facts.setdefault("t", t + 600)
        return False

    h.world.watchers.append(every_incarnation)


def disk_fills(h: Harness, facts: dict) -> None:
    """On a small tmpfs (runner.py mounts one when it can): another user's file fills it for 2 min.
    Elsewhere: every fsync under the run directory fails ENOSPC for 2 min, and no rank can write."""

    def fill(h2: Harness, t: float, f: dict) -> None:
        filler = h2.paths.root / "someone-elses-data.bin"
        if h2.small_filesystem:
            with open(filler, "wb") as handle:
                try:
                    while True:
                        handle.write(b"\0" * (1 << 20))
                        handle.flush()
                except OSError:
                    pass
        else:
            h2.disk_full = h2.world.writes_fail = True
        h2.fs_filled = h2.fs_capacity
        f["clear"] = t + 120

        def free(when: float) -> None:
            filler.unlink(missing_ok=True)
            h2.fs_filled = 0
            h2.disk_full = h2.world.writes_fail = False

        h2.at(t + 120, free, pre=0, post=300)

    fault_after("training", 1800, "none", fill, quiet=120)(h, facts)


# -- the node pool: exclusions that heal, a pool that cannot silently run dry ---------------
def exhaust_pool(h: Harness, facts: dict) -> None:
    """The pool is exactly the job's 48 nodes: node021 dies and is excluded (probation 2 h); SLURM
    would refuse a job excluding it, so the exclusion is given back at once (controller/refusal.py)
    and the next job may start on it before SLURM downs it; once SLURM downs it the pool is short
    and the job waits; an admin returns it 1 h later."""

    def act(h2: Harness, t: float, f: dict) -> None:
        lose_node()(h2, t, f)
        h2.at(t + 3600, lambda when: h2.world.slurm.repair(f["culprit"]), pre=0, post=0)

    fault_after("save_done", 1200, Cause.DEAD_RANK, act)(h, facts)


def pool_alert_then_recovery(h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = []
    excluded = h.events_named("nodes_excluded")
    short = h.events_named("pool_short")
    if not excluded or excluded[0][2].nodes != [facts.get("culprit")]:
        return [f"expected {facts.get('culprit')} excluded; nodes_excluded: {[e[2].nodes for e in excluded]}"]
    poll = h.cfg.watchdog.poll_seconds
    # SimSlurm queues a job whose exclude list leaves it too few nodes; SLURM refuses it: the
    # controller gives the exclusion back before the sbatch, whatever on_pool_short says.
    given_back = [e for e in h.events_named("probation_ended") if facts.get("culprit") in e[2].nodes]
    if (
        not given_back
        or given_back[0][0] > excluded[0][1] + poll
        or "SLURM would refuse" not in given_back[0][2].why
    ):
        problems.append(
            f"the exclusion SLURM would refuse the next job for was kept: {[e[2] for e in given_back]}"
        )
    downed = facts["t"] + h.world.slurm.slurmd_timeout
    if not short or not downed <= short[0][0] <= downed + poll:
        problems.append(
            f"no pool_short within one pass of SLURM downing the node at t={downed:.0f} s: "
            f"{[round(e[0]) for e in short]}"
        )
    starved = [t for t, job, _ in h.world.slurm.starved if t >= downed]
    if not starved:
        problems.append("the restarted job never waited for nodes (the pool was not short?)")
    recovered = h.events_named("pool_recovered")
    ended = h.events_named("probation_ended")
    if not recovered or not ended:
        problems.append(f"no recovery: probation_ended {len(ended)}, pool_recovered {len(recovered)}")
    else:
        if not any(end > recovered[0][0] for _, _, _, end in h.world.steps):
            problems.append("no job trained after the pool recovered")
    if h.controller.state.pool is not None and h.controller.state.pool.short:
        problems.append(f"state.json still says the pool is short: {h.controller.state.pool}")
    return problems


def reservation(h: Harness, facts: dict) -> None:
    """4 of the job's 48 nodes (the whole pool) reserved for maintenance 30 min into training, for
    4 h; the job's 3 h time limit ends it inside the reservation."""

    def reserve(h2: Harness, t: float, f: dict) -> None:
        nodes = h2.world.running_incarnation().nodes[:4]
        h2.world.slurm.reserve(nodes, t, t + 4 * 3600)
        f.update(maintenance_nodes=nodes, end=t + 4 * 3600)
        h2.at(t + 4 * 3600, lambda when: None, pre=h2.poll * 3, post=0)

    fault_after("training", 1800, "none", reserve)(h, facts)


def reservation_is_not_a_failure(h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = []
    acted = [
        (round(e[0]), e[2].KIND) for e in h.events if e[2].KIND in ("failure", "nodes_excluded", "restart")
    ]
    if acted or h.excluded():
        problems.append(f"treated the reservation as a failure: {acted[:6]}, excluded {h.excluded()[:6]}")
    short = h.events_named("pool_short")
    starved = [t for t, _, _ in h.world.slurm.starved]
    if not starved:
        problems.append("no job of the run waited for the reserved nodes (the time limit came too late?)")
    elif not short or short[0][0] > starved[0]:
        problems.append(
            f"silent pending: a job waited from t={starved[0]:.0f} s, pool_short at {[e[0] for e in short]}"
        )
    if short and set(short[0][2].reserved) != set(facts["maintenance_nodes"]):
        problems.append(
            f"pool_short names reserved {short[0][2].reserved}, expected {facts['maintenance_nodes']}"
        )
    recovered = h.events_named("pool_recovered", after=facts["end"] - h.poll)
    starts = [t for t, what, _ in h.world.notes if what == "job_start" and t >= facts["end"]]
    if not recovered or not starts:
        problems.append(f"after the reservation: pool_recovered {len(recovered)}, jobs started {len(starts)}")
    return problems


def failed_for(cause: Cause) -> Callable[[Harness, dict[str, Any]], list[str]]:
    """The failure event names `cause`."""

    def check(h: Harness, facts: dict[str, Any]) -> list[str]:
        causes = [event.cause for _, _, event in h.events_named("failure")]
        return [] if causes[:1] == [cause] else [f"failure causes {causes}, expected [{cause.value!r}]"]

    return check


# fmt: off
SCENARIOS = [
    Scenario("rank_crash", given="training, before the first save", fault="rank 100 raises (exit 1) 30 min in",
             bound="job_end", expect="restart", exclude="at_most_culprit",
             inject=fault_after("training", 1800, "job_end", crash())),
    Scenario("rank_out_of_memory", given="20 min after the first save",
             fault="rank 100 runs out of memory (MemoryError: exit 21)",
             bound="job_end", expect="restart", exclude="none",
             inject=fault_after("save_done", 1200, "job_end", crash(exit_code=ExitCode.OUT_OF_MEMORY)),
             check=failed_for(Cause.OUT_OF_MEMORY)),
    Scenario("node_loss", given="20 min after the first save", fault="node021 dies (its 8 ranks stop beating)",
             bound=Cause.DEAD_RANK, expect="restart", exclude="culprit",
             inject=fault_after("save_done", 1200, Cause.DEAD_RANK, lose_node()), check=probe_said("lost"),
             within=60.0),  # lost now: silent_after 30 + a poll + the probe's 10 s timeout + 2 polls
    Scenario("hang_before_first_save", given="training, no save yet",
             fault="a collective hangs mid-step: all ranks beat, no micro-batch ends",
             bound=Cause.HANG, expect="restart", exclude="none", inject=fault_after("training", 1800, Cause.HANG, hang),
             within=90.0),
    Scenario("hang_after_first_save", given="20 min after the first save",
             fault="the gradient reduce hangs: every rank waits in it (WAIT), none is stuck on its own",
             bound=Cause.HANG, expect="restart", exclude="none",
             inject=fault_after("save_done", 1200, Cause.HANG, hang_in_reduce), within=90.0),
    Scenario("hang_after_restart", given="15 min into the job restarted after a crash", fault="a collective hangs",
             bound=Cause.HANG, expect="restart", exclude="none", inject=hang_after_restart, within=90.0),
    Scenario("hang_in_save", given="60 s into the first save", fault="its bytes stop moving (beats go on)",
             bound="hang_in_save", expect="restart", exclude="none",
             inject=fault_after("save_start", 60, "hang_in_save", hang), watch_after=600, within=90.0),
    Scenario("slow_save", given="the second save", fault="it takes 10x the first, its bytes moving: not a hang",
             bound="none", expect="nothing", exclude="none", inject=slow_save, watch_after=3600),
    Scenario("honest_slowness", given="training",
             fault="a 2.5x step, three 5x steps (micro-batches moving), a 5-minute eval: not a hang",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", honest_slowness, quiet=2700), watch_after=3000),
    Scenario("filesystem_stall", given="training", fault="no file write on any rank for 90 s: not a node failure",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", stall(90), quiet=90)),
    Scenario("fs_stall_180", given="training", fault="no file write on any node for 180 s (beyond dead_after): "
             "every node silent at once is the filesystem, not 48 lost nodes", bound="none", expect="nothing",
             exclude="none", inject=fault_after("training", 1800, "none", stall(180), quiet=180)),
    Scenario("node_storage_stall_600", given="training", fault="node008's writes block for 600 s while its ranks "
             "compute on: a stall (said once), not a lost node", bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", stall_one_node(600), quiet=600),
             check=both(stalled_node_recorded, probe_said("stall", "stalled_node"))),
    Scenario("node_storage_stall_at_relaunch", given="20 min after the first save",
             fault="node021 dies; as the relaunch on a spare begins, node008's writes block for 600 s: its new "
             "ranks cannot beat, a stall, not missing ranks", bound=Cause.DEAD_RANK, expect="restart",
             exclude="culprit", inject=fault_after("save_done", 1200, Cause.DEAD_RANK,
                                                   lose_node_then_stall_one_at_relaunch(600)),
             check=both(stall_at_relaunch_waited_for, stalled_node_recorded), watch_after=2400),
    Scenario("clock_skew", given="node005-008 at +60 s, node009-012 at -60 s, 1 h of training",
             fault="node006 (+60 s) freezes (its processes stop, the node answers)", bound=Cause.DEAD_RANK,
             expect="restart", exclude="culprit", inject=skewed_then_frozen_node, check=probe_said("dead")),
    Scenario("slurm_requeue", given="training", fault="SLURM requeues the job: same id, SLURM_RESTART_COUNT=1",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", requeue, quiet=2400), watch_after=2400),
    Scenario("slurmctld_unreachable", given="training",
             fault="squeue answers errors and no jobs for 2 min, then lists none of the run's jobs for 2 min",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", slurm_down(120, "errors", lag=120), quiet=240)),
    Scenario("slurmctld_unreachable_while_queued", given="a job queued after a rank raised (no spares)",
             fault="squeue answers errors and no jobs for 2 min, then lists none of the run's jobs for 2 min",
             bound="none", expect="nothing", exclude="none", inject=outage_while_queued,
             config={"cluster": {"spare_nodes": 0}}, check=replacement_was_queued),
    Scenario("squeue_timeouts", given="training", fault="every SLURM command times out (30 s each) for 5 min",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", slurm_down(300, "timeout"), quiet=300)),
    Scenario("controller_restart", given="node021 died 30 min in",
             fault="the controller is killed 15 s later and back 7 min after (SLURM ended the job NODE_FAIL)",
             bound="controller_back", expect="restart", exclude="slurm", inject=controller_dies_mid_incident),
    Scenario("kill_during_save", given="the first save", fault="an operator's kill switch 60 s into it",
             bound="none", expect="killed", exclude="none", inject=kill_during_save, watch_after=3600),
    Scenario("corrupt_newest_checkpoint", given="two saves done; the newest has a half-written shard",
             fault="rank 100 raises 21 min after the second save", bound="job_end", expect="restart",
             exclude="at_most_culprit", inject=corrupt_newest_then_crash, watch_after=3600),
    Scenario("crash_loop", given="every job", fault="a rank raises 10 min into training, before any save",
             bound="none", expect="crash_loop", exclude="none", inject=crash_loop, watch_after=8 * 3600),
    Scenario("disk_full", given="training", fault="the run directory's filesystem is full for 2 min",
             bound="none", expect="survive", exclude="none", inject=disk_fills, small_filesystem=True,
             watch_after=600),
    Scenario("exclusions_exhaust_pool", given="the pool is exactly the job's 48 nodes, probation 2 h",
             fault="node021 dies (excluded, given back: SLURM would refuse); SLURM downs it; an admin returns it 1 h later",
             bound=Cause.DEAD_RANK, expect="custom", exclude="none", inject=exhaust_pool, watch_after=4 * 3600,
             config={"cluster": {"spare_nodes": 0}, "exclusions": {"probation_hours": 2}}, pool_spares=0,
             check=pool_alert_then_recovery),
    Scenario("maintenance_reservation", given="48-node pool, 3 h time limit, 30 min into training",
             fault="4 of the job's nodes reserved for 4 h: the next job cannot start until it ends",
             bound="none", expect="custom", exclude="none", inject=reservation, watch_after=6 * 3600,
             config={"cluster": {"spare_nodes": 0, "time_limit": "3:00:00"}}, pool_spares=0,
             check=reservation_is_not_a_failure),
]
# fmt: on
