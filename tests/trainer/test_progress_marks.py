"""Fine progress (orchestrator/contract/client/progress.py, progress_io.py) and the node heartbeat file (orchestrator/contract/client/node_beats.py),
in process: the counter, bytes counted as torch moves them, local rank 0 gathering its node."""

from __future__ import annotations

import os
import stat
import time

import pytest
import torch

from orchestrator.contract import Mark, Phase, RunPaths, read_heartbeats
from orchestrator.contract.client.beat import HeartbeatWriter
from orchestrator.contract.client.node_beats import NodeLocalBeats
from orchestrator.contract.client.progress import COUNTER, ProgressCounter, waiting
from orchestrator.contract.filemodes import NotPrivateError
from trainer.progress_io import CountingReader, CountingWriter


def test_counter_counts_marks_and_keeps_the_longest_gap_per_phase_but_not_waits():
    counter = ProgressCounter()
    counter.begin_phase(Phase.STEP)
    started = time.monotonic()
    counter.mark(Mark.FORWARD)
    time.sleep(0.05)
    counter.mark(Mark.BACKWARD)
    worked = time.monotonic() - started
    counter.mark(Mark.WAIT)
    time.sleep(0.2)  # waiting for peers: their time, not a gap of this rank's
    counter.mark(Mark.REDUCE)
    assert counter.count == 5 and counter.unit_name == "reduce"
    print(f"step gap {counter.gaps['step']:.3f}s, the work took {worked:.3f}s, the wait 0.2s")
    assert 0.05 <= counter.gaps["step"] <= worked
    counter.begin_phase(Phase.CHECKPOINT)
    assert set(counter.gaps) == {"init", "step"}  # the gap up to a phase's start is the old phase's
    time.sleep(0.03)
    counter.mark(Mark.SAVE_BYTES)
    assert counter.gaps["checkpoint"] >= 0.03 and counter.gaps["step"] < 0.2


def test_a_wait_ends_with_a_mark_of_the_work_it_interrupted():
    COUNTER.mark(Mark.SAVE_BYTES)
    before = COUNTER.count
    with waiting():
        assert COUNTER.unit is Mark.WAIT
    assert COUNTER.unit is Mark.SAVE_BYTES and COUNTER.count == before + 2


def test_a_wait_inside_a_wait_is_the_same_wait():
    COUNTER.mark(Mark.SAVE_BYTES)
    before = COUNTER.count
    with waiting():
        with waiting():  # e.g. DeepSpeed's barrier inside our own
            pass
        assert COUNTER.unit is Mark.WAIT, "the outer wait goes on"
    assert COUNTER.unit is Mark.SAVE_BYTES and COUNTER.count == before + 2


def test_pipeline_sends_and_receives_and_deepspeed_collectives_are_waits(monkeypatch):
    """The real schedule's instruction classes and DeepSpeed's own `deepspeed.comm.barrier` path, with
    the instructions' and the backend's bodies replaced by probes that record the unit the beat would
    report while they run."""
    from deepspeed.comm import comm
    from deepspeed.runtime.pipe import schedule

    from trainer.engine import install_collective_waits, install_progress_marks

    seen: dict[str, str] = {}

    def probe(name):
        return lambda engine, *args, **kwargs: seen.__setitem__(name, COUNTER.unit_name)

    class Engine:  # what install_progress_marks touches of a PipelineEngine
        _INSTRUCTION_MAP = {cls: probe(cls.__name__) for cls in (
            schedule.OptimizerStep, schedule.ReduceGrads, schedule.ReduceTiedGrads, schedule.LoadMicroBatch,
            schedule.ForwardPass, schedule.BackwardPass, schedule.SendActivation, schedule.RecvActivation,
            schedule.SendGrad, schedule.RecvGrad)}
        module = torch.nn.Linear(1, 1)

    engine = Engine()
    install_progress_marks(engine)
    table = engine._INSTRUCTION_MAP
    table[schedule.ForwardPass](engine)
    assert COUNTER.unit is Mark.FORWARD
    for p2p in (schedule.RecvActivation, schedule.SendActivation, schedule.RecvGrad, schedule.SendGrad):
        table[p2p](engine)
        assert seen[p2p.__name__] == "wait", (p2p.__name__, seen)
        assert COUNTER.unit is Mark.FORWARD, "the unit the wait interrupted comes back"
    table[schedule.BackwardPass](engine)
    assert seen["BackwardPass"] == "forward" and COUNTER.unit is Mark.BACKWARD

    class Backend:  # deepspeed.comm's backend object (comm.cdb)
        def barrier(self, **kwargs):
            seen["barrier"] = COUNTER.unit_name

        def reduce_scatter_tensor(self, *args, **kwargs):  # ZeRO-1's gradient reduce
            seen["reduce_scatter_tensor"] = COUNTER.unit_name

        def all_gather_into_tensor(self, *args, **kwargs):  # ZeRO-1's parameter gather
            seen["all_gather_into_tensor"] = COUNTER.unit_name
            comm.barrier()  # a wait inside a wait is one wait

    monkeypatch.setattr(comm, "cdb", Backend())
    assert {"barrier", "reduce_scatter_tensor", "all_gather_into_tensor"} <= set(install_collective_waits())
    assert install_collective_waits() == [], "idempotent: one wait, not a wait in a wait"
    comm.barrier()  # as DeepSpeed's checkpoint code calls it
    assert seen["barrier"] == "wait" and COUNTER.unit is Mark.BACKWARD
    count = COUNTER.count
    comm.cdb.reduce_scatter_tensor(None, None)
    comm.cdb.all_gather_into_tensor(None, None)
    assert seen["reduce_scatter_tensor"] == seen["all_gather_into_tensor"] == seen["barrier"] == "wait"
    assert COUNTER.count == count + 4 and COUNTER.unit is Mark.BACKWARD, "two marks a collective, none inside"


