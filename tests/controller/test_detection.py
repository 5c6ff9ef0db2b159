"""Pure supervision rules: liveness by change on the controller's clock, dead/hung/missing ranks,
job-wide incidents, culprits and their cap, learned per-phase timeouts, how a job ended. Plain
data, no processes: each test plays passes of the controller at given monotonic times."""

from __future__ import annotations

import math

from fakes import make_config

from orchestrator.controller.detection import FindingKind, Outcome, assess, classify_end, culprit_nodes
from orchestrator.controller.liveness import Liveness
from orchestrator.controller.timeouts import CAP_OVER_FLOOR, PhaseTimeouts, learn_from_beat

DEAD_AFTER = 1.5  # make_config(): step floor 3 s, checkpoint 6 s, init 20 s, factor 3


def beat(rank, seq, *, job="7", step=10, phase="step", progress=100.0, clock_offset=0.0, restart_count=0, extra=None):
    """A beat as a node writes it: times on that node's own clock (offset from the true time)."""
    return {"rank": rank, "world_size": 4, "host": f"node{rank + 1:02d}", "job_id": job, "pid": 100 + rank,
            "seq": seq, "step": step, "phase": phase, "beat_time": 1000.0 + seq + clock_offset,
            "progress_time": progress + clock_offset, "phase_started": 50.0 + clock_offset,
            "restart_count": restart_count, "process_started": 1.0, "extra": extra or {}}


def timeouts(**observed):
    return PhaseTimeouts.from_watchdog(make_config().watchdog, observed)


class Passes:
    """The controller's passes over one job: beats in, assessment out, at monotonic times."""

    def __init__(self, t=None, world=4):
        self.live, self.t, self.world = Liveness(), t or timeouts(), world

    def at(self, now, beats, job="7"):
        views = self.live.observe(beats, job, now)
        return assess(views, job_id=job, job_seen_at=self.live.job_seen_at, world_size=self.world, now=now,
                      dead_after=DEAD_AFTER, timeouts=self.t)


def test_healthy_ranks_no_findings_whatever_their_clocks():
    # Node clocks an hour ahead and 30 s behind: nothing is compared with the controller's clock.
    offsets = [3600.0, -30.0, 0.0, 5.0]
    p = Passes()
    for i in range(10):
        a = p.at(float(i), [beat(r, i, progress=100.0 + i, step=10 + i, clock_offset=offsets[r]) for r in range(4)])
    assert a.findings == [] and a.ranks_seen == 4 and a.min_step == a.max_step == 19


def test_dead_rank_is_detected_by_an_unchanged_beat_even_with_a_clock_an_hour_ahead():
    p = Passes()
    frozen = beat(1, 0, clock_offset=3600.0)  # its beat_time is an hour "in the future"
    for i in range(4):  # up to 1.5 s unchanged: not yet
        a = p.at(i * 0.5, [beat(0, i), frozen, beat(2, i), beat(3, i)])
    assert a.findings == [], "not dead before dead_after"
    a = p.at(2.1, [beat(0, 9), frozen, beat(2, 9), beat(3, 9)])
    assert [(f.kind, f.rank) for f in a.dead] == [(FindingKind.DEAD_RANK, 1)]
    assert a.dead[0].age_seconds == 2.1
    assert [f.host for f in a.culprits()] == ["node02"]


def test_hang_is_progress_not_changing_while_beats_go_on():
    p = Passes()
    a = None
    for i in range(8):  # beats change every pass, progress never does
        a = p.at(i * 0.5, [beat(r, i, step=9 if r == 0 else 10) for r in range(4)])
    assert {f.rank for f in a.hung} == {0, 1, 2, 3} and a.hung[0].limit_seconds == 3.0
    assert [f.rank for f in a.culprits()] == [0], "the rank behind is the suspect"
    level = Passes()
    for i in range(8):
        a = level.at(i * 0.5, [beat(r, i) for r in range(4)])
    assert len(a.hung) == 4 and a.culprits() == [], "nobody can be singled out"


def test_checkpoint_phase_uses_its_own_timeout():
    p = Passes()
    for i in range(9):  # 4 s into a save: over the 3 s step floor, under the 6 s checkpoint floor
        a = p.at(i * 0.5, [beat(r, i, phase="checkpoint") for r in range(4)])
    assert a.findings == []


def test_missing_rank_after_init_timeout_and_other_jobs_ignored():
    p = Passes()
    old_job = beat(3, 0, job="6")

    def working(i):  # ranks 0-2 train on; rank 3 never wrote a beat of job 7
        return [beat(r, i, step=i, progress=100.0 + i) for r in range(3)] + [old_job]

    for now in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 12.0, 14.0, 16.0, 18.0, 19.0):
        assert p.at(now, working(int(now))).findings == []
    late = p.at(21.0, working(21))  # init floor 20 s
    assert [(f.kind, f.rank) for f in late.findings] == [(FindingKind.MISSING_RANK, 3)]


