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
- hang:       max(step floor, factor x longest step) + heartbeat + 2 polls, from the hang;
- hang_in_save: max(checkpoint floor, factor x longest save) + heartbeat + 2 polls;
- controller_back: the controller's downtime + 2 polls (it must act on its first passes).
A restart must be submitted within stack_wait + 2 polls of the detection (no terabyte hashing).
Exclusion rules: "culprit" = exactly the faulty node; "none" = nobody; "at_most_culprit" = a
subset of the faulty node.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def bound_seconds(h: Harness, key: str, facts: dict[str, Any]) -> float:
    w = h.cfg.watchdog
    longest_step = max((s for _, s, _, _ in h.world.steps), default=h.timings.step_seconds)
    started = {}
    saves = []
    for t, what, fields in h.world.notes:
        if what == "save_start":
            started[fields["job_id"]] = t
        elif what == "save_done" and fields["job_id"] in started:
            saves.append(t - started.pop(fields["job_id"]))
    longest_save = max(saves, default=h.timings.save_seconds)
    extra = w.heartbeat_seconds + 2 * w.poll_seconds
    return {
        "dead_rank": w.dead_after_seconds + 2 * w.poll_seconds,
        "job_end": w.poll_seconds + 5.0,
        "hang": max(w.step_timeout_seconds, w.timeout_factor * longest_step) + extra,
        "hang_in_save": max(w.checkpoint_timeout_seconds, w.timeout_factor * longest_save) + extra,
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
            facts["bound"] = bound_seconds(h, bound, facts)
            facts["job_id"] = getattr(h.world.running_incarnation(), "job_id", None)
            action(h, t, facts)

        post = bound_seconds(h, bound, facts) + 120
        h.when(note, delay, fire, nth=nth, post=post, quiet=quiet + 120 if quiet else 0.0)

    return inject


def crash(by_signal: bool = False, rank: int = 100):
    def act(h: Harness, t: float, facts: dict) -> None:
        facts["culprit"] = h.world.crash_rank(t, rank, by_signal)

    return act


def lose_node(node_index: int = 20, requeue: bool = False):
    def act(h: Harness, t: float, facts: dict) -> None:
        inc = h.world.running_incarnation()
        facts["culprit"] = h.world.lose_node(t, inc.nodes[node_index], requeue=requeue)

    return act


def hang(h: Harness, t: float, facts: dict) -> None:
    h.world.hang(t)


def stall(seconds: float):
    def act(h: Harness, t: float, facts: dict) -> None:
        h.world.stall_filesystem(t, seconds)
        facts["clear"] = t + seconds

    return act


def slurm_down(seconds: float):
    def act(h: Harness, t: float, facts: dict) -> None:
        h.world.slurm.unreachable_until = t + seconds
        facts["clear"] = t + seconds

    return act


def requeue(h: Harness, t: float, facts: dict) -> None:
    h.world.slurm.requeue(h.world.running_incarnation().job_id, t)


# -- scenarios whose setup is more than one fault ------------------------------------------------------
def hang_after_restart(h: Harness, facts: dict) -> None:
    h.when("training", 1800, lambda t: h.world.crash_rank(t, 100, False), post=120)
    fault_after("training", 900, "hang", hang, nth=2)(h, facts)


def hang_in_save(h: Harness, facts: dict) -> None:
    def arm(t: float) -> None:
        h.world.running_incarnation().hang_in_next_save = True

    h.when("training", 0, arm, post=0)

    def fire(t: float) -> None:
        facts.update(t=t, bound=bound_seconds(h, "hang_in_save", facts))

    h.when("save_start", 0, fire, post=bound_seconds(h, "hang_in_save", facts) + 120)


def slow_save(h: Harness, facts: dict) -> None:
    def slow(t: float) -> None:
        h.world.running_incarnation().next_save_factor = 2.0

    h.when("save_done", 60, slow, post=0)
    fault_after("save_start", 1, "none", lambda h, t, f: None, nth=2, quiet=2.2 * h.timings.save_seconds)(
        h, facts
    )


def skewed_then_node_loss(h: Harness, facts: dict) -> None:
    for i in range(5, 9):
        h.world.skew[f"node{i:03d}"] = +60.0
    for i in range(9, 13):
        h.world.skew[f"node{i:03d}"] = -60.0
    fault_after("training", 3600, "dead_rank", lose_node(node_index=5))(h, facts)  # node006: +60 s


def controller_dies_mid_incident(h: Harness, facts: dict) -> None:
    down = 60.0 + h.timings.slurmd_timeout_seconds + 60.0
    facts["down_seconds"] = 60.0 + down

    def kill_then_revive(h2: Harness, t: float, f: dict) -> None:
        lose_node(node_index=20)(h2, t, f)
        h2.at(t + 60, lambda when: h2.kill_controller(), pre=0, post=0)
        h2.at(t + 60 + down, lambda when: h2.start_controller(), pre=0, post=300)

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


# fmt: off
SCENARIOS = [
    Scenario("rank_crash", given="training, before the first save", fault="rank 100 raises (exit 1) 30 min in",
             bound="job_end", expect="restart", exclude="at_most_culprit",
             inject=fault_after("training", 1800, "job_end", crash())),
    Scenario("node_loss", given="20 min after the first save", fault="node021 dies (its 8 ranks stop beating)",
             bound="dead_rank", expect="restart", exclude="culprit",
             inject=fault_after("save_done", 1200, "dead_rank", lose_node())),
    Scenario("hang_before_first_save", given="training, no save yet",
             fault="a collective hangs: all ranks beat, none progress",
             bound="hang", expect="restart", exclude="none", inject=fault_after("training", 1800, "hang", hang)),
    Scenario("hang_after_first_save", given="20 min after the first save", fault="a collective hangs",
             bound="hang", expect="restart", exclude="none", inject=fault_after("save_done", 1200, "hang", hang)),
    Scenario("hang_after_restart", given="15 min into the job restarted after a crash", fault="a collective hangs",
             bound="hang", expect="restart", exclude="none", inject=hang_after_restart),
    Scenario("hang_in_save", given="the first save", fault="the save never finishes (beats go on)",
             bound="hang_in_save", expect="restart", exclude="none", inject=hang_in_save, watch_after=600),
    Scenario("slow_save", given="the second save", fault="it takes 2x the longest save seen: not a hang",
             bound="none", expect="nothing", exclude="none", inject=slow_save),
    Scenario("filesystem_stall", given="training", fault="no file write on any rank for 90 s: not a node failure",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", stall(90), quiet=90)),
    Scenario("clock_skew", given="node005-008 at +60 s, node009-012 at -60 s, 1 h of training",
             fault="node006 (+60 s) dies", bound="dead_rank", expect="restart", exclude="culprit",
             inject=skewed_then_node_loss),
    Scenario("slurm_requeue", given="training", fault="SLURM requeues the job: same id, SLURM_RESTART_COUNT=1",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", requeue, quiet=2400), watch_after=2400),
    Scenario("slurmctld_unreachable", given="training", fault="every scheduler call raises for 2 min",
             bound="none", expect="nothing", exclude="none",
             inject=fault_after("training", 1800, "none", slurm_down(120), quiet=120)),
    Scenario("controller_restart", given="node021 died 30 min in",
             fault="the controller is killed 60 s later and back 7 min after (SLURM ended the job NODE_FAIL)",
             bound="controller_back", expect="restart", exclude="culprit", inject=controller_dies_mid_incident),
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
]
# fmt: on
BY_NAME = {s.name: s for s in SCENARIOS}
