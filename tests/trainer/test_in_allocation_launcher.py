"""`python -m orchestrator.slurm.launcher` (every job's program) as a real process, against fake srun/squeue/scancel/scontrol
(tests/trainer/fake_slurm_steps.py) that play a planned outcome per step; the test plays the
controller by writing decisions. The real-SLURM run of the same path, with the real trainer and
controller, is tests/controller/test_e2e_slurm.py::test_sigkilled_rank_relaunched_on_a_spare_...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_slurm_steps import install

from orchestrator.contract import Decision, RunPaths, read_allocation, write_decision

REPO = Path(__file__).resolve().parents[2]
JOB = "4242"


@pytest.fixture
def launcher(tmp_path: Path):
    """Start the launcher on nodes node01..node03 (2 needed, 1 spare) with a plan."""
    bin_dir, fake, run = tmp_path / "bin", tmp_path / "fake", tmp_path / "run"
    install(bin_dir)
    fake.mkdir()
    (run / "jobs" / JOB).mkdir(parents=True)
    procs = []

    def start(plan: dict, *, nodes: str = "node01 node02 node03", decision_seconds: float = 30,
              health: bool = False) -> subprocess.Popen:
        (fake / "plan.json").write_text(json.dumps(plan))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(fake),
               "FAKE_NODES": nodes, "SLURM_JOB_ID": JOB, "SLURM_JOB_NODELIST": "ignored-by-the-fake",
               "SLURM_NTASKS": "6", "PYTHONPATH": str(REPO)}
        argv = [sys.executable, "-m", "orchestrator.slurm.launcher", "--run-dir", str(run),
                "--nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "1",
                "--srun-wait", "5", "--decision-seconds", str(decision_seconds)]
        argv += ["--health", "--health-seconds", "20"] if health else []
        proc = subprocess.Popen([*argv, "--", "/bin/true", "train"], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        return proc

    yield start, RunPaths.of(run), fake
    for proc in procs:
        if proc.poll() is None:
            proc.kill()


def srun_calls(fake: Path) -> list[dict]:
    return [json.loads(line) for line in (fake / "srun.log").read_text().splitlines()]


def nodelist(call: dict) -> list[str]:
    return next(a for a in call["argv"] if a.startswith("--nodelist=")).split("=", 1)[1].split(",")


def wait_for_state(paths: RunPaths, state: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            allocation = read_allocation(paths.allocation(JOB))
        except ValueError:  # caught mid-rename on a slow machine: read again
            allocation = None
        if allocation is not None and allocation.state == state:
            return allocation
        time.sleep(0.05)
    raise AssertionError(f"launcher never reached {state}: {paths.allocation(JOB).read_text()}")


def test_failed_launch_relaunched_on_the_spare_after_the_decision(launcher):
    start, paths, fake = launcher
    proc = start({"launch-0": {"rc": 1, "stderr": "srun: error: node02: task 2: Killed"}, "launch-1": {"rc": 0}})
    waiting = wait_for_state(paths, "waiting_decision")
    assert (waiting.launch, waiting.nodes, waiting.spares) == (0, ["node01", "node02"], ["node03"])
    assert "task 2: Killed" in paths.launch_stderr(JOB, 0).read_text()  # the controller's evidence
    write_decision(paths.launch_decision(JOB, 0), Decision(0, "relaunch", ("node02",), "test"))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    calls = srun_calls(fake)
    assert [c["name"] for c in calls] == ["launch-0", "launch-1"]
    assert nodelist(calls[1]) == ["node01", "node03"] and calls[1]["env_launch"] == "1"
    assert "--ntasks=4" in calls[1]["argv"]
    done = read_allocation(paths.allocation(JOB))
    assert (done.state, done.launch, done.spares, done.left_out) == ("ended", 1, [], {"node02": "test"})


def test_without_spares_one_launch_and_the_job_ends_with_the_trainers_code(launcher):
    """spare_nodes: 0, the degenerate case: no decision is awaited, no standby, one launch."""
    start, paths, fake = launcher
    stderr = "srun: error: node02: task 2: Exited with exit code 19\nsrun: error: node01: task 0: Terminated"
    proc = start({"launch-0": {"rc": 143, "stderr": stderr}}, nodes="node01 node02", decision_seconds=0)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 19, out  # the trainer's config error, not srun's 143
    assert [c["name"] for c in srun_calls(fake)] == ["launch-0"] and "--label" in srun_calls(fake)[0]["argv"]
    done = read_allocation(paths.allocation(JOB))
    assert (done.state, done.waits_for_decisions, done.exit_code) == ("ended", False, 19)
    assert done.ended.failed_host == "node02" and "waiting" not in out
    assert oct(paths.job_dir(JOB).stat().st_mode & 0o777) == "0o700"


def test_no_decision_ends_the_job_with_the_first_failed_task_code(launcher):
    start, paths, fake = launcher
    stderr = "srun: error: node01: task 0: Exited with exit code 3\nsrun: error: node02: task 2: Killed"
    proc = start({"launch-0": {"rc": 1, "stderr": stderr}}, decision_seconds=1)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, out
    assert [c["name"] for c in srun_calls(fake)] == ["launch-0"]
    assert "no decision" in read_allocation(paths.allocation(JOB)).note


def test_purposeful_exit_is_never_relaunched(launcher):
    start, paths, fake = launcher
    stderr = "srun: error: node01: task 0: Exited with exit code 18"
    proc = start({"launch-0": {"rc": 18, "stderr": stderr}})
    proc.communicate(timeout=30)
    assert proc.returncode == 18
    assert [c["name"] for c in srun_calls(fake)] == ["launch-0"]


def test_decision_while_running_kills_the_hung_launch_first(launcher):
    start, paths, fake = launcher
    proc = start({"launch-0": {"hang": True}, "launch-1": {"rc": 0}})
    wait_for_state(paths, "running")
    time.sleep(1.0)  # the hung step is listed by squeue
    write_decision(paths.launch_decision(JOB, 0), Decision(0, "relaunch", ("node01",), "hang"))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    cancelled = [json.loads(line) for line in (fake / "scancel.log").read_text().splitlines()]
    assert cancelled == [["--signal=KILL", f"{JOB}.0"]]
    assert nodelist(srun_calls(fake)[1]) == ["node03", "node02"]


def test_too_few_spares_falls_back_to_the_job_level(launcher):
    start, paths, fake = launcher
    proc = start({"launch-0": {"rc": 1, "stderr": "srun: error: node02: task 2: Exited with exit code 1"}})
    wait_for_state(paths, "waiting_decision")
    write_decision(paths.launch_decision(JOB, 0), Decision(0, "relaunch", ("node01", "node02"), "two"))
    proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert [c["name"] for c in srun_calls(fake)] == ["launch-0"]
    assert "1 spare(s) left, 2 needed" in read_allocation(paths.allocation(JOB)).note


def test_decision_written_by_another_user_is_not_obeyed(launcher):
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    start, paths, fake = launcher
    proc = start({"launch-0": {"rc": 1, "stderr": "srun: error: node02: task 2: Killed"}}, decision_seconds=3)
    wait_for_state(paths, "waiting_decision")
    forged = paths.launch_decision(JOB, 0)
    write_decision(forged, Decision(0, "relaunch", ("node02",), "forged"))
    os.chown(forged, 65534, 65534)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "not the run's owner" in out, out
    assert [c["name"] for c in srun_calls(fake)] == ["launch-0"]


def test_unhealthy_node_is_never_launched_on_and_too_many_end_the_job(launcher):
    start, paths, fake = launcher
    proc = start({"health-check": {"unhealthy": {"node01": "GPU 3 has uncorrected ECC errors"}}}, health=True)
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    calls = srun_calls(fake)
    assert [c["name"] for c in calls] == ["health-check", "launch-0"]
    assert nodelist(calls[1]) == ["node02", "node03"]
    assert read_allocation(paths.allocation(JOB)).unhealthy == {"node01": "GPU 3 has uncorrected ECC errors"}

    (fake / "srun.log").unlink()
    proc = start({"health-check": {"unhealthy": {"node01": "full", "node03": "full"}}}, health=True)
    proc.communicate(timeout=30)
    assert proc.returncode == 20  # ExitCode.UNHEALTHY_NODES: the controller restarts at job level
    assert [c["name"] for c in srun_calls(fake)] == ["health-check"]
