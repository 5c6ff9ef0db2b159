"""orchestrator/contract/directive.py: the rollback directive, an operator's ask for one and a checkpoint's trainer state, as
records (every field checked, named in the error) and as untrusted files (no symlink, no FIFO,
bounded, the owner's)."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.contract import RunPaths
from orchestrator.contract.directive import (
    MAX_BYTES,
    CheckpointState,
    DirectiveError,
    Rollback,
    RollbackAsk,
    new_directive_id,
    read_checkpoint_state,
    read_rollback,
    write_rollback,
)

GOOD = {"version": 1, "id": "rb-1", "to_step": 200, "skip_samples": [[1600, 2880]], "lr_scale": 0.5,
        "lr_scale_steps": 50, "reason": "loss spike at 350", "requested_by": "alice", "requested_at": 1.7e9}


def test_round_trip_and_unique_ids():
    directive = Rollback.from_dict(GOOD)
    assert directive.skip_samples == ((1600, 2880),) and directive.to_dict() == GOOD
    assert Rollback.from_dict(json.loads(json.dumps(directive.to_dict()))) == directive
    assert len({new_directive_id() for _ in range(100)}) == 100


@pytest.mark.parametrize("key, value, message", [
    ("id", "../x", "rollback.id"),
    ("to_step", -1, "rollback.to_step: expected an integer >= 0"),
    ("to_step", True, "rollback.to_step"),
    ("skip_samples", [[5, 5]], r"rollback.skip_samples\[0\]: expected \[start, end\)"),
    ("skip_samples", [[10, 20], [15, 30]], r"skip_samples\[1\] = \[15, 30\] overlaps"),
    ("skip_samples", "0:10", "rollback.skip_samples: expected a list"),
    ("lr_scale", 2.0, r"rollback.lr_scale: 2.0 is outside \(0, 1\]"),
    ("lr_scale", float("nan"), "rollback.lr_scale: expected a finite number"),
    ("lr_scale_steps", 0, "rollback.lr_scale_steps: 0 with lr_scale 0.5"),
    ("reason", "two\nlines", "rollback.reason"),
    ("requested_at", "yesterday", "rollback.requested_at"),
    ("color", "red", r"unknown field\(s\) \['color'\]"),
    ("version", 2, "rollback.version: 2, this code reads version 1 .written by a newer"),
    ("version", None, "rollback.version: None"),
])
def test_each_bad_field_is_named(key, value, message):
    with pytest.raises(DirectiveError, match=message):
        Rollback.from_dict({**GOOD, key: value})


def test_the_constructor_checks_too():
    with pytest.raises(DirectiveError, match="rollback.lr_scale"):
        Rollback(id="rb-2", to_step=3, skip_samples=(), lr_scale=0.0, lr_scale_steps=5)
    assert Rollback(id="rb-2", to_step=3, skip_samples=[[0, 8]]).skip_samples == ((0, 8),)


def test_an_operators_ask_is_checked_like_a_directive_and_becomes_one():
    ask = RollbackAsk.from_dict({"to_step": 200, "skip_samples": [[1600, 2880]], "lr_scale": 0.5, "lr_scale_steps": 50})
    assert RollbackAsk.from_dict(json.loads(json.dumps(ask.to_dict()))) == ask
    made = ask.directive("rb-9", "loss spike at 350", "alice", 1.7e9)
    assert made.to_dict() == {**GOOD, "id": "rb-9"}
    assert RollbackAsk.from_dict({"to_step": 3, "skip_samples": []}).lr_scale == 1.0
    for bad, message in (({"to_step": -1, "skip_samples": []}, "to_step"),
                         ({"to_step": 3, "skip_samples": [[9, 2]]}, r"skip_samples\[0\]"),
                         ({"to_step": 3, "skip_samples": [], "id": "x"}, r"unknown field\(s\) \['id'\]"),
                         ([3], "expected a JSON object")):
        with pytest.raises(DirectiveError, match=message):
            RollbackAsk.from_dict(bad)


def test_file_is_read_as_untrusted(tmp_path):
    paths = RunPaths.of(tmp_path)
    assert read_rollback(paths) is None
    written = write_rollback(paths, Rollback.from_dict(GOOD))
    assert written == paths.rollback_directive == tmp_path / "accepted" / "rollback"
    assert oct(written.stat().st_mode & 0o777) == "0o644" and read_rollback(paths).id == "rb-1"
    with pytest.raises(DirectiveError, match="not the run's owner"):
        read_rollback(paths, owner_uid=os.getuid() + 1)
    written.unlink()
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps(GOOD))
    written.symlink_to(elsewhere)
    with pytest.raises(DirectiveError, match="symbolic link"):
        read_rollback(paths)
    written.unlink()
    os.mkfifo(written)  # would block a plain open()
    with pytest.raises(DirectiveError, match="not a regular file"):
        read_rollback(paths)
    written.unlink()
    written.write_text(" " * (MAX_BYTES + 1))
    with pytest.raises(DirectiveError, match="more than"):
        read_rollback(paths)
    written.write_text("{not json")
    with pytest.raises(DirectiveError, match="not JSON"):
        read_rollback(paths)


def test_checkpoint_state_round_trip_and_checks(tmp_path):
    state = CheckpointState(step=4, consumed_samples=40, lr_samples=24, skipped_total=1, global_batch=8,
                            applied_directives=("rb-1",), skip_samples=((8, 24),), lr_scale=0.5,
                            lr_scale_last_step=6)
    (tmp_path / "trainer_state.json").write_text(json.dumps(state.to_dict()))
    assert read_checkpoint_state(tmp_path) == state
    assert read_checkpoint_state(tmp_path / "missing") is None
    broken = {**state.to_dict(), "applied_directives": ["ok", "no spaces"]}
    with pytest.raises(DirectiveError, match="trainer_state.json.applied_directives"):
        CheckpointState.from_dict(broken)