def test_requeued_job_old_beats_are_neither_dead_nor_progress():
    """SLURM requeued job 7 under the same id: its old beats stay on disk until overwritten."""
    p = Passes()
    old = [beat(r, 5) for r in range(4)]
    p.at(0.0, old)
    p.live.expect_new_incarnation()  # the supervisor saw the job go back to pending
    for now in (5.0, 10.0, 15.0):  # long past dead_after: still no verdict on the old beats
        assert p.at(now, old).findings == []
    new = [beat(r, 1, restart_count=1) for r in range(2)] + old[2:]
    a = p.at(16.0, new)
    assert a.findings == [] and a.ranks_seen == 2
    # Without word from SLURM, a newer restart_count in the beats is enough to start over.
    q = Passes()
    q.at(0.0, old)
    a = q.at(3.0, [beat(0, 1, restart_count=1), *old[1:]])
    assert a.findings == [] and a.ranks_seen == 1


def test_most_ranks_dead_at_once_is_a_job_wide_incident_not_n_nodes():
    p = Passes(world=8)
    frozen = [beat(r, 0) for r in range(8)]
    p.at(0.0, frozen)
    a = p.at(2.0, [*frozen[:6], beat(6, 1), beat(7, 1)])
    assert len(a.dead) == 6 and a.job_wide and a.culprits() == []
    b = p.at(2.5, [*frozen[:3], *(beat(r, 2) for r in range(3, 8))])
    assert len(b.dead) == 3 and not b.job_wide and {f.rank for f in b.culprits()} == {0, 1, 2}


def test_exclusions_per_incident_are_capped():
    assert culprit_nodes(["node02", "node02", ""], cap=2) == (["node02"], None)
    nodes, why = culprit_nodes(["node01", "node02", "node03"], cap=2)
    assert nodes == [] and "max_excluded_per_incident=2" in why


def test_exiting_rank_is_neither_hung_nor_dead():
    p = Passes()
    gone = beat(0, 0, phase="exiting")
    for i in range(9):
        a = p.at(i * 0.5, [gone, *(beat(r, i, phase="checkpoint") for r in (1, 2, 3))])
    assert a.findings == []


def test_step_timeout_is_learned_from_per_step_durations_only():
    """BLOOM: 100 steps of 105 s then a save. The stretch of steps before the save (10,500 s)
    must never count as one step; only `extra.step_seconds` teaches the step timeout."""
    t = PhaseTimeouts(floors={"init": 3600, "step": 900, "checkpoint": 3600, "eval": 1800, "exiting": 3600}, factor=5)
    assert learn_from_beat(t, beat(0, 1, extra={"step_seconds": 105.0, "durations": {"step": 10_500.0}})) == ["step"]
    assert t.timeout("step") == 900, "5 x 105 s = 525 s is under the 900 s floor"
    learn_from_beat(t, beat(0, 2, extra={"step_seconds": 300.0}))
    assert t.timeout("step") == 1500
    learn_from_beat(t, beat(0, 3, extra={"step_seconds": 100_000.0}))
    assert t.timeout("step") == CAP_OVER_FLOOR * 900, "one outlier cannot switch hang detection off"
    for bad in (math.inf, math.nan, -5.0, "1e999", True, None, [1]):
        assert learn_from_beat(t, beat(0, 4, extra={"step_seconds": bad, "durations": {"checkpoint": bad}})) == []
    assert math.isfinite(t.timeout("checkpoint")) and t.timeout("checkpoint") == 3600


def test_learned_save_timeout_from_reported_durations():
    t = timeouts()
    assert t.timeout("checkpoint") == 6.0  # the floor
    assert learn_from_beat(t, beat(0, 1, extra={"durations": {"checkpoint": 7.5}})) == ["checkpoint"]
    assert t.timeout("checkpoint") == 3 * 7.5
    p = Passes(t=t)
    for i in range(31):  # a 15 s save after a 7.5 s one is not a hang (learned 22.5 s)
        a = p.at(i * 0.5, [beat(r, i, phase="checkpoint") for r in range(4)])
    assert a.findings == []


def test_classify_end():
    assert classify_end("completed", 0) is Outcome.FINISHED
    assert classify_end("failed", 17) is Outcome.KILLED
    assert classify_end("failed", 18) is Outcome.TIME_BUDGET
    assert classify_end("failed", 19) is Outcome.CONFIG_ERROR
    assert classify_end("failed", 137) is Outcome.FAILED
    assert classify_end("failed", 0) is Outcome.FAILED
    assert classify_end("timeout", None) is Outcome.TIME_BUDGET
    assert classify_end("cancelled", None) is Outcome.CANCELLED
    assert classify_end("node_fail", None) is Outcome.FAILED
