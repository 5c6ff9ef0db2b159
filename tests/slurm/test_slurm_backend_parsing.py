"""The real backend reads SLURM's output strictly: known answers parse, anything else is a
SchedulerError that shows the output. Fake `squeue`/`sbatch`/`sacct` executables stand in for
SLURM's answers, including ones recorded from slurm-wlm 22.05."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from orchestrator.errors import SchedulerError
from orchestrator.slurm.base import JobState, SubmitRequest
from orchestrator.slurm.hostlist import compress_hostlist, expand_hostlist
from orchestrator.slurm.real import SlurmScheduler, decode_wait_status, parse_scontrol_record

# Trimmed from `squeue --json` of slurm-wlm 22.05.8 on the local cluster.
SQUEUE_22_05 = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
    "errors": [],
    "jobs": [
        {"job_id": 1, "name": "j.sh", "job_state": "COMPLETED", "state_reason": "None", "exit_code": 0,
         "nodes": "node[01-04]", "start_time": 1795999348, "end_time": 1795999349},
        {"job_id": 2, "name": "f.sh", "job_state": "FAILED", "state_reason": "NonZeroExitCode", "exit_code": 4352,
         "nodes": "node01", "start_time": 1795999356, "end_time": 1795999356},
        {"job_id": 3, "name": "s.sh", "job_state": "PENDING", "state_reason": "JobHeldUser", "exit_code": 0,
         "nodes": "", "start_time": 0, "end_time": 0},
        {"job_id": 4, "name": "x", "job_state": "RUNNING", "state_reason": "None", "exit_code": 0,
         "nodes": "node01", "start_time": 1795999356, "end_time": 1827535356},
        {"job_id": 5, "name": "x", "job_state": "PENDING", "state_reason": "Dependency", "exit_code": 0,
         "nodes": "", "start_time": 0, "end_time": 0},
        {"job_id": 6, "name": "x", "job_state": "CANCELLED", "state_reason": "None", "exit_code": 15,
         "nodes": "node02", "start_time": 1795999356, "end_time": 1795999357},
    ],
}  # fmt: skip


def fake_tools(tmp_path: Path, **outputs: tuple[int, str, str]) -> dict[str, str]:
    """Executables named like SLURM's tools that print a fixed answer and log their argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, (code, out, err) in outputs.items():
        (tmp_path / f"{name}.out").write_text(out)
        (tmp_path / f"{name}.err").write_text(err)
        path = bin_dir / name
        path.write_text(
            f'#!/bin/sh\necho "$0 $*" >> {tmp_path}/argv.log\ncat {tmp_path}/{name}.out\n'
            f"cat {tmp_path}/{name}.err >&2\nexit {code}\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


def test_squeue_json_of_22_05_maps_states_exit_codes_and_nodes(tmp_path):
    env = fake_tools(
        tmp_path,
        squeue=(0, json.dumps(SQUEUE_22_05), ""),
        sacct=(1, "", "Slurm accounting storage is disabled\n"),
    )
    jobs = SlurmScheduler(env=env).jobs(["1", "2", "3", "4", "5", "6", "77"])
    got = {j: (i.state, i.exit_code, i.nodes, i.reason) for j, i in jobs.items()}
    print(got)
    assert got["1"] == (JobState.COMPLETED, 0, ["node01", "node02", "node03", "node04"], "")
    assert got["2"] == (JobState.FAILED, 17, ["node01"], "NonZeroExitCode")  # 4352 = 17 << 8
    assert got["3"][0] == JobState.HELD and jobs["3"].held
    assert got["4"][:2] == (JobState.RUNNING, None) and jobs["4"].end_time is None
    assert got["5"] == (JobState.PENDING, None, [], "Dependency")
    assert (got["6"][0], got["6"][1], jobs["6"].signal) == (JobState.CANCELLED, 128 + 15, 15)
    assert got["77"][0] == JobState.UNKNOWN  # gone from squeue, no accounting
    by_name = SlurmScheduler(env=env).jobs_by_name("x")
    assert sorted(by_name) == ["4", "5", "6"]


def test_sacct_is_asked_for_jobs_squeue_forgot(tmp_path):
    env = fake_tools(tmp_path, squeue=(0, json.dumps({"jobs": []}), ""),
                     sacct=(0, "41|run|COMPLETED|0:0|node[01-02]\n42|run|TIMEOUT|0:15|node01\n", ""))  # fmt: skip
    jobs = SlurmScheduler(env=env).jobs(["41", "42"])
    assert (jobs["41"].state, jobs["41"].exit_code, jobs["41"].nodes) == (
        JobState.COMPLETED,
        0,
        ["node01", "node02"],
    )
    assert (jobs["42"].state, jobs["42"].exit_code) == (JobState.TIMEOUT, 143)
    assert "sacct -n -P -X -j 41,42" in (tmp_path / "argv.log").read_text()


@pytest.mark.parametrize(
    "tool, answer",
    [("squeue", "this is not json"), ("squeue", '{"no_jobs": []}'), ("squeue", '{"jobs": [{"job_id": 1, "job_state": "WEIRD"}]}'),
     ("sacct", "41|run|COMPLETED\n")],
)  # fmt: skip
def test_unparseable_answers_are_errors_that_show_the_output(tmp_path, tool, answer):
    outputs = {
        "squeue": (0, answer if tool == "squeue" else '{"jobs": []}', ""),
        "sacct": (0, answer if tool == "sacct" else "", ""),
    }
    env = fake_tools(tmp_path, **outputs)
    with pytest.raises(SchedulerError) as info:
        SlurmScheduler(env=env).jobs(["41"])
    print(info.value)
    shown = answer.strip().split("\n")[0][:20]
    assert shown in str(info.value) or "WEIRD" in str(info.value)


def test_sbatch_answers(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    request = SubmitRequest(
        script=script, job_name="run", dependency="singleton", hold=True, exclude=["node03"]
    )
    env = fake_tools(tmp_path, sbatch=(0, "1234;cluster\n", ""))
    assert SlurmScheduler(env=env).submit(request) == "1234"
    argv = (tmp_path / "argv.log").read_text()
    assert "--parsable --job-name=run --dependency=singleton --hold --exclude=node03" in argv
    env = fake_tools(tmp_path, sbatch=(0, "Submitted batch job 1234\n", ""))
    with pytest.raises(SchedulerError, match="Submitted batch job 1234"):
        SlurmScheduler(env=env).submit(request)
    env = fake_tools(
        tmp_path,
        sbatch=(1, "", "sbatch: error: Batch job submission failed: Invalid partition name specified\n"),
    )
    with pytest.raises(SchedulerError, match="Invalid partition name"):
        SlurmScheduler(env=env).submit(request)


def test_missing_tools_say_what_to_do(tmp_path):
    with pytest.raises(SchedulerError, match="RUNCTL_SCHEDULER=mock"):
        SlurmScheduler(env={"PATH": str(tmp_path)}).jobs(["1"])


def test_wait_status_hostlists_and_scontrol_records():
    assert decode_wait_status(0) == (0, None)
    assert decode_wait_status(18 << 8) == (18, None)
    assert decode_wait_status(9) == (137, 9)
    assert expand_hostlist("node[01-03,07],gpu-a[9-10],login1") == [
        "node01",
        "node02",
        "node03",
        "node07",
        "gpu-a9",
        "gpu-a10",
        "login1",
    ]
    assert compress_hostlist(["node01", "node02", "node03", "node07", "login"]) == "login,node[01-03,07]"
    assert expand_hostlist("node[01-02,01]") == ["node01", "node02", "node01"], "SLURM keeps a repeated name"
    names = [f"node{k:02d}" for k in range(1, 49)]
    assert expand_hostlist(compress_hostlist(names)) == names
    with pytest.raises(ValueError):
        expand_hostlist("node[01-")
    record = parse_scontrol_record(
        "JobId=5 JobName=x JobState=PENDING Reason=Dependency Command=/a b/c.sh WorkDir=/tmp"
    )
    assert record["JobState"] == "PENDING" and record["Command"] == "/a b/c.sh"
    with pytest.raises(SchedulerError, match="cannot parse"):
        parse_scontrol_record("slurm_load_jobs error: Invalid job id specified")
