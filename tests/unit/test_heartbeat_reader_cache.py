"""HeartbeatReader's memory between passes (files not parsed again when their bytes are the same,
entries checked only where they changed) must give what a fresh read gives, whatever changed:
a field's value (valid or not), a field that appears or goes, the same fields in another order, the
node's own fields, the version.
The oracle is a new reader (no memory: every entry through Heartbeat.from_dict)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.contract import Heartbeat, HeartbeatReader, NodeBeat, Phase, write_node_beat
from orchestrator.contract.heartbeat import node_beat_path

FIELDS = {  # field -> values a writer (or a broken one) may put there
    "seq": st.integers(-2, 10**6),
    "beat_time": st.floats(allow_nan=True, allow_infinity=True),
    "step": st.one_of(st.integers(-1, 10**6), st.just("7"), st.just(True)),
    "phase": st.sampled_from(["step", "checkpoint", "eval", "init", "lunch", 3]),
    # Not a float equal to the count it replaces (3.0 for 3): that passes for the count, as
    # documented in contract.heartbeat._updated.
    "progress_count": st.one_of(st.integers(-1, 10**9), st.floats(allow_nan=False).filter(lambda x: x != 3)),
    "progress_unit": st.sampled_from(["forward", "wait", "", "x" * 40]),
    "mark_gaps": st.one_of(
        st.dictionaries(st.sampled_from(["step", "checkpoint"]), st.floats(0.01, 1e4), max_size=2),
        st.just({"step": "slow"}),
        st.just([1.0]),
    ),
    "loss": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False), st.just("nan")),
    "compute_group": st.sampled_from(["pp0.tp0", "", 5]),
    "rank": st.integers(0, 9),
    "pid": st.integers(1, 10**6),
}


def _node(host: str, seq: int) -> NodeBeat:
    beats = [
        Heartbeat(rank, 16, host, "42", 100 + rank, 10, Phase.STEP, 1000.0 + seq, 990.0, 900.0, seq=seq,
                  progress_count=seq * 3, progress_unit="forward", mark_gaps={"step": 0.4}, loss=2.5)
        for rank in range(8)
    ]  # fmt: skip
    return NodeBeat(host, "42", 16, 0, 0, beats)


def _as_dicts(beats: list[Heartbeat]) -> list[str]:
    return sorted(json.dumps(b.to_dict(), sort_keys=True, default=str) for b in beats)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    changes=st.lists(
        st.tuples(
            st.integers(0, 7),  # which entry
            st.sampled_from([*FIELDS, "drop", "reorder", "node_job", "node_version"]),
            st.data(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_reader_with_memory_reads_what_a_fresh_one_reads(tmp_path, changes):
    directory = tmp_path / "heartbeats"
    directory.mkdir(exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    write_node_beat(directory, _node("nodeA", 1), durable=False)
    write_node_beat(directory, _node("nodeB", 1), durable=False)
    reader = HeartbeatReader(directory)
    reader.read()
    data = json.loads(node_beat_path(directory, "nodeA").read_text())
    for index, what, draw in changes:
        entry = data["ranks"][index]
        if what == "drop":
            entry.pop("loss", None)
        elif what == "reorder":  # the same keys in another order (the rank's in its place), each
            # holding its neighbour's value: compared by position, value against value, nothing differs
            keys = list(entry)
            others = [k for k in keys if k != "rank"]
            turned = iter(others[1:] + others[:1])
            order = [k if k == "rank" else next(turned) for k in keys]
            data["ranks"][index] = dict(zip(order, entry.values(), strict=True))
        elif what == "node_job":
            data["job_id"] = "43"
        elif what == "node_version":
            data["version"] = 2
        else:
            entry[what] = draw.draw(FIELDS[what])
    node_beat_path(directory, "nodeA").write_text(json.dumps(data))  # nodeB unchanged: not parsed again
    remembered = reader.read()
    fresh = HeartbeatReader(directory).read()
    assert _as_dicts(remembered) == _as_dicts(fresh)
    assert len(remembered) == len(fresh)
