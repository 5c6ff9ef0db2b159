"""The mocked SLURM: its scenario state machine, its shims (driven by the real backend), and its
execute mode (batch scripts really run here with an srun that starts the tasks)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from orchestrator.errors import SchedulerError
from orchestrator.plan.config import load_config
from orchestrator.slurm.base import JobState, SubmitRequest
from orchestrator.slurm.mock import MockScheduler, write_shims
from orchestrator.slurm.real import SlurmScheduler
from orchestrator.slurm.render import render_sbatch

REPO = Path(__file__).resolve().parents[2]


def script(tmp_path: Path, body: str = "true", name: str = "job.sh", header: str = "") -> Path:
    path = tmp_path / name
    path.write_text(
        f"#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --output={tmp_path}/out-%j.txt\n{header}{body}\n"
    )
    return path


def states(sched, ids):
    return [info.state for info in sched.jobs(ids).values()]


def test_default_scenario_moves_pending_running_completed(mock_slurm_dir, tmp_path):
    sched = MockScheduler(mock_slurm_dir)
    job = sched.submit(SubmitRequest(script=script(tmp_path), job_name="a"))
    seen = [sched.jobs([job])[job].state for _ in range(5)]
    print(seen)
    assert seen == [
        JobState.PENDING,
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.COMPLETED,
        JobState.COMPLETED,
    ]
    info = sched.jobs([job])[job]
    assert info.exit_code == 0 and info.nodes == ["node01", "node02"]


@pytest.mark.parametrize(
    "end, code, expected",
    [("FAILED", 1, JobState.FAILED), ("TIMEOUT", 0, JobState.TIMEOUT), ("COMPLETED", 18, JobState.COMPLETED),
     ("NODE_FAIL", 1, JobState.NODE_FAIL), ("FAILED", 17, JobState.FAILED)],
)  # fmt: skip
def test_scenarios_drive_each_end_state_and_exit_code(mock_slurm_dir, tmp_path, end, code, expected):
    sched = MockScheduler(mock_slurm_dir)
    sched.slurm.push_scenario([{"state": "RUNNING", "polls": 1}, {"state": end, "exit_code": code}])
    job = sched.submit(SubmitRequest(script=script(tmp_path), job_name="a"))
    assert states(sched, [job]) == [JobState.RUNNING]
    info = sched.jobs([job])[job]
    assert (info.state, info.exit_code) == (expected, code)


def test_scenario_with_unknown_state_is_refused(mock_slurm_dir):
    with pytest.raises(ValueError, match="unknown SLURM job state"):
        MockScheduler(mock_slurm_dir).slurm.push_scenario([{"state": "RUNING"}])


def test_singleton_chain_runs_one_after_another(mock_slurm_dir, tmp_path):
    sched = MockScheduler(mock_slurm_dir)
    ids = [
        sched.submit(SubmitRequest(script=script(tmp_path), job_name="run", dependency="singleton"))
        for _ in range(3)
    ]
    history = []
    for _ in range(14):
        history.append([s.value for s in states(sched, ids)])
    print("\n".join(" ".join(h) for h in history))
    for row in history:
        assert sum(s == "running" for s in row) <= 1, f"two jobs of one singleton chain ran together: {row}"
    assert history[-1] == ["completed"] * 3
    assert sched.jobs([ids[1]])  # known
    first_running = [next(i for i, h in enumerate(history) if h[k] == "running") for k in range(3)]
    assert first_running == sorted(first_running) and len(set(first_running)) == 3


def test_hold_release_cancel_and_exclude(mock_slurm_dir, tmp_path):
    sched = MockScheduler(mock_slurm_dir)
    job = sched.submit(SubmitRequest(script=script(tmp_path), job_name="a", hold=True))
    for _ in range(3):
        info = sched.jobs([job])[job]
        assert info.state == JobState.HELD and info.held and info.reason == "JobHeldUser"
    sched.update_exclude([job], ["node07", "node09"])
    assert sched.slurm.job(job)["exclude"] == "node07,node09"
    sched.release([job])
    assert sched.jobs([job])[job].state == JobState.PENDING
    assert sched.jobs([job])[job].state == JobState.RUNNING
    with pytest.raises(SchedulerError, match="no longer pending"):
        sched.update_exclude([job], ["node01"])
    sched.cancel([job], signal="USR1")
    assert sched.slurm.job(job)["signals"] == ["USR1"]
    sched.cancel([job])
    info = sched.jobs([job])[job]
    assert info.state == JobState.CANCELLED and info.state.is_terminal
    assert sched.jobs(["424242"])["424242"].state == JobState.UNKNOWN
    commands = [c[0] + " " + c[1] for c in sched.slurm.commands()]
    print(commands)
    for expected in (
        "sbatch --parsable",
        "scontrol update",
        "scontrol release",
        "scancel --signal=USR1",
        "squeue --states=all",
    ):
        assert expected in commands


def test_a_reader_that_leaves_early_gets_no_traceback_from_the_mock(mock_slurm_dir, tmp_path):
    """Every job script runs `scontrol show hostnames ... | head -n 1`: the mock's scontrol once
    printed a BrokenPipeError traceback into every mock job's log. A list longer than a pipe's
    buffer makes head leave before scontrol has written it all, every time."""
    import subprocess

    shims = tmp_path / "bin"
    write_shims(shims, mock_slurm_dir)
    proc = subprocess.run(
        "scontrol show hostnames 'node[00001-20000]' | head -n 1", shell=True, capture_output=True, text=True,
        env=dict(os.environ, PATH=f"{shims}:{os.environ['PATH']}"), timeout=60,
    )  # fmt: skip
    print(proc.stderr)
    assert proc.stdout == "node00001\n"
    assert proc.stderr == "", "a reader leaving early must not print anything into the job's log"


def test_real_backend_drives_the_mock_through_shims(mock_slurm_dir, tmp_path):
    """What a team's CI does: the shims on PATH, and any tool (here our own SlurmScheduler)."""
    shims = tmp_path / "bin"
    write_shims(shims, mock_slurm_dir)
    env = dict(os.environ, PATH=f"{shims}:{os.environ['PATH']}", RUNCTL_MOCK_SLURM_DIR=str(mock_slurm_dir))
    sched = SlurmScheduler(env=env)
    job = sched.submit(
        SubmitRequest(script=script(tmp_path), job_name="ci", dependency="singleton", hold=True)
    )
    assert job.isdigit()
    assert sched.jobs([job])[job].state == JobState.HELD
    assert sched.show_job(job)["JobState"] == "PENDING"
    sched.release([job])
    seen = [sched.jobs([job])[job].state for _ in range(5)]
    print(seen)
    assert JobState.RUNNING in seen and seen[-1] == JobState.COMPLETED
    recorded = MockScheduler(mock_slurm_dir).slurm.commands()
    assert recorded[0][:2] == ["sbatch", "--parsable"] and ["scontrol", "release", job] in recorded
    with pytest.raises(SchedulerError, match="Invalid job id"):
        sched.hold(["99999"])


