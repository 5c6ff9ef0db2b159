"""Straggler scoring (orchestrator/controller/stragglers.py) on hand-made numbers at BLOOM's scale:
48 nodes x 8 ranks (tp=4, dp=8, pp=12: four nodes per pipeline stage), one round per 105 s step,
straggler_threshold 1.2, straggler_seconds 600. The expected rounds are worked out by hand in
each test: slow from round 10 (t = 1050 s) -> 600 s later is t = 1650 s -> the first round at or
after it is round 16 (t = 1680 s)."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.contract import Heartbeat
from orchestrator.controller.actions import ChangeState, Exclude, Notify, Record
from orchestrator.controller.stragglers import RankSample, StragglerScorer, StragglerWatch
from tests.pass_views import job_view

NODES, RANKS_PER_NODE, TP, DP = 48, 8, 4, 8
STEP_SECONDS = 105.0


def bloom_group(rank: int) -> str:
    """Megatron order: rank = pp * dp * tp + dp_rank * tp + tp_rank."""
    return f"pp{rank // (TP * DP)}.tp{rank % TP}"


def stage_seconds(node: int) -> float:
    """Unequal pipeline stages: the embedding stages (first and last) do more work."""
    stage = node * RANKS_PER_NODE // (TP * DP)
    return 115.0 if stage in (0, 11) else 100.0


def run_rounds(compute, rounds: int, scorer: StragglerScorer | None = None, group=bloom_group, job="1"):
    """compute(node, round) -> seconds of every rank of that node in that round. Returns
    (scorer, [(round, kind, node)])."""
    scorer = scorer or StragglerScorer(threshold=1.2, duration_seconds=600.0)
    seen = []
    for r in range(1, rounds + 1):
        samples = [
            RankSample(rank, f"node{rank // RANKS_PER_NODE:02d}", r, compute(rank // RANKS_PER_NODE, r), group(rank))
            for rank in range(NODES * RANKS_PER_NODE)
        ]
        for change in scorer.observe(job, samples, now=r * STEP_SECONDS):
            seen.append((r, change.kind, change.node))
    return scorer, seen


def test_one_node_30_percent_slower_for_long_enough_is_flagged_at_round_16():
    def compute(node, r):
        return stage_seconds(node) * (1.3 if node == 17 and r >= 10 else 1.0)

    scorer, seen = run_rounds(compute, 20)
    assert seen == [(16, "straggler", "node17")]
    last = scorer.summary()["nodes"]["node17"]
    assert last["vs_median"] == 1.3 and last["vs_history"] == 1.3 and last["straggler"]
    healthy = scorer.summary()["nodes"]["node00"]  # an embedding-stage node: 115 s, like its peers
    assert healthy["score"] == 1.0 and not healthy["straggler"]


def test_slow_for_less_than_the_duration_is_not_flagged():
    def compute(node, r):  # slow in rounds 10..15: 525 s < 600 s
        return stage_seconds(node) * (1.3 if node == 17 and 10 <= r <= 15 else 1.0)

    _, seen = run_rounds(compute, 30)
    assert seen == []


def test_whole_job_slowdown_flags_nobody():
    def compute(node, r):  # e.g. the batch-size rampup: every node 30 % slower from round 10
        return stage_seconds(node) * (1.3 if r >= 10 else 1.0)

    scorer, seen = run_rounds(compute, 30)
    assert seen == []
    assert {v["score"] for v in scorer.summary()["nodes"].values()} == {1.0}


def test_history_alone_finds_a_node_without_peers():
    """pp=48: every node is its own pipeline stage (no peers to compare with) and the stages differ
    (80..127 s). Node 5 gets 30 % slower than it used to be."""

    def compute(node, r):
        return (80.0 + node) * (1.3 if node == 5 and r >= 10 else 1.0)

    scorer, seen = run_rounds(compute, 20, group=lambda rank: f"pp{rank // RANKS_PER_NODE}")
    assert seen == [(16, "straggler", "node05")]
    assert scorer.summary()["nodes"]["node05"]["vs_median"] is None

    def everyone(node, r):
        return (80.0 + node) * (1.3 if r >= 10 else 1.0)

    _, seen = run_rounds(everyone, 20, group=lambda rank: f"pp{rank // RANKS_PER_NODE}")
    assert seen == []


def test_no_alarm_in_warmup_nor_after_a_restart_and_recovery_is_reported():
    def warmup(node, r):  # node 3 takes 5x longer in its first two steps (compilation)
        return 500.0 if node == 3 and r <= 2 else stage_seconds(node)

    scorer, seen = run_rounds(warmup, 12)
    assert seen == []

    def slow_then_well(node, r):
        return stage_seconds(node) * (1.3 if node == 3 and r < 20 else 1.0)

    scorer, seen = run_rounds(slow_then_well, 40)
    # Scored from round 3 (t = 315 s): flagged at the first round >= 915 s, round 9; well from
    # round 20 (t = 2100 s): recovered at the first round >= 2700 s, round 26.
    assert seen == [(9, "straggler", "node03"), (26, "straggler_recovered", "node03")]
    # A new job: no history yet (vs_history needs 3 rounds of baseline after the 2 warm-up rounds).
    run_rounds(lambda node, r: stage_seconds(node), 4, scorer=scorer, job="2")
    assert scorer.summary()["nodes"]["node03"]["vs_history"] is None


def beat(rank: int, step: int, seconds: float, job: str = "7") -> dict:
    """A beat's JSON as a rank writes it (read back through the contract by `parsed`)."""
    return {"rank": rank, "world_size": 4, "job_id": job, "host": "login", "pid": 10 + rank, "phase": "step",
            "step": step, "beat_time": 1.0, "progress_time": 1.0, "phase_started": 1.0, "restart_count": 0,
            "compute_seconds": seconds, "compute_step": step, "compute_group": "pp0.tp0"}  # fmt: skip


