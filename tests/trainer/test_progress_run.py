"""`python -m trainer` as 2 ranks on one host (gloo): the fine progress the controller sees, read from the
node's one heartbeat file while the run trains and saves."""

from __future__ import annotations

import os
import time
from collections import defaultdict

from orchestrator.contract import RunPaths, read_heartbeats
from orchestrator.contract.client.node_beats import NodeLocalBeats
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir

MICRO_BATCH, GLOBAL_BATCH, DP = 2, 8, 2
MICRO_BATCHES = GLOBAL_BATCH // (MICRO_BATCH * DP)  # per rank and step: 2


def test_two_ranks_report_micro_batches_and_save_bytes_in_one_node_file(tmp_path):
    run = make_run_dir(tmp_path / "run", cluster={"gpus_per_node": DP}, watchdog={"heartbeat_seconds": 0.3},
                       parallel={"micro_batch_size": MICRO_BATCH, "global_batch_size": GLOBAL_BATCH},
                       checkpoint={"interval_steps": 2})
    paths = RunPaths.of(run)
    # slowmicro: busy CPU before each forward and backward of steps 1-3, slowsave: a pause after each
    # chunk written in step 2's save: both long enough to be seen between two beats. A rank's state
    # reaches the node file in two samplings (its own beat into /dev/shm, then local rank 0's gather),
    # and a step has one window whose last unit is a backward (the second backward is followed at once
    # by the optimizer): 0.6 s of CPU makes that window twice a beat (with 0.2 s, CI under load saw
    # no backward from rank 1 in 3 steps).
    procs = launch_local.start(run, 2, {"TRAINER_MAX_STEPS": "3", "TRAINER_FAULT": "slowmicro@step1,slowsave@step2",
                                        "TRAINER_SLOW_MICRO_SECONDS": "0.6", "TRAINER_SLOW_SAVE_CHUNK_SECONDS": "0.03"})
    seen: dict[int, list[tuple[int, str, int, str]]] = defaultdict(list)  # rank -> (step, phase, count, unit)
    names: set[str] = set()
    deadline = time.time() + 240
    while time.time() < deadline and any(p.poll() is None for p in procs):
        if paths.heartbeats.is_dir():
            names.update(n for n in os.listdir(paths.heartbeats) if not n.startswith("."))  # not a temporary
        for beat in read_heartbeats(paths.heartbeats):
            entry = (beat.step, beat.phase.value, beat.progress_count, beat.progress_unit)
            if not seen[beat.rank] or seen[beat.rank][-1] != entry:
                seen[beat.rank].append(entry)
        time.sleep(0.02)
    assert launch_local.wait(procs, 30) == [0, 0], launch_local.read_log(run, 0)[-3000:]
    for rank, entries in seen.items():
        print(f"rank {rank}: {len(entries)} distinct beats, e.g. {entries[::max(1, len(entries) // 12)]}")

    host = os.uname().nodename
    assert names == {f"node-{host}.json"}  # one file for the node, never a rank file
    assert sorted(b.rank for b in read_heartbeats(paths.heartbeats)) == [0, 1]
    assert not NodeLocalBeats("local-test", 0, 0, host).path.exists()  # local rank 0 cleaned /dev/shm
    for rank in (0, 1):
        entries = seen[rank]
        units = {unit for _, _, _, unit in entries}
        assert {"forward", "backward", "optimizer"} <= units, (rank, units)
        # Within one step, the count moves with the micro-batches (more than one value per step).
        mid_step = defaultdict(set)
        for step, phase, count, unit in entries:
            if phase == "step" and unit in ("forward", "backward"):
                mid_step[step].add(count)
        assert max(len(counts) for counts in mid_step.values()) >= 2, (rank, dict(mid_step))
        # A whole step is at least a forward and a backward per micro-batch of this rank.
        first_of = {}
        for step, phase, count, _ in entries:
            if phase == "step":
                first_of.setdefault(step, count)
        print(f"rank {rank}: count at the first beat of each step {first_of}")
        assert first_of[2] - first_of[1] >= 2 * MICRO_BATCHES
        # The save of step 2: its bytes move, beat after beat.
        saving = {count for step, phase, count, unit in entries if phase == "checkpoint" and unit == "save_bytes"}
        assert len(saving) >= 3, (rank, sorted(saving))