# ------------------------------------------------------------------------------- execute mode
def wait_terminal(sched, job, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = sched.jobs([job])[job]
        if info.state.is_terminal:
            return info
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not end in {timeout} s: {sched.jobs([job])[job]}")


def test_execute_mode_runs_the_rendered_script_with_srun_tasks(mock_slurm_dir, tmp_path):
    cfg = load_config(REPO / "configs" / "demo-cpu-4node.yaml")
    run_dir = tmp_path / "run"
    (run_dir / "jobs").mkdir(parents=True)
    probe = ('echo "task $SLURM_PROCID/$SLURM_NTASKS local=$SLURM_LOCALID node=$SLURM_NODEID host=$SLURMD_NODENAME '
             'nnodes=$SLURM_NNODES list=$SLURM_JOB_NODELIST job=$SLURM_JOB_ID master=$MASTER_ADDR:$MASTER_PORT"; exit 18')  # fmt: skip
    path = run_dir / "job.sbatch"
    path.write_text(render_sbatch(cfg, str(run_dir), command=["bash", "-c", probe]))
    sched = MockScheduler(mock_slurm_dir, execute=True)
    job = sched.submit(SubmitRequest(script=path, job_name="exec"))
    info = wait_terminal(sched, job)
    out = (run_dir / "jobs" / f"slurm-{job}.out").read_text()
    print(out)
    assert "NOT SLURM" in out
    # Every rank gets the address and port the job's launcher announced for launch 0.
    port = re.search(
        r"runctl launcher: launch 0 on .* MASTER_ADDR=127\.0\.0\.1 MASTER_PORT=(\d+)", out
    ).group(1)
    for rank in range(4):
        assert (
            f"task {rank}/4 local=0 node={rank} host=node0{rank + 1} nnodes=4 list=node[01-04] job={job} master=127.0.0.1:{port}"
            in out
        )
    # the ranks' exit code (18: time budget) comes back through srun and the launcher
    assert (info.state, info.exit_code) == (JobState.FAILED, 18)
    assert (run_dir / "jobs" / job / "slurm.out").resolve() == (
        run_dir / "jobs" / f"slurm-{job}.out"
    ).resolve()


def test_execute_mode_kill_on_bad_exit_and_cancel(mock_slurm_dir, tmp_path):
    sched = MockScheduler(mock_slurm_dir, execute=True)
    body = "exec srun --kill-on-bad-exit=1 --wait=30 --ntasks-per-node=2 bash -c 'if [ \"$SLURM_PROCID\" = 3 ]; then exit 7; fi; sleep 60'"
    started = time.time()
    job = sched.submit(SubmitRequest(script=script(tmp_path, body), job_name="bad"))
    info = wait_terminal(sched, job)
    print(f"one rank failed; the step ended after {time.time() - started:.1f} s")
    assert (info.state, info.exit_code) == (JobState.FAILED, 7)
    assert time.time() - started < 15, "--kill-on-bad-exit must end the other ranks at once"
    # cancel: the running job ends CANCELLED, its queued singleton successor never runs
    long = script(tmp_path, "exec srun sleep 60", name="long.sh")
    first = sched.submit(SubmitRequest(script=long, job_name="chain", dependency="singleton"))
    second = sched.submit(SubmitRequest(script=long, job_name="chain", dependency="singleton"))
    deadline = time.time() + 15
    while sched.jobs([first])[first].state != JobState.RUNNING and time.time() < deadline:
        time.sleep(0.1)
    assert sched.jobs([second])[second].reason == "Dependency"
    sched.cancel([second, first])
    assert wait_terminal(sched, first, 10).state == JobState.CANCELLED
    assert wait_terminal(sched, second, 10).state == JobState.CANCELLED
    assert sched.jobs([second])[second].start_time is None


def test_execute_mode_time_limit_sends_the_warning_signal_then_times_out(mock_slurm_dir, tmp_path):
    # --time=0:04 is 4 s; USR1 comes 2 s before. The trap stands in for the trainer's save-and-exit.
    marker = tmp_path / "got-usr1"
    body = f"trap 'touch {marker}' USR1\nexec srun bash -c 'trap \"touch {marker}; exit 18\" USR1; sleep 30 & wait'"
    header = "#SBATCH --time=0:04\n#SBATCH --signal=USR1@2\n"
    sched = MockScheduler(mock_slurm_dir, execute=True)
    job = sched.submit(SubmitRequest(script=script(tmp_path, body, header=header), job_name="t"))
    info = wait_terminal(sched, job)
    assert marker.exists(), "the pre-timeout signal must reach the task"
    # the task saved and left with 18 before the limit: the job ends FAILED(18), not TIMEOUT
    assert (info.state, info.exit_code) == (JobState.FAILED, 18)


@pytest.mark.parametrize("release", ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11"])
def test_every_release_shape_reads_to_the_same_jobs(mock_slurm_dir, tmp_path, monkeypatch, release):
    """The mock answers in RUNCTL_MOCK_SLURM_RELEASE's shape; the in-process scheduler and the
    real backend over the shims (which picks text or --json by `squeue --version`) read the same."""
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_RELEASE", release)
    sched = MockScheduler(mock_slurm_dir)
    sched.slurm.push_scenario([{"state": "RUNNING", "polls": 1}, {"state": "FAILED", "exit_code": 3}])
    failing = sched.submit(SubmitRequest(script=script(tmp_path), job_name="a"))
    held = sched.submit(SubmitRequest(script=script(tmp_path), job_name="a", hold=True))
    sched.slurm.push_scenario([{"state": "RUNNING", "polls": 10**6}])
    running = sched.submit(SubmitRequest(script=script(tmp_path), job_name="b"))
    assert states(sched, [failing, held, running]) == [JobState.RUNNING, JobState.HELD, JobState.RUNNING]
    sched.cancel([running])
    readers = [sched]
    if release in ("22.05", "24.11", "25.11"):  # text, --json with a list status, text EXIT:SIGNAL
        write_shims(tmp_path / "bin", mock_slurm_dir)
        readers.append(SlurmScheduler(env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}))
    for reader in readers:
        infos = reader.jobs([failing, held, running, "999"])
        got = {j: (i.state, i.exit_code, i.signal, i.held) for j, i in infos.items()}
        assert got == {
            failing: (JobState.FAILED, 3, None, False),
            held: (JobState.HELD, None, None, True),
            running: (JobState.CANCELLED, 143, 15, False),
            "999": (JobState.UNKNOWN, None, None, False),
        }, (release, reader.name)
        assert infos[running].nodes == ["node01", "node02"] and infos[running].end_time
    assert sorted(readers[-1].jobs_by_name("a")) == sorted([failing, held])
    if len(readers) == 2:
        assert readers[1].slurm_release()[0] == int(release[:2])


@pytest.mark.parametrize("label", [True, False], ids=["label", "no-label"])
def test_mock_srun_labels_each_task_line_as_slurm_does(tmp_path, label):
    """srun --label: every line of a task's stdout and stderr starts with its task number,
    right-aligned to the width of the largest (12 tasks: ` 3: `, `11: `), as `runctl logs` and
    the failing rank's reader expect; without --label the lines are the tasks' own."""
    import subprocess
    import sys

    env = {**os.environ, "SLURM_JOB_NODELIST": "node[01-04]", "PYTHONPATH": str(REPO)}
    env.pop("RUNCTL_MOCK_SLURM_DIR", None)
    task = "import os, sys; r = os.environ['SLURM_PROCID']; print(f'out {r}', flush=True); print(f'err {r}', file=sys.stderr)"
    argv = ["srun", *(["--label"] if label else []), "--nodes=4", "--ntasks-per-node=3", sys.executable, "-c", task]
    proc = subprocess.run([sys.executable, "-m", "orchestrator.slurm.mock_cli", *argv], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0
    lines = set(proc.stdout.splitlines()) | {x for x in proc.stderr.splitlines() if "NOT SLURM" not in x}
    if label:
        assert {f"{r:>2}: out {r}" for r in range(12)} | {f"{r:>2}: err {r}" for r in range(12)} <= lines
        assert not [x for x in lines if x.startswith(("out", "err"))]
    else:  # the tasks' own lines (several processes on one pipe: only the absence of labels is sure)
        assert not [x for x in lines if re.match(r"^ *\d+: ", x)] and any(x.startswith("out") for x in lines)
