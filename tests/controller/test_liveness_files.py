"""Liveness skips the heartbeat files that did not change since its last pass (the reader hands
back the same list for them). That must change nothing it concludes: the oracle is a second
Liveness fed the same beats with no file left out (each beat in a list of its own, new every
pass: every file looked at, as before the skip). Both run over real node files written to disk
and read by the real reader, through random passes where nodes beat or go quiet, ranks freeze,
progress moves or stops, the job is relaunched or requeued, the controller expects a new
incarnation, and the job changes; the views, the incarnation, the job's first sighting and the
assessment must agree after every pass."""

from __future__ import annotations

import random

import pytest
from fakes import make_config

from orchestrator.contract import Heartbeat, HeartbeatReader, NodeBeat, Phase, write_node_beat
from orchestrator.controller.detection import assess
from orchestrator.controller.liveness import Liveness
from orchestrator.controller.timeouts import PhaseTimeouts

NODES, PER_NODE = 4, 2
SILENT_AFTER, DEAD_AFTER = 0.4, 1.5  # seconds; a pass every 0.1-0.6 s


class Cluster:
    """What the nodes write: per rank its seq and marks (and a longest gap between marks that
    grows with them: what the controller learns must follow), per node its incarnation and job."""

    def __init__(self, directory, rng: random.Random):
        self.directory, self.rng = directory, rng
        self.job, self.restart_count, self.launch = "7", 0, 0
        self.seq = {r: 1 for r in range(NODES * PER_NODE)}
        self.marks = {r: 0 for r in range(NODES * PER_NODE)}
        self.frozen: set[int] = set()  # ranks whose entry stops moving (a dead peer)

    def beat(self, rank: int, host: str) -> Heartbeat:
        return Heartbeat(rank, NODES * PER_NODE, host, self.job, 100 + rank, 5 + self.marks[rank] // 10,
                         Phase.STEP, 1000.0 + self.seq[rank], 990.0, 900.0, restart_count=self.restart_count,
                         launch=self.launch, seq=self.seq[rank], progress_count=self.marks[rank],
                         progress_unit="backward", mark_gaps={"step": 0.01 * (1 + self.marks[rank])})  # fmt: skip

    def write(self, node: int) -> None:
        host = f"node{node:02d}"
        ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
        for rank in ranks:
            if rank not in self.frozen:
                self.seq[rank] += 1
                if self.rng.random() < 0.7:  # progress moves, or it beats without a mark
                    self.marks[rank] += 1
        beats = [self.beat(rank, host) for rank in ranks]
        write_node_beat(self.directory, NodeBeat(host, self.job, NODES * PER_NODE, self.restart_count,
                                                 self.launch, beats), durable=False)  # fmt: skip


def state(live: Liveness) -> dict:
    return {
        "incarnation": live.incarnation,
        "job_seen_at": live.job_seen_at,
        "views": {
            rank: (view.beat.to_dict(), view.beat_changed, view.progress_changed, view.progress_seen)
            for rank, view in live.ranks.items()
        },
    }


def findings(live: Liveness, views, now: float, timeouts: PhaseTimeouts):
    result = assess(views, job_id=live.job_id, job_seen_at=live.job_seen_at, world_size=NODES * PER_NODE,
                    now=now, dead_after=DEAD_AFTER, silent_after=SILENT_AFTER, timeouts=timeouts,
                    stall_tolerance=3.0)  # fmt: skip
    return sorted((f.kind.value, f.rank) for f in result.findings), sorted(f.rank for f in result.suspects)


@pytest.mark.parametrize("seed", range(12))
def test_skipping_unchanged_files_concludes_what_looking_at_every_file_does(tmp_path, seed):
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, rng)
    for node in range(NODES):
        cluster.write(node)
    reader = HeartbeatReader(tmp_path)
    skipping, every_file = Liveness(SILENT_AFTER), Liveness(SILENT_AFTER)
    limits = {id(skipping): PhaseTimeouts.from_watchdog(make_config().watchdog),
              id(every_file): PhaseTimeouts.from_watchdog(make_config().watchdog)}  # fmt: skip
    quiet: set[int] = set()  # nodes that stopped writing (a stall, a lost node, a dead gatherer)
    now, skipped, silent_returns, previous = 0.0, 0, 0, {}
    for step in range(120):
        now += rng.choice((0.1, 0.1, 0.2, 0.6))
        roll = rng.random()
        if roll < 0.08:
            quiet.add(rng.randrange(NODES))
        elif roll < 0.2 and quiet:
            quiet.discard(rng.choice(sorted(quiet)))  # back from its silence
        elif roll < 0.25:
            cluster.frozen ^= {rng.randrange(NODES * PER_NODE)}
        elif roll < 0.28:  # a relaunch on a spare (or a requeue): every node's files change incarnation
            if rng.random() < 0.5:
                cluster.launch += 1
            else:
                cluster.restart_count, cluster.launch = cluster.restart_count + 1, 0
        elif roll < 0.30:  # the controller decided a relaunch: before the ranks of it beat, or after
            after = cluster.launch - rng.choice((0, 1))
            for live in (skipping, every_file):
                live.expect_new_incarnation(after_launch=after)
        elif roll < 0.31:  # a new job id (the old job ended, the next one started)
            cluster.job = str(int(cluster.job) + 1)
        elif roll < 0.33:  # a pass that looked at another job (files unchanged meanwhile)
            for live in (skipping, every_file):
                live.observe(reader.read_files(), "999", now - 0.05)
        for node in range(NODES):
            if node not in quiet and rng.random() < 0.8:  # a node beats most passes, not every one
                cluster.write(node)
        files = reader.read_files()
        flat = [beat for file_beats in files for beat in file_beats]
        skipping.observe(files, cluster.job, now)
        limits[id(skipping)].learn(skipping.gaps_changed)
        every_file.observe([[beat] for beat in flat], cluster.job, now)
        limits[id(every_file)].learn(every_file.ranks.values())  # every rank's gaps, changed or not
        assert state(skipping) == state(every_file), f"pass {step} at {now:.1f} s"
        assert findings(skipping, skipping.ranks, now, limits[id(skipping)]) == findings(
            every_file, every_file.ranks, now, limits[id(every_file)]
        ), f"pass {step} at {now:.1f} s"
        assert limits[id(skipping)].longest_gap == limits[id(every_file)].longest_gap
        skipped += sum(1 for file_beats in files if id(file_beats) in previous)
        previous = {id(file_beats): file_beats for file_beats in files}  # held: no id is reused
        # Back from silence: its progress timer started again, not on a mark seen as it happened.
        silent_returns += sum(1 for v in skipping.ranks.values() if v.progress_changed == now > v.progress_seen)
    # The walk went where it matters: files were skipped, and ranks came back from silence.
    assert skipped > 50 and silent_returns > 0, (skipped, silent_returns)
