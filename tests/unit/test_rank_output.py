"""The failing rank's own error, read from a job's output (srun --label) as srun and Python write it."""

from __future__ import annotations

import os

import pytest

from orchestrator.contract.rank_output import MAX_LINE_CHARS, find_rank_error, rank_lines, read_rank_error

# 12 ranks: labels right-aligned to two characters, as srun writes them.
OUTPUT = """\
launcher: launch 0 on node[01-03]
 0: step 1 loss 8.31
 1: step 1 loss 8.31
11: step 1 loss 8.31
 1: Traceback (most recent call last):
 1:   File "/w/trainer/loop.py", line 88, in train
 1:     faults.before_step(step)
 1:   File "/w/trainer/faults.py", line 166, in before_step
 1:     raise RuntimeError(f"TEST FAULT raise at step {step} on rank {self.rank}")
 1: RuntimeError: TEST FAULT raise at step 2 on rank 1
 0: [W socket.cpp:464] connection reset by peer
srun: error: node01: task 1: Exited with exit code 1
srun: error: node01: task 0: Terminated
"""


def test_the_task_srun_named_gives_its_exception_line_and_traceback():
    found = find_rank_error(OUTPUT, "1")
    assert found is not None
    assert found.describe() == "rank 1: RuntimeError: TEST FAULT raise at step 2 on rank 1"
    assert found.lines[0] == "Traceback (most recent call last):" and len(found.lines) == 6


def test_without_a_named_task_the_first_rank_with_a_traceback_is_taken():
    assert find_rank_error(OUTPUT, None).rank == 1
    assert find_rank_error(OUTPUT, "0-11").rank == 1, "a range of tasks names nobody"


def test_a_named_task_that_only_saw_its_peer_die_gives_way_to_the_rank_with_the_traceback():
    assert find_rank_error(OUTPUT, "0").rank == 1


def test_a_rank_without_a_traceback_gives_its_last_line():
    text = " 3: loading...\n 3: Segmentation fault (core dumped)\nsrun: error: n1: task 3: Exited with exit code 139\n"
    found = find_rank_error(text, "3")
    assert found.describe() == "rank 3: Segmentation fault (core dumped)"


def test_a_rank_that_printed_no_error_gives_none_rather_than_where_it_was():
    killed = " 2:   File \"/w/torch/autograd/graph.py\", line 829, in _engine_run_backward\n" \
        " 2:     return Variable._execution_engine.run_backward(\n"
    assert find_rank_error(killed, "2") is None
    cut = " 2: Traceback (most recent call last):\n" + killed  # killed while printing its traceback
    assert find_rank_error(cut, "2") is None


def test_nothing_labelled_is_no_error():
    assert find_rank_error("srun: error: n1: task 0: Killed\n", "0") is None


def test_what_a_rank_printed_is_made_inert_and_bounded():
    text = " 2: Traceback (most recent call last):\n 2: ValueError: \x1b[2J\x07boom" + "x" * 1000 + "\n"
    found = find_rank_error(text, "2")
    assert "\x1b" not in found.headline and "\x07" not in found.headline and "\\x1b[2J" in found.headline
    assert len(found.headline) == MAX_LINE_CHARS


def test_rank_lines_are_one_ranks_lines_without_the_label():
    assert rank_lines(OUTPUT, 11) == ["step 1 loss 8.31"]


def test_the_output_is_read_from_its_tail_never_through_a_symlink(tmp_path):
    output = tmp_path / "slurm-7.out"
    output.write_text(" 0: noise\n" * 100_000 + OUTPUT)  # ~1 MB: only the tail is read
    assert os.path.getsize(output) > 1_000_000
    assert read_rank_error(output, "1").rank == 1
    link = tmp_path / "slurm-8.out"
    link.symlink_to(output)
    assert read_rank_error(link, "1") is None
    assert read_rank_error(tmp_path / "slurm-9.out", "1") is None


@pytest.mark.parametrize("task", [None, "1"])
def test_a_fifo_is_not_waited_on(tmp_path, task):
    fifo = tmp_path / "slurm-10.out"
    os.mkfifo(fifo)
    assert read_rank_error(fifo, task) is None
