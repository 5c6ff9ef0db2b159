"""Asking a silent node (controller/probe.py, probing.py) and what detection makes of the answer:
pure rules over plain data, and the probe script run here against real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from fakes import make_config
from test_detection import DEAD_AFTER, SILENT_AFTER, beat, timeouts

from orchestrator.controller import probe
from orchestrator.controller.detection import assess
from orchestrator.controller.liveness import Liveness
from orchestrator.controller.probe import ProbeReport, ProcState, Verdict
from orchestrator.controller.probing import NodeProber
from tests.pass_views import job_view


def test_verdicts_from_what_the_node_says():
    ok = lambda *states: ProbeReport("node02", True, dict(enumerate(states)), True)  # noqa: E731
    assert probe.verdict(ProbeReport("node02", False))[0] is Verdict.LOST
    assert probe.verdict(ok(ProcState.STOPPED, ProcState.STOPPED))[0] is Verdict.DEAD
    assert probe.verdict(ok(ProcState.RUNNING))[0] is Verdict.DEAD, "running with its beats gone"
    assert probe.verdict(ok(ProcState.DISK, ProcState.RUNNING))[0] is Verdict.STALL
    assert probe.verdict(ProbeReport("node02", True, {0: ProcState.RUNNING}, False))[0] is Verdict.STALL
    assert probe.verdict(ok(ProcState.GONE))[0] is Verdict.UNDECIDED
    assert probe.parse("node02", "rank 3 77 T\nnonsense\nfs stuck\n") == ProbeReport(
        "node02", True, {3: ProcState.STOPPED}, False
    )
    assert not probe.parse("node02", "rank 3 77 T\n").answered, "cut short before its last line: no answer"


def test_the_script_reads_real_process_states_and_quotes_the_path():
    running, stopped = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        time.sleep(0.2)
        text = probe.script({0: running.pid, 1: stopped.pid, 2: 4_000_000}, "/tmp/a b'; touch /tmp/x #", 2.0)
        out = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=20).stdout
        report = probe.parse("node01", out)
        assert report.ranks == {0: ProcState.RUNNING, 1: ProcState.STOPPED, 2: ProcState.GONE}, out
        assert report.fs_answers is True and probe.verdict(report)[0] is Verdict.DEAD
    finally:
        os.kill(stopped.pid, signal.SIGKILL)
        running.kill()


def _dead_at(probed, tolerance=10.0):
    """node02 silent as a whole in a save while its peers wait (today's rule: a storage stall, up to
    the tolerance); when is rank 1 dead, given what node02 answered."""
    live = Liveness(SILENT_AFTER)
    t = timeouts()
    for i in range(17):  # to 8 s: within the 10 s tolerance
        now = i * 0.5
        beats = [beat(r, min(i, 2) if r == 1 else i, marks=min(i, 2), phase="checkpoint") for r in range(4)]
        views = live.observe([[b] for b in beats], "7", now)
        a = assess(views, job_id="7", job_seen_at=live.job_seen_at, world_size=4, now=now, dead_after=DEAD_AFTER,
                   silent_after=SILENT_AFTER, timeouts=t, stall_tolerance=tolerance, probed=probed)  # fmt: skip
        if a.dead:
            return now, [f.rank for f in a.dead], a.silent_hosts
    return None, [], a.silent_hosts


def test_a_frozen_node_is_dead_at_dead_after_a_stalled_one_waits_a_lost_one_is_dead_now():
    when, ranks, silent = _dead_at({})
    assert when is None and silent == ["node02"], "today's rule: a whole node silent in a save is a stall"
    # Its last beat at 1.0 s: dead_after (1.5 s) is passed at the 3.0 s pass, silent_after at 1.5 s.
    assert _dead_at({"node02": Verdict.DEAD})[:2] == (3.0, [1])
    assert _dead_at({"node02": Verdict.STALL})[0] is None
    assert _dead_at({"node02": Verdict.STALL}, tolerance=1.0)[:2] == (3.0, [1]), "the tolerance still ends it"
    assert _dead_at({"node02": Verdict.LOST})[:2] == (1.5, [1])
    assert _dead_at({"node02": Verdict.UNDECIDED})[0] is None, "undecided: today's rule"


def silent(hosts: list[str], beats, quiet: list[str] = ()) -> object:
    """A pass of job 7 on 4 nodes (each rank's host is its node) in which `hosts` went silent
    (`quiet`: only quiet, an early answer's time)."""
    return job_view(beats=beats, silent_hosts=hosts, quiet_hosts=sorted({*hosts, *quiet}),
                    host_beat_age={f"node0{i}": 0.0 for i in range(1, 5)})


def test_each_silent_node_is_asked_once_per_incident():
    asked = []

    def ask(job, node, script, timeout):
        asked.append(node)
        return "rank 1 101 T\nfs ok\n"

    prober = NodeProber()
    beats = [beat(r, 1) for r in range(4)]
    for _ in range(3):
        actions = prober.on_pass(silent(["node02"], beats), ask)
    assert asked == ["node02"] and prober.verdicts("7") == {"node02": Verdict.DEAD} and actions == []
    prober.on_pass(silent([], beats), ask)  # it beats again: a new incident later
    event = prober.on_pass(silent(["node02"], beats), ask)[0].event
    assert asked == ["node02", "node02"] and event.verdict == "dead" and event.ranks == {"1": "stopped"}
    assert NodeProber().on_pass(silent(["node02"], beats), None) == []
    # Every node silent (the filesystem): nobody asked, and an earlier verdict no longer counts.
    assert prober.on_pass(silent([f"node0{i}" for i in range(1, 5)], beats), ask) == []
    assert asked == ["node02", "node02"] and prober.verdicts("7") == {}
    several = NodeProber().on_pass(silent(["node01", "node02", "node03"], beats), ask)
    assert len(several) == 2, "at most MAX_ASKED_PER_PASS a pass (the next pass asks the rest)"


def test_a_quiet_node_is_asked_early_and_asked_again_when_silent_unless_lost():
    """A node that missed a beat is asked at once: "lost" is final; any other early answer stands
    until the node, silent for silent_after, answers again, and that answer replaces it (a hiccup
    that became a storage stall is seen as one). Three passes silent after that: two asks in all."""
    answers = {"node02": ["rank 1 101 R\nfs ok\n", "rank 1 101 D\nfs stuck\n"], "node03": [None]}
    asked = []

    def ask(job, node, script, timeout):
        asked.append(node)
        return answers[node].pop(0)

    prober = NodeProber()
    beats = [beat(r, 1) for r in range(4)]
    early = prober.on_pass(silent([], beats, quiet=["node02", "node03"]), ask)
    assert [a.event.verdict for a in early] == ["dead", "lost"] and asked == ["node02", "node03"]
    assert prober.verdicts("7") == {"node02": Verdict.DEAD, "node03": Verdict.LOST}
    for _ in range(3):
        prober.on_pass(silent(["node02", "node03"], beats), ask)
    assert asked == ["node02", "node03", "node02"], "asked again once silent; lost is not asked again"
    assert prober.verdicts("7") == {"node02": Verdict.STALL, "node03": Verdict.LOST}


def test_a_probe_slurmctld_could_not_make_is_no_verdict_and_is_asked_again():
    """srun needs slurmctld to make the step: while it does not answer, a silent node is not
    'lost' (that would kill a node for the controller's outage), and nothing is remembered."""
    from orchestrator.errors import SchedulerError

    down = {"ctld": True}
    asked = []

    def ask(job, node, script, timeout):
        asked.append(node)
        if down["ctld"]:
            raise SchedulerError("slurmctld does not answer")
        return "rank 1 101 T\nfs ok\n"

    prober = NodeProber()
    beats = [beat(r, 1) for r in range(4)]
    assert prober.on_pass(silent(["node02", "node03"], beats), ask) == []
    assert prober.verdicts("7") == {} and asked == ["node02"], "no verdict, and no second srun into the outage"
    down["ctld"] = False
    [probed] = prober.on_pass(silent(["node02"], beats), ask)
    assert probed.event.verdict == "dead" and prober.verdicts("7") == {"node02": Verdict.DEAD}


def test_a_relaunchs_ranks_on_a_stalled_node_are_not_missing_until_the_stall_tolerance():
    """A node found in a storage stall keeps that verdict across a relaunch inside the job until
    one of its ranks beats again: the new launch's ranks there cannot write their first beat
    while the stall lasts, so they are missing only once the stall tolerance has passed too (the
    soak's false positive: a 10-minute node stall overlapping a relaunch, its 8 ranks 'missing'
    after the 3.6-minute init limit learned from the warm standby's start)."""
    prober = NodeProber()
    beats = [beat(r, 1) for r in range(4)]
    prober.on_pass(silent(["node02"], beats), lambda *a: "rank 1 101 D\nfs stuck\n")
    assert prober.stalled_nodes("7") == {"node02"}
    relaunched = [beat(r, 1) for r in (0, 2, 3)]  # node02's rank 1 has not beaten in the new launch
    on_disk = [*relaunched, beat(1, 1)]  # node02's beat file of the launch before is still there
    prober.on_pass(job_view(beats=on_disk, host_beat_age={"node01": 0.0, "node03": 0.0, "node04": 0.0}), None)
    assert prober.stalled_nodes("7") == {"node02"}, "kept while node02 has not beaten in this launch"

    def missing(stalled_ranks, now):
        live = Liveness(SILENT_AFTER)
        views = live.observe([[b] for b in relaunched], "7", now)  # the others beat; the launch began at 0
        a = assess(views, job_id="7", job_seen_at=0.0, world_size=4, now=now, dead_after=DEAD_AFTER,
                   silent_after=SILENT_AFTER, timeouts=timeouts(), stall_tolerance=100.0,
                   stalled_ranks=stalled_ranks)  # fmt: skip
        return [f.rank for f in a.dead]

    init_limit = timeouts().timeout("init")
    assert missing(frozenset(), init_limit + 1) == [1], "no stall known: missing at the init limit"
    assert missing(frozenset({1}), init_limit + 1) == [], "on the stalled node: not yet"
    assert missing(frozenset({1}), max(init_limit, 100.0) + 1) == [1], "the tolerance still ends it"
    prober.on_pass(job_view(beats=beats, host_beat_age={f"node0{i}": 0.0 for i in range(1, 5)}), None)
    assert prober.stalled_nodes("7") == set(), "node02 beats again: its stall is over"


def test_a_later_answer_replaces_an_early_stall():
    answers = ["rank 1 101 D request_wait_answer\nfs stuck\n", "rank 1 101 T\nfs ok\n"]
    prober, beats = NodeProber(), [beat(r, 1) for r in range(4)]
    [early] = prober.on_pass(silent([], beats, quiet=["node02"]), lambda *a: answers.pop(0))
    assert early.event.verdict == "stall" and "request_wait_answer" in early.event.why
    assert prober.stalled_nodes("7") == {"node02"}
    prober.on_pass(silent(["node02"], beats), lambda *a: answers.pop(0))
    assert prober.verdicts("7") == {"node02": Verdict.DEAD} and prober.stalled_nodes("7") == set()


def test_a_node_whose_ranks_never_beat_in_a_relaunch_is_asked_and_its_stall_waited_for():
    """A storage stall that begins at a relaunch: the node was never quiet (its ranks never beat
    in the new launch), so only the launch's others beating tells it apart. It is asked once, with
    no pids (its filesystem answers); found stalled, its ranks are not missing at the init limit,
    and when they beat the stall watch records the stall from when the others began to beat."""
    from orchestrator.controller.stalls import StallWatch

    def relaunch(rank, seq):
        return beat(rank, seq, restart_count=1)

    old = beat(1, 1)  # node02's beat file of the launch before is still there
    live, ask_after = Liveness(SILENT_AFTER), 2.0

    def at(now, beats, stalled=frozenset()):
        views = live.observe([[b] for b in beats], "7", now)
        return assess(views, job_id="7", job_seen_at=0.0, world_size=4, now=now, dead_after=DEAD_AFTER,
                      silent_after=SILENT_AFTER, timeouts=timeouts(), stall_tolerance=100.0, ask_after=ask_after,
                      stalled_ranks=stalled, first_beat_at=live.first_beat_at)  # fmt: skip

    others = [relaunch(r, 1) for r in (0, 2, 3)]
    assert at(1.0, [*others, old]).unseen_ranks == [], "the others began to beat only now"
    early = at(2.5, [relaunch(r, 2) for r in (0, 2, 3)] + [old])
    assert early.unseen_ranks == [1] and early.unseen_since == 1.0
    asked = []

    def ask(job, node, script, timeout):
        asked.append((node, script))
        return "fs stuck\n"

    def view(assessment, beats):
        node_of = lambda rank, host: host or f"node{rank + 1:02d}"  # noqa: E731
        return job_view(beats=beats, assessment=assessment, node_of=node_of, mono=2.5)

    prober = NodeProber()
    [probed] = prober.on_pass(view(early, [*others, old]), ask)
    assert [node for node, _ in asked] == ["node02"] and "/proc/" not in asked[0][1], "no pids to look at"
    assert probed.event.verdict == "stall" and probed.event.before_first_beat
    assert prober.stalled_nodes("7") == {"node02"} and prober.stalled_before_beating("7") == {"node02": 1.0}
    assert prober.on_pass(view(early, [*others, old]), ask) == [] and len(asked) == 1, "once per launch"
    init_limit = timeouts().timeout("init")
    still = [relaunch(r, 3) for r in (0, 2, 3)]
    assert at(init_limit + 1, still, stalled=frozenset({1})).dead == [], "stalled: not missing at the init limit"

    stalls = StallWatch(make_config().exclusions, heartbeat_seconds=0.1)
    stalls.on_pass(view(early, others), prober.stalled_before_beating("7"))
    everyone = [*[relaunch(r, 4) for r in (0, 2, 3)], relaunch(1, 1)]
    back = at(init_limit + 2, everyone, stalled=frozenset({1}))
    assert back.unseen_ranks == [] and back.dead == []
    prober.on_pass(view(back, everyone), ask)
    assert prober.stalled_nodes("7") == set() and prober.stalled_before_beating("7") == {}
    [recorded] = stalls.on_pass(job_view(beats=everyone, assessment=back, mono=init_limit + 2))
    assert recorded.event.node == "node02" and recorded.event.seconds == init_limit + 1


def test_a_node_whose_ranks_never_beat_and_whose_storage_answers_is_missing_at_the_init_limit():
    live = Liveness(SILENT_AFTER)

    def at(now, seq):
        views = live.observe([[beat(r, seq)] for r in (0, 2, 3)], "7", now)
        return assess(views, job_id="7", job_seen_at=0.0, world_size=4, now=now, dead_after=DEAD_AFTER,
                      silent_after=SILENT_AFTER, timeouts=timeouts(), ask_after=2.0,
                      first_beat_at=live.first_beat_at)  # fmt: skip

    at(0.0, 1)
    a = at(3.0, 2)
    prober, node_of = NodeProber(), lambda rank, host: host or f"node{rank + 1:02d}"
    [probed] = prober.on_pass(job_view(beats=[beat(r, 2) for r in (0, 2, 3)], assessment=a, node_of=node_of),
                              lambda *args: "fs ok\n")  # fmt: skip
    assert probed.event.node == "node02" and probed.event.verdict == "undecided"
    assert "filesystem answers" in probed.event.why and prober.stalled_nodes("7") == set()
    init_limit = timeouts().timeout("init")
    assert [f.rank for f in at(init_limit + 1, 3).dead] == [1], "no stall: missing at the init limit"


def test_a_rank_is_placed_on_its_launchs_node_not_one_off_in_slurms_shrunk_list():
    """A rank with no beat (missing, or on a stalled node) is placed by index: on the launch's own
    nodes in rank order (allocation.json), not on SLURM's list of the job's nodes, which lost a
    failed node (the soak's false positive: the stall verdict of node017 protected node016's ranks,
    and node017's were declared missing)."""
    from orchestrator.contract.state import JobRecord
    from orchestrator.controller.jobs import RankNodes

    job = JobRecord("7", 0.0, state="running")
    job.nodes = ["n01", "n03", "n04"]  # n02 failed and left the job
    nodes = RankNodes(gpus_per_node=8)
    assert nodes.node_of(16, "", job) == "n04", "without the launcher's record: SLURM's list"
    nodes.learn_launch("7", ["n01", "n02", "n03"])
    assert [nodes.node_of(r, "", job) for r in (0, 8, 16)] == ["n01", "n02", "n03"]
    assert nodes.node_of(16, "n02", job) == "n02", "a beat's host that is one of the launch's nodes is its node"
    other = JobRecord("8", 0.0, state="running")
    other.nodes = ["m01", "m02", "m03"]
    assert nodes.node_of(16, "", other) == "m03", "another job's launch record does not apply"
