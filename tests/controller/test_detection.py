"""Pure supervision rules: dead, hung and missing ranks, learned per-phase timeouts, how a job
ended, culprits. Plain dicts, no processes."""

from __future__ import annotations

from fakes import make_config

from orchestrator.controller.detection import FindingKind, Outcome, assess, classify_end
from orchestrator.controller.timeouts import PhaseSample, PhaseTimeouts, learn_from_transition

NOW = 1_000_000.0


def beat(rank, *, job="7", age=0.5, stalled=0.5, phase="step", step=10, host=None):
    return {"rank": rank, "world_size": 4, "host": host or f"node{rank + 1:02d}", "job_id": job, "pid": 100 + rank,
            "step": step, "phase": phase, "beat_time": NOW - age, "progress_time": NOW - stalled,
            "phase_started": NOW - stalled, "extra": {}}


def timeouts(**observed):
    return PhaseTimeouts.from_watchdog(make_config().watchdog, observed)


def run(beats, started=NOW - 100, **kw):
    return assess(beats, job_id="7", job_started=started, world_size=4, now=NOW, dead_after=1.5,
                  timeouts=kw.get("t") or timeouts())


def test_healthy_ranks_no_findings():
    a = run([beat(r) for r in range(4)])
    assert a.findings == [] and a.ranks_seen == 4 and a.min_step == a.max_step == 10


def test_dead_rank_is_the_culprit_and_others_hang():
    beats = [beat(0, stalled=5), beat(1, age=9, stalled=9, step=9), beat(2, stalled=5), beat(3, stalled=5)]
    a = run(beats)
    assert [(f.kind, f.rank) for f in a.dead] == [(FindingKind.DEAD_RANK, 1)]
    assert {f.rank for f in a.hung} == {0, 2, 3}
    assert [f.host for f in a.culprits()] == ["node02"]
    assert a.dead[0].since == NOW - 9


def test_pure_hang_blames_the_rank_behind_only_when_others_are_ahead():
    behind = run([beat(0, stalled=5, step=9), *[beat(r, stalled=4, step=10) for r in (1, 2, 3)]])
    assert [f.rank for f in behind.culprits()] == [0]
    level = run([beat(r, stalled=5) for r in range(4)])
    assert len(level.hung) == 4 and level.culprits() == []


def test_checkpoint_phase_uses_its_own_timeout():
    # 4 s into a save: over the 3 s step floor, under the 6 s checkpoint floor -> not a hang.
    a = run([beat(r, phase="checkpoint", stalled=4) for r in range(4)])
    assert a.findings == []
    b = run([beat(r, phase="step", stalled=4) for r in range(4)])
    assert len(b.hung) == 4 and b.hung[0].limit_seconds == 3.0


def test_learned_timeout_grows_from_observed_saves():
    t = timeouts()
    assert t.timeout("checkpoint") == 6.0  # the floor
    before = PhaseSample("checkpoint", NOW - 10, 10, NOW - 10)
    after = PhaseSample("step", NOW - 2.5, 10, NOW - 2.5)  # the save lasted 7.5 s
    assert learn_from_transition(t, before, after) == ["checkpoint"]
    assert t.timeout("checkpoint") == 3 * 7.5  # factor x longest observed
    a = run([beat(r, phase="checkpoint", stalled=15) for r in range(4)], t=t)
    assert a.findings == [], "a 15 s save after a 7.5 s one is not a hang (learned 22.5 s)"
    assert t.timeout("step") == 3.0


def test_step_rate_learned_only_within_one_stretch_of_steps():
    t = timeouts()
    grown = learn_from_transition(t, PhaseSample("step", NOW - 50, 10, NOW - 40), PhaseSample("step", NOW - 50, 20, NOW - 20))
    assert grown == ["step"] and t.observed_max["step"] == 2.0 and t.timeout("step") == 6.0
    t2 = timeouts()  # a save happened between the samples: phase_started moved, no step sample
    assert learn_from_transition(t2, PhaseSample("step", NOW - 50, 10, NOW - 40), PhaseSample("step", NOW - 5, 20, NOW - 2)) == []


def test_missing_rank_after_init_timeout_and_other_jobs_ignored():
    beats = [beat(0), beat(1), beat(2), beat(3, job="6", age=500)]
    early = run(beats, started=NOW - 5)
    assert early.findings == []
    late = run(beats, started=NOW - 25)  # init floor 20 s
    assert [(f.kind, f.rank) for f in late.findings] == [(FindingKind.MISSING_RANK, 3)]


def test_exiting_rank_is_neither_hung_nor_dead():
    # Rank 0 finished and left 30 s ago (no beat since) while the others still save: no finding.
    a = run([beat(0, phase="exiting", stalled=30, age=30), *[beat(r, phase="checkpoint", stalled=4) for r in (1, 2, 3)]])
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
