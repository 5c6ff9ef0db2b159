"""The run-directory contract's records: each one round-trips through its writer and reader; a
record from a newer version is a clear ContractVersionError (never a KeyError further down);
the one reader of files another user can write is fuzzed with every other untrusted reader in
tests/security/test_untrusted_readers.py."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from orchestrator.contract import (
    Allocation,
    ContractError,
    ContractVersionError,
    Decision,
    Heartbeat,
    HeartbeatReader,
    LaunchEnd,
    Manifest,
    NodeBeat,
    OperatorRequest,
    Phase,
    RunPaths,
    read_allocation,
    read_heartbeats,
    write_allocation,
    write_node_beat,
)
from orchestrator.contract import events as ev
from orchestrator.contract.events import event_kinds, read_events, write_event
from orchestrator.contract.manifest import FileEntry
from orchestrator.contract.state import ControllerState, load_state, save_state


def a_beat(**changes) -> Heartbeat:
    beat = Heartbeat(3, 8, "node02", "77", 4242, 11, Phase.STEP, 100.0, 99.0, 50.0, seq=5, step_seconds=1.5,
                     durations={"init": 12.0}, compute_seconds=0.9, compute_step=11, compute_group="pp0.tp1")
    return dataclasses.replace(beat, **changes)


def test_a_beat_round_trips_and_a_version_1_beat_reads_its_extra(tmp_path):
    beat = a_beat()
    assert Heartbeat.from_dict(json.loads(beat.to_json())) == beat
    old = {k: v for k, v in json.loads(beat.to_json()).items() if k not in ("step_seconds", "durations", "version")}
    old.update(version=1, extra={"step_seconds": 1.5, "durations": {"init": 12.0}})
    assert Heartbeat.from_dict(old) == beat


def test_every_heartbeat_field_is_read_back_and_one_without_a_check_is_refused():
    """A field is declared once, with its check: from_dict keeps every field a writer sets (none is
    dropped for want of a check), and a field declared without one fails at import (_checks_of)."""
    from orchestrator.contract.heartbeat import _checked, _checks_of

    every = a_beat(restart_count=2, process_started=7.0, launch=1, progress_count=9, progress_unit="backward",
                   mark_gaps={"step": 2.0}, loss=2.5, consumed_samples=64, resumed_from=10,
                   checkpoint_load_seconds=3.0, start_phases={"load": 1.0}, restore_bytes={"local": 5.0},
                   dropped_copies=["peer"], rollback_applied="r1", exit_code=1, exit_reason="x")  # fmt: skip
    at_default = [
        f.name for f in dataclasses.fields(Heartbeat)
        if f.default is not dataclasses.MISSING and getattr(every, f.name) == f.default
        or f.default_factory is not dataclasses.MISSING and getattr(every, f.name) == f.default_factory()
    ]  # fmt: skip
    assert at_default == ["version"], "set every field, so that a dropped one would show"
    assert Heartbeat.from_dict(json.loads(every.to_json())) == every

    @dataclasses.dataclass
    class Beat:
        rank: int = _checked(lambda v: isinstance(v, int))
        host: str = ""  # declared without a check

    with pytest.raises(TypeError, match="host declared without a check"):
        _checks_of(Beat)


def test_a_bad_report_loses_that_number_not_the_beat():
    data = json.loads(a_beat().to_json())
    data["step_seconds"] = float("nan")
    assert Heartbeat.from_dict(data).step_seconds is None
    data["rank"] = "three"
    with pytest.raises(ValueError, match="rank"):
        Heartbeat.from_dict(data)


def test_every_record_of_a_newer_version_is_a_clear_error(tmp_path):
    newer = {"version": 99}
    for reader, data in [
        (Heartbeat.from_dict, {**json.loads(a_beat().to_json()), **newer}),
        (Allocation.from_dict, {**Allocation("5", "running", 0, ["n1"], []).to_dict(), **newer}),
        (Decision.from_dict, {**Decision(0, "relaunch").to_dict(), **newer}),
        (OperatorRequest.from_dict, {"name": "kill", "user": "u", "uid": 1, "reason": "r", "now": False,
                                     "time": 1.0, **newer}),
        (Manifest.from_dict, {**Manifest({"a": FileEntry(1, "x")}, step=1).to_dict(), **newer}),
        (ControllerState.from_dict, {**ControllerState().to_dict(), **newer}),
        (ev.Event.from_dict, {"event": "failure", "time": 1.0, **newer}),
    ]:
        with pytest.raises(ContractVersionError, match="version 99.*Upgrade runctl"):
            reader(data)


def test_newer_beats_fail_the_pass_loudly_and_malformed_ones_are_skipped(tmp_path):
    paths = RunPaths.of(tmp_path)
    paths.heartbeats.mkdir()
    paths.heartbeat(0).write_text(a_beat(rank=0).to_json())
    paths.heartbeat(1).write_text("{not json")
    paths.heartbeat(2).write_text(json.dumps({"rank": 2}))
    os.mkfifo(paths.heartbeat(3))
    assert [b.rank for b in read_heartbeats(paths.heartbeats)] == [0]
    paths.heartbeat(4).write_text(json.dumps({**json.loads(a_beat(rank=4).to_json()), "version": 4}))
    with pytest.raises(ContractVersionError):
        read_heartbeats(paths.heartbeats)


def _node(host: str, ranks: list[Heartbeat]) -> NodeBeat:
    return NodeBeat(host=host, job_id="7", world_size=16, restart_count=0, launch=1, ranks=ranks)


def test_a_node_file_carries_each_rank_of_its_node_and_nothing_else(tmp_path):
    directory = tmp_path / "heartbeats"
    directory.mkdir()
    beats = [a_beat(rank=r, host="node02", job_id="7", world_size=16, launch=1, progress_count=40 + r,
                    progress_unit="wait" if r == 9 else "backward", mark_gaps={"step": 2.5}) for r in (8, 9)]
    write_node_beat(directory, _node("node02", beats))
    assert sorted(read_heartbeats(directory), key=lambda b: b.rank) == beats  # every field comes back
    assert [b.waiting for b in beats] == [False, True]
    # An entry cannot claim another node or job (the node's own fields win), a bad entry loses
    # only itself, and a file whose name and host disagree is not read at all.
    text = json.loads((directory / "node-node02.json").read_text())
    text["ranks"][0].update(host="node99", job_id="666")
    text["ranks"][1]["step"] = "many"
    (directory / "node-node02.json").write_text(json.dumps(text))
    (directory / "node-node03.json").write_text(json.dumps({**text, "host": "node02"}))
    [left] = read_heartbeats(directory)
    assert (left.rank, left.host, left.job_id) == (8, "node02", "7")
    with pytest.raises(ContractError, match="cannot name a heartbeat file"):
        write_node_beat(directory, _node("../x", beats))


def test_the_reader_validates_only_entries_that_changed(tmp_path):
    directory = tmp_path / "heartbeats"
    directory.mkdir()
    reader = HeartbeatReader(directory)
    write_node_beat(directory, _node("node01", [a_beat(rank=r, host="node01", job_id="7", world_size=16,
                                                       launch=1, seq=1) for r in range(8)]))
    first = {b.rank: b for b in reader.read()}
    moved = [a_beat(rank=r, host="node01", job_id="7", world_size=16, launch=1, seq=1 + (r == 3))
             for r in range(8)]
    write_node_beat(directory, _node("node01", moved))
    second = {b.rank: b for b in reader.read()}
    assert second[3].seq == 2 and second[3] is not first[3]
    assert all(second[r] is first[r] for r in range(8) if r != 3)  # unchanged: the same object


def test_every_event_kind_round_trips_through_events_jsonl(tmp_path):
    path = tmp_path / "events.jsonl"
    written = []
    for kind in event_kinds().values():
        fields = {f.name: _example(f) for f in dataclasses.fields(kind) if f.name != "time"}
        written.append(write_event(path, kind(**fields), now=1.0))
    read = read_events(path)
    assert read == written and len(read) == len(event_kinds()) >= 45
    with open(path, "a") as handle:
        handle.write(json.dumps({"event": "from_the_future", "time": 2.0, "x": 1}) + "\n")
    unknown = read_events(path)[-1]
    assert isinstance(unknown, ev.UnknownEvent) and unknown.name == "from_the_future"


def _example(field: dataclasses.Field):
    kind = str(field.type)
    if "dict" in kind:
        return {"a": "b"}
    if "list" in kind:
        return ["x"]
    if "bool" in kind:
        return True
    if kind.startswith("int"):
        return 7
    if kind.startswith("float"):
        return 2.5
    return "text"


def test_exit_code_is_the_first_reported_task_s_when_it_exited_with_one():
    end = LaunchEnd.from_srun(0, 143, "srun: error: node03: task 2: Exited with exit code 17\n"
                                      "srun: error: node01: task 0: Terminated")
    assert end.exit_code == 17 and end.failed_host == "node03" and not end.blames_signalled_task
    # A first task killed by a signal: srun's own code stands (not a peer's later 143), and that
    # task's node is the one to blame even when srun reports it after its peers.
    end = LaunchEnd.from_srun(0, 137, "srun: error: node01: task 0: Exited with exit code 1\n"
                                      "srun: error: node02: task 1: Killed\n")
    assert end.exit_code == 1 and end.failed_host == "node02" and end.blames_signalled_task
    end = LaunchEnd.from_srun(0, 137, "srun: error: node02: task 1: Killed\n"
                                      "srun: error: node01: task 0: Exited with exit code 143")
    assert end.exit_code == 137 and end.failed_host == "node02"
    assert LaunchEnd.from_srun(0, 1, "no task lines at all").exit_code == 1


def test_allocation_and_launch_end_round_trip(tmp_path):
    record = Allocation("5", "waiting_decision", 1, ["n1", "n2"], ["n3"], {"n4": "ECC"}, {"n0": "hang"},
                        LaunchEnd.from_srun(1, 143, "srun: error: n2: task 3: Killed\n"))
    write_allocation(tmp_path / "allocation.json", record)
    assert read_allocation(tmp_path / "allocation.json") == record
    assert record.exit_code == 143 and record.ended.failed_host == "n2" and record.waiting


def test_state_round_trips(tmp_path):
    paths = RunPaths.of(tmp_path)
    state = ControllerState(restarts=2)
    save_state(paths, state)
    assert load_state(paths).restarts == 2


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 65_537, 3 * 65_536 + 5, 300_000])
@pytest.mark.parametrize("limit", [1, 65_536, 200_001, 1 << 20])
def test_read_upto_reads_the_file_up_to_the_limit_whatever_the_first_ask(tmp_path, size, limit):
    """Readers ask os.read for a little first (it allocates what it is asked for); the bytes
    must still be the file's, cut at the limit, and read_untrusted must still refuse a file over
    its bound."""
    from orchestrator.contract.files import UntrustedFileError, read_untrusted, read_upto

    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    for first in (1, 4096, 65_536, size + 1):
        fd = os.open(tmp_path / "f", os.O_RDONLY)
        try:
            assert read_upto(fd, limit, first=first) == data[:limit], (size, limit, first)
        finally:
            os.close(fd)
    if size <= limit:
        assert read_untrusted(tmp_path / "f", limit)[0] == data
    else:
        with pytest.raises(UntrustedFileError, match="more than"):
            read_untrusted(tmp_path / "f", limit)
