"""Pure supervision rules: liveness by change on the controller's clock, dead/hung/missing ranks,
job-wide incidents, culprits and their cap, learned per-phase timeouts, how a job ended. Plain
data, no processes: each test plays passes of the controller at given monotonic times."""

from __future__ import annotations

import math

from fakes import make_config

from orchestrator.contract import Heartbeat, Outcome, classify_end
from orchestrator.contract.causes import Cause
from orchestrator.controller.detection import assess, culprit_nodes
from orchestrator.controller.liveness import Liveness
from orchestrator.controller.timeouts import PhaseTimeouts, silent_after

DEAD_AFTER = 1.5  # make_config(): unlearned step 3 s, checkpoint 6 s, init 20 s; floors 10/20/30, factor 3
SILENT_AFTER = silent_after(make_config().watchdog)  # 0.4 s: 2 beats and 2 passes of 0.1 s


def beat(rank, seq, *, job="7", step=10, phase="step", progress=100.0, clock_offset=0.0, restart_count=0, extra=None,
         host=None, marks=0):
    """A beat as a node writes it (its JSON, read back by the contract): times on that node's own
    clock (offset from the true time)."""
    return Heartbeat.from_dict({"rank": rank, "world_size": 4, "host": host or f"node{rank + 1:02d}", "job_id": job,
            "pid": 100 + rank, "progress_count": marks,
            "seq": seq, "step": step, "phase": phase, "beat_time": 1000.0 + seq + clock_offset,
            "progress_time": progress + clock_offset, "phase_started": 50.0 + clock_offset,
            "restart_count": restart_count, "process_started": 1.0, "version": 1, "extra": extra or {}})


def timeouts():
    return PhaseTimeouts.from_watchdog(make_config().watchdog)


class Passes:
    """The controller's passes over one job: beats in, assessment out, at monotonic times."""

    def __init__(self, t=None, world=4, stall_tolerance=0.0):
        self.live, self.t, self.world = Liveness(SILENT_AFTER), t or timeouts(), world
        self.stall_tolerance = stall_tolerance

    def at(self, now, beats, job="7"):
        views = self.live.observe([[b] for b in beats], job, now)  # each beat its own file
        self.t.learn(self.live.gaps_changed)
        return assess(views, job_id=job, job_seen_at=self.live.job_seen_at, world_size=self.world, now=now,
                      dead_after=DEAD_AFTER, silent_after=SILENT_AFTER, timeouts=self.t,
                      stall_tolerance=self.stall_tolerance)


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
    assert [(f.kind, f.rank) for f in a.dead] == [(Cause.DEAD_RANK, 1)]
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
    assert [(f.kind, f.rank) for f in late.findings] == [(Cause.MISSING_RANK, 3)]


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


def fine(rank, seq, count, *, unit="forward", gaps=None, phase="step", step=10):
    """A version-3 beat with fine progress: `count` marks done, the last one `unit`."""
    return Heartbeat.from_dict({"rank": rank, "world_size": 4, "host": f"node{rank + 1:02d}", "job_id": "7",
            "pid": 100 + rank, "seq": seq, "step": step, "phase": phase, "beat_time": 1000.0 + seq,
            "progress_time": 100.0, "phase_started": 50.0, "process_started": 1.0, "progress_count": count,
            "progress_unit": unit, "mark_gaps": gaps or {}, "version": 3})


def test_limits_are_learned_from_mark_gaps_floored_capped_and_unlearned_until_then():
    """make_config(): before any gap, the phase timeouts (step 3 s, checkpoint 6 s); then
    min(cap 60, max(floor, 3 x gap)) with floors step 10, checkpoint 20, init 30."""
    t = timeouts()
    assert (t.timeout("step"), t.timeout("checkpoint"), t.timeout("init")) == (3.0, 6.0, 20.0)
    assert t.observe("step", 2.0) and t.timeout("step") == 10.0, "3 x 2 s is under the 10 s floor"
    assert t.timeout("checkpoint") == 6.0, "a step gap teaches nothing about saves"
    assert t.observe("step", 5.0) and t.timeout("step") == 15.0
    assert not t.observe("step", 4.0) and t.timeout("step") == 15.0, "the longest gap counts"
    assert t.observe("checkpoint", 1000.0) and t.timeout("checkpoint") == 60.0, "capped: never switched off"
    for bad in (math.inf, math.nan, -5.0, 0.0, "1e999", True, None, [1]):
        assert not t.observe("eval", bad)
    assert not t.observe("lunch", 5.0) and t.timeout("eval") == 6.0
    assert all(math.isfinite(t.timeout(phase)) for phase in ("init", "step", "checkpoint", "eval", "exiting"))


