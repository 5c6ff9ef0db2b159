"""Node-local and buddy copies of checkpoints (`checkpoint.local_dir`), as real ranks (gloo on CPU):
2 emulated nodes x 2 ranks (pp=2 x dp=2: each node one pipeline stage, its two data-parallel
replicas each with its ZeRO-1 shard; tp=2 x pp=2 is the real-SLURM drill's, test_e2e_slurm_2411.py),
async saves every 2 steps, a stop at step 4.

- Relaunch inside the same job with node 1 replaced by node 2, from the warm standby
  (trainer/standby.py, as the job launcher runs it: the test writes the allocation record and the
  go file): node 0's tasks build their stage's model before the go (trainer/prepared_start.py),
  the spare's build after it; ranks 0-1 load their own copies, ranks 2-3 fetch node 1's files
  (both shards) from its buddy (node 0); 0 bytes come from the shared checkpoint, and steps 5-8
  have bitwise the losses of the same relaunch started cold and restored from the shared copy.
- Node 2 replaced by node 3, with one byte flipped in node 0's replica of node 2's files: the fetched copy fails its sha256, is dropped and named
  in the beat's dropped_copies, the shared file is read instead, the probe matches bitwise, no NaN.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

from orchestrator.contract import ExitCode, RunPaths, read_heartbeats
from orchestrator.contract.allocation import Allocation, StandbyGo, write_allocation, write_standby_go
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir
from trainer.local_copies import buddy_nodes, buddy_ranks, run_key
from trainer.standby import ready_dir

PP2_DP2 = {"parallel": {"tp": 1, "pp": 2}, "cluster": {"gpus_per_node": 2, "nodes": 2}}
JOB = "4101"  # a SLURM job id: the allocation record refuses any other
REPLACED = {2: {"SLURMD_NODENAME": "localnode2"}, 3: {"SLURMD_NODENAME": "localnode2"}}


def losses(run_dir, steps):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r["loss"] for r in records}  # the last record of a step wins (the relaunch's)
    return [by_step[s] for s in steps]


def rank0_beat(run_dir):
    return next(b for b in read_heartbeats(RunPaths.of(run_dir).heartbeats) if b.rank == 0)


def go_when_warm(run, standby, go: StandbyGo, timeout: float = 240) -> None:
    """Write the go file once every standby task is warm (what the launcher does after a decision)."""
    paths = RunPaths.of(run)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = ready_dir(paths.standby_go(JOB, go.launch))
        if ready.is_dir() and len(list(ready.iterdir())) == len(standby):
            write_standby_go(paths.standby_go(JOB, go.launch), go)
            return
        if any(proc.poll() is not None for proc in standby):
            break
        time.sleep(0.2)
    raise AssertionError(f"the standby never got warm: {launch_local.read_log(run)[-3000:]}")


def test_relaunch_restores_from_local_and_buddy_copies_and_survives_a_corrupt_replica(tmp_path):
    shm = tmp_path / "shm"
    run = make_run_dir(tmp_path / "run", **PP2_DP2, checkpoint={
        "interval_steps": 2, "keep_last": 3, "async_save": True, "local_dir": str(shm)})
    codes = launch_local.run(run, 4, {"TRAINER_STOP_AFTER_STEPS": "4"}, timeout=240, job_id=JOB, nnodes=2)
    assert codes == [ExitCode.TIME_BUDGET] * 4, launch_local.read_log(run)
    # the same state, another run directory: its local copies are not found (another run's key):
    # the shared-filesystem restore as a job-level restart does it
    reference = shutil.copytree(run, tmp_path / "reference")
    paths = RunPaths.of(run)
    paths.job_dir(JOB).mkdir(parents=True, exist_ok=True)
    write_allocation(paths.allocation(JOB), Allocation(JOB, "waiting_decision", 0, ["localnode0", "localnode1"],
                                                        ["localnode2"], waits_for_decisions=True))
    standby = launch_local.start(run, 4, {"TRAINER_MAX_STEPS": "8"}, job_id=JOB, nnodes=2, rank_extra=REPLACED,
                                 standby_go=paths.standby_go(JOB, 1))
    reference_ranks = launch_local.start(reference, 4, {"TRAINER_MAX_STEPS": "8"}, job_id=JOB, nnodes=2)
    go_when_warm(run, standby, StandbyGo(1, ("localnode0", "localnode2"), 2, "127.0.0.1", launch_local.free_port()))
    assert launch_local.wait(standby + reference_ranks, 300) == [ExitCode.FINISHED] * 8, launch_local.read_log(run)

    log = "".join(launch_local.read_log(run, r) for r in range(4))
    assert "[restore rank 2] read rng/rank-00002.pt from peer" in log, log[-3000:]
    assert "[restore rank 1] read rng/rank-00001.pt from local" in log
    # both data-parallel replicas of the lost stage: each ZeRO-1 shard from the buddy
    shards = {line.split(" read ")[1].split(" from ")[0] for line in log.splitlines()
              if line.startswith(("[restore rank 2]", "[restore rank 3]")) and "_optim_states.pt from peer" in line}
    assert len(shards) == 2, sorted(shards)
    assert launch_local.read_log(run).count("units built by the warm standby") == 1  # rank 0: its node kept its slot
    assert "units built by the warm standby" not in launch_local.read_log(run, 2)  # the spare's slot was unknown
    beat = rank0_beat(run)
    print("restore bytes", beat.restore_bytes, "start phases after the go", beat.start_phases)
    print("cold, shared restore: start phases", rank0_beat(reference).start_phases)
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
    replica = sorted((shm / run_key(run) / JOB / "localnode0" / "step_0000008" / "peer").glob("bf16_zero_*"))[0]
    data = bytearray(replica.read_bytes())
    data[len(data) // 2] ^= 0x01
    replica.write_bytes(bytes(data))
    again = {2: {"SLURMD_NODENAME": "localnode3"}, 3: {"SLURMD_NODENAME": "localnode3"}}  # node 2 lost now
    codes = launch_local.run(run, 4, {"TRAINER_MAX_STEPS": "10"}, timeout=240, job_id=JOB, nnodes=2,
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


# -- chunked transfers over a real gloo group -------------------------------------------------------
CHUNK = 1000  # bytes: a file of 10.5 KB moves in 11 chunks
FILES = {"big.pt": 10_500, "exact.pt": 3_000, "empty.pt": 0, "halfway.pt": 4_200, "after.pt": 2_345}


class _CountedReads:
    """A source that records the size of every read; after `fail_after` reads, an I/O error (a
    sender that fails mid-file)."""

    def __init__(self, handle, sizes: list[int], fail_after: int | None = None) -> None:
        self.handle, self.sizes, self.fail_after, self.reads = handle, sizes, fail_after, 0

    def readinto(self, view) -> int:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise OSError("disk gone")
        self.reads += 1
        self.sizes.append(len(view))
        return self.handle.readinto(view)

    def seek(self, *args) -> int:
        return self.handle.seek(*args)

    def close(self) -> None:
        self.handle.close()


class _CountedWrites:
    def __init__(self, sink, sizes: list[int]) -> None:
        self.sink, self.sizes = sink, sizes

    def write(self, chunk) -> None:
        self.sizes.append(len(chunk))
        self.sink.write(chunk)

    def finish(self, complete: bool) -> None:
        self.sink.finish(complete)


def _transfer_ranks(rank: int, root: Path) -> None:
    """Three ranks, each holding its own bytes of every file of FILES; the same list on each."""
    from trainer.local_copies import OWN, PEER, LocalStore
    from trainer.peer_replica import Transfer, run_transfers, schedule_rounds

    store = LocalStore.of(root / "shm", root, "7", f"node{rank}").create()
    for rel, size in FILES.items():
        store.path(1, OWN, rel).parent.mkdir(parents=True, exist_ok=True)
        store.path(1, OWN, rel).write_bytes(bytes((rank * 7 + i) % 251 for i in range(size)))
    transfers = [Transfer(0, 1, "big.pt", FILES["big.pt"]),  # round 1: three files at once, a ring
                 Transfer(1, 2, "empty.pt", 0),
                 Transfer(2, 0, "gone.pt", 77),  # the sender has no such file: header -1
                 Transfer(0, 2, "halfway.pt", FILES["halfway.pt"]),  # round 2: the 4th read of 5 fails
                 Transfer(2, 1, "exact.pt", FILES["exact.pt"] + 1),  # not the manifest's size: -1
                 Transfer(1, 0, "exact.pt", FILES["exact.pt"]),  # a whole number of chunks
                 Transfer(2, 0, "after.pt", FILES["after.pt"])]  # round 3: the pairs are still in step
    assert [len(batch) for batch in schedule_rounds(transfers)] == [3, 3, 1]
    reads, writes = [], []

    def source(t):
        handle = store.open_held(1, OWN, t.rel)
        return handle and _CountedReads(handle, reads, 3 if t.rel == "halfway.pt" else None)

    received = run_transfers(transfers, None, source,
                             lambda t: _CountedWrites(store.incoming(1, PEER, t.rel), writes), chunk_bytes=CHUNK)
    (root / f"rank{rank}.json").write_text(json.dumps({"received": received, "reads": reads, "writes": writes}))


def _gloo_rank(rank: int, world: int, port: int, root: str) -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # a transfer that loses step hangs in a receive: the group's timeout fails the test instead
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    try:
        _transfer_ranks(rank, Path(root))
    finally:
        dist.destroy_process_group()


def test_transfers_move_files_in_chunks_a_rank_holds_at_most_one_of(tmp_path):
    import torch.multiprocessing as mp

    # forked, not spawned: the ranks compute nothing and need no fresh interpreter (1.3 s, not 3.9 s)
    mp.start_processes(_gloo_rank, args=(3, launch_local.free_port(), str(tmp_path)), nprocs=3,
                       start_method="fork")
    step = tmp_path / "shm" / run_key(tmp_path) / "7"

    def held(node: int, kind: str, rel: str) -> Path:
        return step / f"node{node}" / "step_0000001" / kind / rel

    report = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert report[1]["writes"] == [CHUNK] * 10 + [500]  # big.pt, chunk by chunk
    assert report[0]["writes"] == [CHUNK] * 3 + [CHUNK, CHUNK, 345]  # exact.pt, then after.pt
    # no read or write of more than a chunk, whatever the file's size: the buffers run_transfers
    # holds are those chunks (two a side)
    assert max(n for r in report for n in r["reads"] + r["writes"]) == CHUNK
    assert [r["received"] for r in report] == [FILES["exact.pt"] + FILES["after.pt"], FILES["big.pt"], 0]
    for node, rel, sender in ((1, "big.pt", 0), (2, "empty.pt", 1), (0, "exact.pt", 1), (0, "after.pt", 2)):
        assert held(node, "peer", rel).read_bytes() == held(sender, "own", rel).read_bytes(), (node, rel)
    assert held(2, "peer", "empty.pt").stat().st_size == 0
    assert not held(0, "peer", "gone.pt").exists() and not held(1, "peer", "exact.pt").exists()
    # 3 of 5 chunks arrived: dropped, never kept half, and no temporary file left behind
    assert sorted(p.name for p in held(2, "peer", "").iterdir()) == ["empty.pt"]
