"""Which node failed, from srun's report in the job output."""

from __future__ import annotations

from orchestrator.controller.submission import failed_task_host


def test_signalled_task_is_the_culprit_even_when_reported_after_its_peers(tmp_path):
    out = tmp_path / "slurm-7.out"
    out.write_text(
        "runctl: job 7 on node[01-04]\n"
        "srun: error: node01: task 0: Exited with exit code 1\n"
        "srun: error: node03: task 2: Killed\n"
        "srun: error: node04: task 3: Exited with exit code 1\n"
    )
    assert failed_task_host(out) == ("node03", "Killed")


def test_first_reported_task_without_a_signal_and_nothing_reported(tmp_path):
    out = tmp_path / "slurm-8.out"
    out.write_text("srun: error: node02: task 1: Exited with exit code 1\nsrun: error: node01: task 0: Exited with exit code 1\n")
    assert failed_task_host(out) == ("node02", "Exited with exit code 1")
    out.write_text("runctl: job 8 ends with exit code 0\n")
    assert failed_task_host(out) == (None, None)
    assert failed_task_host(tmp_path / "missing.out") == (None, None)