def test_tensor_parallel_collectives_forward_and_backward_are_waits(monkeypatch):
    """The TP all-reduce and all-gather of the layers (both directions) and the vocab-parallel cross
    entropy's, at tp = 2 with the process group replaced by probes: the unit the beat would report
    while each runs. A rank blocked in one waits for its TP peer; it is not stuck in its own work."""
    import torch.distributed as dist

    from trainer.parallel import cross_entropy, groups, mappings

    seen: list[str] = []

    def all_reduce(tensor, op=None, group=None):
        seen.append(COUNTER.unit_name)

    def all_gather(parts, tensor, group=None):
        seen.append(COUNTER.unit_name)
        for part in parts:
            part.copy_(tensor)

    monkeypatch.setattr(groups, "get_tp_world_size", lambda: 2)
    monkeypatch.setattr(groups, "get_tp_rank", lambda: 0)
    monkeypatch.setattr(groups, "get_tp_group", lambda: None)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    COUNTER.mark(Mark.FORWARD)
    x = torch.randn(2, 3, 4, requires_grad=True)
    y = mappings.reduce_from_tp_region(mappings.copy_to_tp_region(x))  # forward: 1 all-reduce
    z = mappings.gather_from_tp_region(y)  # forward: 1 all-gather
    loss = cross_entropy.vocab_parallel_cross_entropy(z, torch.zeros(2, 3, dtype=torch.long))  # 3 all-reduces
    assert seen == ["wait"] * 5 and COUNTER.unit is Mark.FORWARD, seen
    loss.sum().backward()  # backward: the copy's all-reduce (the gather's backward is a split)
    assert seen == ["wait"] * 6 and COUNTER.unit is Mark.FORWARD, seen


@pytest.mark.parametrize("zipfile", [True, False])
def test_torch_save_and_load_through_the_counting_files_count_every_byte(tmp_path, zipfile):
    state = {"weights": torch.randn(300, 200), "step": 7, "moments": [torch.arange(1000)]}
    path = tmp_path / "state.pt"
    before = COUNTER.count
    with open(path, "wb") as handle:
        writer = CountingWriter(handle, chunk=4096)
        torch.save(state, writer, _use_new_zipfile_serialization=zipfile)
    size = os.stat(path).st_size
    marks = COUNTER.count - before
    print(f"wrote {size} bytes, counted {writer.bytes}, {marks} marks of save_bytes")
    assert writer.bytes == size
    assert marks >= size // 4096  # a mark at least every chunk: a huge tensor is no single silent write
    assert COUNTER.unit is Mark.SAVE_BYTES
    with open(path, "rb") as handle:
        reader = CountingReader(handle, chunk=4096)
        loaded = torch.load(reader, weights_only=False)
    assert torch.equal(loaded["weights"], state["weights"]) and loaded["step"] == 7
    print(f"read {reader.bytes} of {size} bytes")
    assert size * 0.95 <= reader.bytes <= size * 1.05 and COUNTER.unit is Mark.LOAD_BYTES


def test_local_rank_0_writes_one_file_for_its_node_and_a_dead_peer_shows_in_it(tmp_path):
    paths = RunPaths.of(tmp_path / "run")
    shm = tmp_path / "shm"
    shm.mkdir()
    common = {"world_size": 2, "job_id": "41", "interval_seconds": 0.1, "host": "node07", "local_world_size": 2,
              "node_local_root": shm}
    peer = HeartbeatWriter(paths, rank=1, local_rank=1, **common).start()
    gatherer = HeartbeatWriter(paths, rank=0, local_rank=0, **common).start()
    node_dir = NodeLocalBeats("41", 0, 0, "node07", shm).path
    try:
        assert stat.S_IMODE(node_dir.stat().st_mode) == 0o700 and stat.S_IMODE(node_dir.parent.stat().st_mode) == 0o700
        deadline = time.time() + 10
        while time.time() < deadline and len(read_heartbeats(paths.heartbeats)) < 2:
            time.sleep(0.05)
        assert sorted(os.listdir(paths.heartbeats)) == ["node-node07.json"]  # no rank files
        first = {b.rank: b for b in read_heartbeats(paths.heartbeats)}
        assert set(first) == {0, 1} and {b.host for b in first.values()} == {"node07"}
        peer.stop(None)  # the peer dies: its entry stays, frozen; the node file keeps moving
        time.sleep(0.3)
        frozen = {b.rank: b for b in read_heartbeats(paths.heartbeats)}
        time.sleep(0.4)
        later = {b.rank: b for b in read_heartbeats(paths.heartbeats)}
        print(f"seq rank 0: {frozen[0].seq} -> {later[0].seq}, rank 1: {frozen[1].seq} -> {later[1].seq}")
        assert later[1].seq == frozen[1].seq and later[1].beat_time == frozen[1].beat_time
        assert later[0].seq > frozen[0].seq
    finally:
        peer.stop(None)
        gatherer.stop(Phase.EXITING)
    assert not node_dir.exists()  # local rank 0 leaves nothing in /dev/shm
    assert {b.rank: b.phase for b in read_heartbeats(paths.heartbeats)}[0] is Phase.EXITING


def test_the_node_local_folder_must_be_this_users_own(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    beats = NodeLocalBeats("41", 0, 0, "node07", tmp_path)
    beats.parent.mkdir(mode=0o700)
    beats.path.symlink_to(tmp_path / "elsewhere")  # planted by someone: never followed
    with pytest.raises(NotPrivateError, match="symbolic link"):
        beats.open()
    with pytest.raises(ValueError, match="cannot name a folder"):
        NodeLocalBeats("41/../x", 0, 0, "node07", tmp_path)
