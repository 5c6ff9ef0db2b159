"""orchestrator/controller/metrics_follower.py over a real metrics.jsonl: each poll returns only the
steps written since the last one, a line still being written waits, the history is the current
lineage, a restarted controller goes on from the offset state.json kept, a new file is read anew."""

from __future__ import annotations

import json
import os

from orchestrator.contract import StepMetrics
from orchestrator.contract.metrics import append_metrics
from orchestrator.controller.metrics_follower import MetricsFollower


def write(path, *steps: int) -> None:
    for step in steps:
        append_metrics(path, StepMetrics(step=step, time=float(step), loss=3.0, consumed_samples=8 * step, global_batch=8))


def steps(records) -> list[int]:
    return [r.step for r in records]


def test_each_line_is_read_once_and_a_partial_line_waits(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = MetricsFollower(path, keep=50)
    assert follower.poll(None) == [] and follower.offset == 0  # no file yet
    write(path, 1, 2, 3)
    assert steps(follower.poll(None)) == [1, 2, 3] and follower.offset == path.stat().st_size
    assert follower.poll(None) == []
    line = json.dumps(StepMetrics(step=4, time=4.0, loss=3.0).to_dict()) + "\n"
    with open(path, "a") as handle:  # the trainer is half-way through writing step 4
        handle.write(line[:20])
    assert follower.poll(None) == [] and follower.offset == path.stat().st_size - 20
    with open(path, "a") as handle:
        handle.write(line[20:])
    assert steps(follower.poll(None)) == [4]
    write(path, 5, 3, 4)  # a rollback to step 2: steps 3-4 again
    assert steps(follower.poll(None)) == [5, 3, 4] and steps(follower.history) == [1, 2, 3, 4]


def test_a_restarted_controller_goes_on_from_the_judged_offset_with_the_history_before(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, *range(1, 301))
    judged = path.stat().st_size
    write(path, 301, 302)
    follower = MetricsFollower(path, keep=100)
    assert steps(follower.poll(judged)) == [301, 302]
    assert steps(follower.history)[-102:] == list(range(201, 303))  # what the windows need, read back once
    fresh = MetricsFollower(path, keep=100)  # no offset in state.json: from the file's end
    assert fresh.poll(None) == [] and steps(fresh.history)[-1] == 302
    kept = len(fresh.history)
    write(path, *range(303, 460))
    fresh.poll(None)
    assert len(fresh.history) <= 150 and steps(fresh.history)[-1] == 459, kept


def test_a_replaced_or_truncated_file_is_followed_from_its_start(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write(path, 1, 2, 3)
    follower = MetricsFollower(path, keep=50)
    follower.poll(0)
    os.replace(tmp_path / "metrics.jsonl", tmp_path / "old.jsonl")
    write(path, 1)
    assert steps(follower.poll(None)) == [1] and steps(follower.history) == [1]
    path.write_text("")  # truncated in place
    write(path, 7)
    assert steps(follower.poll(None)) == [7]