def parsed(beats: list[dict]) -> list[Heartbeat]:
    return [Heartbeat.from_dict(b) for b in beats]


def on_pass(watch: StragglerWatch, state, job, beats: list[dict], now: float, node_of) -> list:
    """One pass of the watch; its ChangeState applied to `state` as the controller's applier
    does, the other actions returned."""
    actions = watch.on_pass(job_view(job, state=state, beats=parsed(beats), mono=now,
                                     node_of=lambda rank, host: node_of(rank, host, job)))
    for action in actions:
        if isinstance(action, ChangeState):
            state.stragglers = dict(action.stragglers)
    return [a for a in actions if not isinstance(a, ChangeState)]


def test_watch_turns_a_straggler_into_event_notification_and_capped_exclusion():
    watchdog = SimpleNamespace(straggler_threshold=1.2, straggler_seconds=3.0, straggler_exclude=True,
                               max_excluded_per_incident=2)  # fmt: skip
    watch = StragglerWatch(watchdog)
    state = SimpleNamespace(stragglers={})
    job = SimpleNamespace(job_id="7", nodes=["n1", "n2", "n3", "n4"])

    def node_of(rank, host, job):
        return job.nodes[rank]

    actions = []
    for step in range(1, 9):  # rounds 3..8 are scored; rank 2 (n3) 2 s instead of 1 s
        beats = [beat(r, step, 2.0 if r == 2 else 1.0) for r in range(4)] + [beat(0, 99, 9.0, job="6")]
        actions += on_pass(watch, state, job, beats, float(step), node_of)
    # Slow from t=3; 3 s later (t=6) and 4 slow rounds: flagged at step 6.
    kinds = [type(a).__name__ for a in actions]
    assert kinds == ["Record", "Notify", "Exclude"], actions
    record, notice, exclude = actions
    assert isinstance(record, Record) and record.event.KIND == "straggler" and record.event.node == "n3"
    assert record.event.step == 6 and record.event.vs_median == 2.0
    assert isinstance(notice, Notify) and notice.kind == "straggler" and "n3" in notice.message
    assert isinstance(exclude, Exclude) and exclude.nodes == ("n3",) and "straggler" in exclude.reason
    assert state.stragglers["nodes"]["n3"]["straggler"] and state.stragglers["job_id"] == "7"

    # A controller restarted during the job: the flagged node is not announced a second time.
    again = StragglerWatch(watchdog)
    repeats = []
    for step in range(9, 20):
        beats = [beat(r, step, 2.0 if r == 2 else 1.0) for r in range(4)]
        repeats += on_pass(again, state, job, beats, float(step), node_of)
    assert repeats == [] and state.stragglers["nodes"]["n3"]["straggler"]

    watchdog.max_excluded_per_incident = 0  # the cap: an exclusion_capped record instead
    state = SimpleNamespace(stragglers={})
    watch = StragglerWatch(watchdog)
    actions = []
    for step in range(1, 9):
        actions += on_pass(watch, state, job, [beat(r, step, 2.0 if r == 2 else 1.0) for r in range(4)],
                           float(step), node_of)  # fmt: skip
    assert [a.event.KIND for a in actions if isinstance(a, Record)] == ["straggler", "exclusion_capped"]


def test_no_round_while_any_rank_saves_or_from_malformed_beats():
    from orchestrator.controller.stragglers import samples_from_beats

    def node_of(rank, host):
        return f"n{rank}"

    beats = [beat(r, 5, 1.0) for r in range(4)]
    assert len(samples_from_beats(parsed(beats), "7", node_of)[1]) == 4
    saving = [*beats[:3], {**beats[3], "phase": "checkpoint"}]
    assert samples_from_beats(parsed(saving), "7", node_of)[1] == []
    forged = [*beats[:3], {**beats[3], "compute_seconds": float("nan"), "compute_step": 5}]
    assert samples_from_beats(parsed(forged), "7", node_of)[1] == []
    requeued = [{**b, "restart_count": 1} for b in beats[:2]] + beats[2:]  # old incarnation's beats dropped
    key, samples = samples_from_beats(parsed(requeued), "7", node_of)
    assert key == ("7", (1, 0)) and [s.rank for s in samples] == [0, 1]
    relaunched = [{**b, "launch": 2} for b in beats[1:]] + beats[:1]  # a spare took over inside the job
    key, samples = samples_from_beats(parsed(relaunched), "7", node_of)
    assert key == ("7", (0, 2)) and [s.rank for s in samples] == [1, 2, 3]


def test_no_samples_until_every_rank_is_past_the_last_round_of_that_incarnation():
    from orchestrator.controller.stragglers import samples_from_beats

    def node_of(rank, host):
        return f"n{rank}"

    at_5 = [beat(r, 5, 1.0) for r in range(4)]
    half_at_6 = [beat(r, 6 if r < 2 else 5, 1.0) for r in range(4)]  # ranks 2, 3 still report step 5
    all_at_6 = [beat(r, 6, 1.0) for r in range(4)]
    last = (("7", (0, 0)), 5)  # the last round was step 5 of this incarnation
    assert samples_from_beats(parsed(at_5), "7", node_of, last_round=last)[1] == []
    assert samples_from_beats(parsed(half_at_6), "7", node_of, last_round=last)[1] == []
    assert [s.step for s in samples_from_beats(parsed(all_at_6), "7", node_of, last_round=last)[1]] == [6] * 4
    requeued = [{**b, "restart_count": 1} for b in at_5]  # a new incarnation: its first round is due
    assert len(samples_from_beats(parsed(requeued), "7", node_of, last_round=last)[1]) == 4