def test_slow_step_whose_marks_move_is_not_a_hang_but_marks_that_stop_are():
    """Learned step limit 10 s (gap 1 s x 3, floored). A step 40 s long whose micro-batches
    keep coming every 2 s is work; the same rank without a mark for over 10 s is hung."""
    p = Passes()
    a = None
    for i in range(81):  # 40 s, one pass every 0.5 s, a mark every 2 s, the step never ends
        a = p.at(i * 0.5, [fine(r, i, i // 4, gaps={"step": 1.0 if i < 4 else 2.0}) for r in range(4)])
        assert a.findings == [], f"a slow step flagged at {i * 0.5} s: {a.findings}"
    assert p.t.timeout("step") == 10.0
    frozen = [(r, 20) for r in range(4)]
    for i in range(81, 120):  # marks stop at 40 s; beats go on
        a = p.at(i * 0.5, [fine(r, i, c, gaps={"step": 2.0}) for r, c in frozen])
        if a.findings:
            break
    took = i * 0.5 - 40.0
    print(f"hang found {took:.1f} s after the last mark, limit {a.hung[0].limit_seconds} s")
    assert {f.rank for f in a.hung} == {0, 1, 2, 3} and 10.0 < took <= 10.5


def test_waiting_ranks_are_not_hung_until_nobody_progresses():
    """Ranks 1-3 wait in the reduce for rank 0, whose marks move: nothing. Rank 0 stops working:
    it alone is hung (its peers are waiting for it). All four waiting and nothing moving (the
    collective itself hangs): after the limit, all are hung."""
    p = Passes()
    a = None
    for i in range(41):  # 20 s: rank 0 marks every 0.5 s, the others waited from the start
        a = p.at(i * 0.5, [fine(0, i, i, gaps={"step": 0.5}), *(fine(r, i, 3, unit="wait") for r in (1, 2, 3))])
    assert a.findings == [], "waiting for a peer that works is not a hang"
    for i in range(41, 80):  # rank 0 stops, not waiting
        a = p.at(i * 0.5, [fine(0, i, 40, gaps={"step": 0.5}), *(fine(r, i, 3, unit="wait") for r in (1, 2, 3))])
        if a.findings:
            break
    assert [f.rank for f in a.hung] == [0] and 10.0 < i * 0.5 - 20.0 <= 10.5
    everyone = Passes()
    for i in range(60):  # every rank entered the reduce (its WAIT mark) and it never completes
        a = everyone.at(i * 0.5, [fine(r, i, 7, unit="wait", gaps={"step": 0.5}) for r in range(4)])
        if a.findings:
            break
    assert {f.rank for f in a.hung} == {0, 1, 2, 3} and 10.0 < i * 0.5 <= 10.5, i * 0.5


def test_no_hang_verdict_while_silent_and_the_timer_restarts_when_beats_return():
    """A filesystem stall: beats and marks stop for 1.2 s (silent after 0.4 s, dead after 1.5 s);
    when the beats come back their progress was not seen meanwhile: a full limit again."""
    p = Passes()
    for i in range(21):  # 10 s of work, a mark per pass
        p.at(i * 0.5, [fine(r, i, i, gaps={"step": 0.5}) for r in range(4)])
    stalled = [fine(r, 20, 20, gaps={"step": 0.5}) for r in range(4)]
    for now in (10.5, 11.0):
        assert p.at(now, stalled).findings == []
    back = None
    for i in range(23, 60):  # beats again from 11.5 s, still no new mark
        back = p.at(i * 0.5, [fine(r, i, 20, gaps={"step": 0.5}) for r in range(4)])
        if back.findings:
            break
    assert back.hung and 10.0 < i * 0.5 - 11.5 <= 10.5, f"hung at {i * 0.5} s: the timer did not restart"


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


def test_a_silent_rank_holds_its_peers_hang_until_it_is_dead_then_it_is_blamed():
    """Rank 3's node goes quiet (no beat); ranks 0-2 beat on but cannot progress without it. With
    dead_after 10 s, their hang limit (3 s, unlearned) passes while rank 3 is silent (after 0.4 s)
    and not yet dead: no verdict; at dead_after rank 3 is dead, and the one blamed."""
    p = Passes()
    p.at(0.0, [fine(r, 0, 5) for r in range(4)])
    quiet = fine(3, 0, 5)
    a = None
    for i in range(1, 24):  # 11.5 s: progress frozen everywhere, ranks 0-2 beat
        now = i * 0.5
        views = p.live.observe([[fine(r, i, 5)] for r in range(3)] + [[quiet]], "7", now)
        a = assess(views, job_id="7", job_seen_at=p.live.job_seen_at, world_size=4, now=now, dead_after=10.0,
                   silent_after=SILENT_AFTER, timeouts=p.t)
        if now <= 10.0:
            assert a.findings == [], f"a verdict at {now} s while rank 3 is silent: {a.findings}"
    assert [(f.kind, f.rank) for f in a.dead] == [(Cause.DEAD_RANK, 3)]
    assert [f.host for f in a.culprits()] == ["node04"], "the dead rank is blamed, not its stalled peers"


def test_node_files_a_dead_peer_is_its_own_entry_a_dead_gatherer_is_its_whole_node(tmp_path):
    """Real node files through the reader: node01's rank 1 stops (its entry freezes in a file that
    goes on moving), then node02's local rank 0 (the writer of its file) stops: all of node02."""
    from orchestrator.contract import HeartbeatReader, NodeBeat, write_node_beat

    def node(host, ranks, seq, frozen=()):
        beats = [fine(r, 0 if r in frozen else seq, seq, gaps={"step": 0.5}) for r in ranks]
        for b in beats:
            b.host = host
        return NodeBeat(host, "7", 4, 0, 0, beats)

    reader, live = HeartbeatReader(tmp_path), Liveness(SILENT_AFTER)
    t = timeouts()

    def at(now, *nodes):
        for n in nodes:
            write_node_beat(tmp_path, n, durable=False)
        views = live.observe(reader.read_files(), "7", now)
        return assess(views, job_id="7", job_seen_at=live.job_seen_at, world_size=4, now=now, dead_after=DEAD_AFTER,
                      silent_after=SILENT_AFTER, timeouts=t)

    at(0.0, node("node01", (0, 1), 1), node("node02", (2, 3), 1))
    for i in range(2, 8):  # node01's rank 1 froze (from 1.0 s); node01's file and node02 move on
        a = at(i * 0.5, node("node01", (0, 1), i, frozen=(1,)), node("node02", (2, 3), i))
    assert [(f.kind, f.rank) for f in a.findings] == [(Cause.DEAD_RANK, 1)] and a.culprits()[0].host == "node01"
    reader, live, t = HeartbeatReader(tmp_path), Liveness(SILENT_AFTER), timeouts()  # a fresh controller
    at(10.0, node("node01", (0, 1), 20), node("node02", (2, 3), 20))
    for i in range(21, 26):  # node02's file is never written again (its writer is gone)
        a = at(10.0 + (i - 20) * 0.5, node("node01", (0, 1), i))
    assert sorted((f.kind, f.rank) for f in a.findings) == [(Cause.DEAD_RANK, 2), (Cause.DEAD_RANK, 3)]


def test_a_stall_is_not_a_death_where_the_node_cannot_be_lost():
    """Tolerance 10 s (dead after 1.5 s). Passes every 0.5 s; a beat or progress that moves changes
    its seq or its mark count each pass."""
    def dead_at(scene, tolerance=10.0, until=12.0):
        p = Passes(stall_tolerance=tolerance)
        for i in range(int(until / 0.5) + 1):
            a = p.at(i * 0.5, scene(i))
            if a.dead:
                return i * 0.5, sorted(f.rank for f in a.dead)
        return None, []

    # Every node silent at once (the filesystem stalls): not dead until the tolerance is spent.
    everyone = lambda i: [beat(r, min(i, 2), marks=min(i, 2)) for r in range(4)]  # noqa: E731
    when, ranks = dead_at(everyone)
    assert when is not None and 11.0 <= when <= 11.5 and ranks == [0, 1, 2, 3], (when, ranks)
    # node02 silent while its peers still make marks (its writes stall, it computes on).
    writes_stall = lambda i: [beat(r, min(i, 2) if r == 1 else i, marks=i) for r in range(4)]  # noqa: E731
    when, ranks = dead_at(writes_stall)
    assert when is not None and when >= 11.0 and ranks == [1], (when, ranks)
    # node02 silent while its peers only beat (they wait for it): a lost node, dead at dead_after.
    peers_wait = lambda i: [beat(r, min(i, 2) if r == 1 else i, marks=min(i, 2)) for r in range(4)]  # noqa: E731
    assert dead_at(peers_wait) == (3.0, [1])
    # One rank silent on a node whose other rank still beats (SIGSTOP): dead at dead_after.
    shared = lambda i: [beat(r, min(i, 2) if r == 1 else i, marks=min(i, 2) if r == 1 else i,  # noqa: E731
                             host="node01" if r < 2 else None) for r in range(4)]
    assert dead_at(shared) == (3.0, [1])
    # No tolerance: every silence is a death at dead_after.
    assert dead_at(everyone, tolerance=0.0) == (3.0, [0, 1, 2, 3])
    assert dead_at(writes_stall, tolerance=0.0) == (3.0, [1])
    # node02 silent during init, where nobody makes marks: only time tells, so the tolerance.
    init = lambda i: [beat(r, min(i, 2) if r == 1 else i, phase="init") for r in range(4)]  # noqa: E731
    when, ranks = dead_at(init)
    assert when is not None and 11.0 <= when <= 11.5 and ranks == [1], (when, ranks)
    assert dead_at(init, tolerance=0.0) == (3.0, [1])
    # ...but once its peers have left init and wait for it, it is a lost node again.
    peers_left_init = lambda i: [beat(r, min(i, 2), phase="init") if r == 1 else beat(r, i)  # noqa: E731
                                 for r in range(4)]
    assert dead_at(peers_left_init) == (3.0, [1])
    # node02 silent in a save while its peers, done with theirs, wait for it at the barrier: its
    # storage stalls (a lost node there ends the job NODE_FAIL in SLURM), so the tolerance.
    in_save = lambda i: [beat(r, min(i, 2) if r == 1 else i, marks=min(i, 2), phase="checkpoint")  # noqa: E731
                         for r in range(4)]
    when, ranks = dead_at(in_save)
    assert when is not None and 11.0 <= when <= 11.5 and ranks == [1], (when, ranks)
    assert dead_at(in_save, tolerance=0.0) == (3.0, [1])
    # One rank silent in init on a node whose other rank still beats (SIGSTOP): dead at dead_after.
    alone_in_init = lambda i: [beat(r, min(i, 2) if r == 1 else i, phase="init",  # noqa: E731
                                    host="node01" if r < 2 else None) for r in range(4)]
    assert dead_at(alone_in_init) == (3.0, [1])
    # One rank silent in a save on a node whose other rank still beats (SIGSTOP): dead at dead_after.
    alone_in_save = lambda i: [beat(r, min(i, 2) if r == 1 else i, marks=min(i, 2), phase="checkpoint",  # noqa: E731
                                    host="node01" if r < 2 else None) for r in range(4)]
    assert dead_at(alone_in_save) == (3.0, [1])
    # node01's storage stalls (it computes on); node04 is lost at 3.0 s (everyone then waits for it);
    # node01 beats again at 4.0 s with the marks it made meanwhile. Marks made at some unknown time
    # during a silence are no evidence that the peers lived after node04 went quiet: node04 is dead at
    # dead_after (soak x1 seed 4: a 10-minute storage stall that ended 40 s after a node was lost
    # made that node a "stall", found by SLURM 420 s later).
    def stall_then_loss(i):
        back = i >= 8
        return [beat(0, i if back else min(i, 2), marks=6 if back else min(i, 2)),
                *(beat(r, i, marks=min(i, 6)) for r in (1, 2)), beat(3, min(i, 6), marks=min(i, 6))]

    assert dead_at(stall_then_loss) == (5.0, [3])
    # The same silence in a step (peers wait for it in a collective): a lost node, dead at dead_after.
    in_step = lambda i: [beat(r, min(i, 2) if r == 1 else i, marks=min(i, 2), phase="step") for r in range(4)]  # noqa: E731
    assert dead_at(in_step) == (3.0, [1])


def stuck_until_found(beats):
    """Passes every 0.5 s over the same beats (marks never move again) until a finding; the
    assessment then. Unlearned step limit: 3 s (make_config)."""
    p = Passes()
    for i in range(40):
        a = p.at(i * 0.5, [fine(b.rank, i, b.progress_count, unit=b.progress_unit, step=b.step) for b in beats])
        if a.findings:
            return a
    raise AssertionError("no hang found")


def test_the_rank_behind_is_named_but_not_blamed_when_it_waits_like_everyone():
    """Rank 1 hung mid-step: it made 5 marks of the step, its peers 9, and every one of them is
    now in a wait. Rank 1 is the suspect, but a rank in a collective waits for another: with every
    stuck rank waiting the fault is below what marks can see, and no node is blamed on them."""
    a = stuck_until_found([fine(r, 0, 5 if r == 1 else 9, unit="wait") for r in range(4)])
    assert {f.rank for f in a.hung} == {0, 1, 2, 3}, "everyone stuck: the hang itself is found"
    assert [f.rank for f in a.suspects] == [1] and "fewest marks" in a.suspects_why, a.suspects_why
    assert a.culprits() == [] and not a.suspects_sure and "not enough to exclude" in a.suspects_why


def test_a_rank_at_a_lower_step_is_named_though_it_waits_but_not_blamed():
    a = stuck_until_found([fine(r, 0, 9, unit="wait" if r == 3 else "forward", step=9 if r == 3 else 10)
                           for r in range(4)])  # fmt: skip
    assert [f.rank for f in a.suspects] == [3] and "step 9" in a.suspects_why and a.culprits() == []


def test_a_rank_hung_in_its_forward_is_blamed_and_the_stages_waiting_for_it_are_not():
    """pp = 2, tp = 2 (the demo): rank 1 stops in its forward; its TP peer rank 0 waits in the
    forward's all-reduce, stage 1 (ranks 2, 3) in the receive of its activations. Only rank 1."""
    a = stuck_until_found([fine(r, 0, 9, unit="forward" if r == 1 else "wait") for r in range(4)])
    assert [f.rank for f in a.culprits()] == [1] and a.suspects_sure, a.suspects_why


def test_a_rank_stuck_a_step_behind_is_named_before_the_peers_that_wait_for_it_cross_their_limit():
    """Rank 0 stops in step 8; its peers finish their share later, go on to step 9 and wait there
    for it. Rank 0 crosses its limit first, alone: it is behind (on a loaded CI machine this named
    nobody, 'all 1 stuck ranks at the same step': a job-wide hang)."""
    p = Passes()
    for i in range(40):
        now = i * 0.5
        peers_moving = now < 2.0
        beats = [fine(0, i, 9, unit="forward", step=8)] + [
            fine(r, i, 9 + i if peers_moving else 13, unit="forward" if peers_moving else "wait", step=9)
            for r in (1, 2, 3)
        ]
        a = p.at(now, beats)
        if a.findings:
            break
    assert [f.rank for f in a.hung] == [0], a.findings
    assert [f.rank for f in a.culprits()] == [0] and "step 8" in a.suspects_why, a.suspects_why


def test_the_rank_working_while_the_others_wait_is_named():
    a = stuck_until_found([fine(r, 0, 9, unit="backward" if r == 2 else "wait") for r in range(4)])
    assert [f.rank for f in a.hung] == [2]
    assert [f.rank for f in a.culprits()] == [2] and "own work" in a.suspects_why


def test_everyone_waiting_at_the_same_count_names_nobody_and_says_so():
    a = stuck_until_found([fine(r, 0, 9, unit="wait") for r in range(4)])
    assert {f.rank for f in a.hung} == {0, 1, 2, 3} and a.culprits() == []
    assert "nobody named" in a.suspects_why and "job-wide" in a.suspects_why, a.suspects_why


def test_the_failure_event_and_notification_name_the_rank_behind_or_say_why_nobody():
    from orchestrator.controller.actions import Notify, Record
    from orchestrator.controller.policy import on_findings
    from tests.pass_views import job_view

    def report(beats):
        view = job_view(assessment=stuck_until_found(beats), wall=2000.0, dead_after=DEAD_AFTER)
        verdict = on_findings(view, job_wide_for=0.0, culprit_nodes=[])
        event = next(a.event for a in verdict.actions if isinstance(a, Record) and a.event.KIND == "failure")
        notice = next(a for a in verdict.actions if isinstance(a, Notify))
        return event, notice.message

    event, message = report([fine(r, 0, 5 if r == 1 else 9, unit="wait") for r in range(4)])
    assert [s["rank"] for s in event.suspects] == [1] and event.suspects[0]["host"] == "node02"
    assert "not enough to exclude" in event.suspects_why
    assert "rank 1 on node02" in message and "fewest marks" in event.suspects_why
    event, message = report([fine(r, 0, 9, unit="wait") for r in range(4)])
    assert event.suspects == [] and "job-wide" in event.suspects_why and "nobody named" in message
