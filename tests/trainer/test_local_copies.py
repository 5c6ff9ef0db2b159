"""Node-local and buddy copies of checkpoints (`checkpoint.local_dir`), as real ranks (gloo on CPU):
2 emulated nodes x 2 ranks (tp=2 x pp=2), async saves every 2 steps, a stop at step 4.

- Relaunch inside the same job with node 1 replaced by node 2: ranks 0-1 load their own copies,
  ranks 2-3 fetch node 1's files from its buddy (node 0); 0 bytes come from the shared checkpoint,
  and steps 5-8 have bitwise the losses of the same relaunch restored from the shared copy.
- Node 2 replaced by node 3, with one byte flipped in node 0's replica of node 2's files: the fetched copy fails its sha256, is dropped and named
  in the beat's dropped_copies, the shared file is read instead, the probe matches bitwise, no NaN.
"""

from __future__ import annotations

import json
import math
import shutil

from orchestrator.contract import ExitCode, RunPaths, read_heartbeats
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir
from trainer.local_copies import buddy_nodes, buddy_ranks, run_key

TP2_PP2 = {"parallel": {"tp": 2, "pp": 2}, "cluster": {"gpus_per_node": 2, "nodes": 2}}
REPLACED = {2: {"SLURMD_NODENAME": "localnode2"}, 3: {"SLURMD_NODENAME": "localnode2"}}


def losses(run_dir, steps):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r["loss"] for r in records}  # the last record of a step wins (the relaunch's)
    return [by_step[s] for s in steps]


def rank0_beat(run_dir):
    return next(b for b in read_heartbeats(RunPaths.of(run_dir).heartbeats) if b.rank == 0)


def test_relaunch_restores_from_local_and_buddy_copies_and_survives_a_corrupt_replica(tmp_path):
    shm = tmp_path / "shm"
    run = make_run_dir(tmp_path / "run", **TP2_PP2, checkpoint={
        "interval_steps": 2, "keep_last": 3, "async_save": True, "local_dir": str(shm)})
    codes = launch_local.run(run, 4, {"TRAINER_STOP_AFTER_STEPS": "4"}, timeout=240, job_id="J1", nnodes=2)
    assert codes == [ExitCode.TIME_BUDGET] * 4, launch_local.read_log(run)
    # the same state, another run directory: its local copies are not found (another run's key):
    # the shared-filesystem restore as a job-level restart does it
    reference = shutil.copytree(run, tmp_path / "reference")
    both = launch_local.start(run, 4, {"TRAINER_MAX_STEPS": "8"}, job_id="J1", nnodes=2, rank_extra=REPLACED)
    both += launch_local.start(reference, 4, {"TRAINER_MAX_STEPS": "8"}, job_id="J1", nnodes=2)
    assert launch_local.wait(both, 300) == [ExitCode.FINISHED] * 8, launch_local.read_log(run)

    log = "".join(launch_local.read_log(run, r) for r in range(4))
    assert "[restore rank 2] read rng/rank-00002.pt from peer" in log, log[-3000:]
    assert "[restore rank 1] read rng/rank-00001.pt from local" in log
    beat = rank0_beat(run)
    print("restore bytes", beat.restore_bytes, "start phases", beat.start_phases)
    assert beat.restore_bytes["shared"] == 0 and beat.restore_bytes["local"] > 0 and beat.restore_bytes["peer"] > 0
    assert beat.dropped_copies == [] and beat.resumed_from == 4
    assert {"rendezvous", "copies_fetched_checked", "load_and_probe"} <= set(beat.start_phases)
    assert "resumed from step_0000004" in launch_local.read_log(reference)
    assert rank0_beat(reference).restore_bytes == {}  # the shared path
    ours, theirs = losses(run, range(5, 9)), losses(reference, range(5, 9))
    print("losses local/peer restore", ours, "shared restore", theirs,
          "max |diff|", max(abs(a - b) for a, b in zip(ours, theirs, strict=True)))
    assert ours == theirs  # bitwise

    # node 2 is lost in turn; one byte flipped in node 0's buddy replica of its files of step 8
    replica = sorted((shm / run_key(run) / "J1" / "localnode0" / "step_0000008" / "peer").glob("bf16_zero_*"))[0]
    data = bytearray(replica.read_bytes())
    data[len(data) // 2] ^= 0x01
    replica.write_bytes(bytes(data))
    again = {2: {"SLURMD_NODENAME": "localnode3"}, 3: {"SLURMD_NODENAME": "localnode3"}}  # node 2 lost now
    codes = launch_local.run(run, 4, {"TRAINER_MAX_STEPS": "10"}, timeout=240, job_id="J1", nnodes=2,
                             rank_extra=again)
    assert codes == [ExitCode.FINISHED] * 4, launch_local.read_log(run)
    beat = rank0_beat(run)
    print("corrupt replica: dropped", beat.dropped_copies, "bytes", beat.restore_bytes)
    assert len(beat.dropped_copies) == 1 and replica.name in beat.dropped_copies[0]
    assert "localnode0's copy" in beat.dropped_copies[0]
    assert beat.restore_bytes["shared"] == len(data)  # that one file, from the next copy in order
    assert "probe of step_0000008: bitwise, match" in launch_local.read_log(run)
    assert all(math.isfinite(x) for x in losses(run, range(9, 11)))


def test_buddies_are_other_nodes_in_other_failure_domains():
    nodes = ["n1", "n2", "n3", "n4"]
    assert buddy_nodes(nodes) == {"n1": "n2", "n2": "n3", "n3": "n4", "n4": "n1"}
    assert buddy_nodes(nodes, offset=2) == {"n1": "n3", "n2": "n4", "n3": "n1", "n4": "n2"}
    # n1 and n2 share a switch, n3 and n4 another: every buddy is across
    apart = buddy_nodes(nodes, failure_domains=[["n1", "n2"], ["n3", "n4"]])
    assert apart == {"n1": "n3", "n2": "n3", "n3": "n1", "n4": "n1"}
    assert buddy_nodes(["n1"]) == {}
    # one domain only: still another node, never itself
    assert buddy_nodes(["n1", "n2"], offset=2, failure_domains=[["n1", "n2"]]) == {"n1": "n2", "n2": "n1"}
    assert buddy_ranks(["a", "a", "b", "b"]) == {0: 2, 1: 3, 2: 0, 3: 1}
