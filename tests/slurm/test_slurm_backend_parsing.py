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

ANSWERS = Path(__file__).parent / "answers"


def fake_tools(tmp_path: Path, release: str = "24.11.5", **outputs: tuple[int, str, str]) -> dict[str, str]:
    """Executables named like SLURM's tools that print a fixed answer and log their argv
    (`squeue --version` says `release`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, (code, out, err) in outputs.items():
        (tmp_path / f"{name}.out").write_text(out)
        (tmp_path / f"{name}.err").write_text(err)
        path = bin_dir / name
        path.write_text(
            f'#!/bin/sh\n[ "$1" = --version ] && echo "slurm {release}" && exit 0\n'
            f'echo "$0 $*" >> {tmp_path}/argv.log\ncat {tmp_path}/{name}.out\n'
            f"cat {tmp_path}/{name}.err >&2\nexit {code}\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize("release", ["22.05.8", "24.11.5"])
def test_each_release_is_asked_by_id_in_the_form_it_filters(tmp_path, release):
    """22.05 to 23.11: text (their --json ignores --jobs); 24.05 on: --json."""
    answer = (
        ANSWERS / ("squeue-text-22.05.txt" if release.startswith("22") else "squeue-json-24.11.json")
    ).read_text()
    env = fake_tools(
        tmp_path, release, squeue=(0, answer, ""), sacct=(1, "", "Slurm accounting storage is disabled\n")
    )
    jobs = SlurmScheduler(env=env).jobs(["17004", "17006", "17010", "77"])
    got = {j: (i.state, i.exit_code, i.nodes, i.held) for j, i in jobs.items()}
    assert got["17004"] == (JobState.FAILED, 3, ["node01"], False)
    assert got["17006"] == (JobState.CANCELLED, 143, ["node01"], False)
    assert got["17010"][0] == JobState.HELD and got["17010"][3]
    assert got["77"][0] == JobState.UNKNOWN  # gone from squeue, no accounting
    squeue_argv = (tmp_path / "argv.log").read_text().splitlines()[0]
    assert "--jobs=17004,17006,17010,77" in squeue_argv and "--states=all" in squeue_argv
    assert ("--json" in squeue_argv) == release.startswith("24")
    by_name = SlurmScheduler(env=env).jobs_by_name("cap-ok")
    assert sorted(by_name) == ["17001"] + (["17003"] if release.startswith("22") else [])


def test_squeue_forgetting_a_single_job_is_not_an_outage_but_silence_is(tmp_path):
    env = fake_tools(tmp_path, "22.05.8", squeue=(1, "", "slurm_load_jobs error: Invalid job id specified\n"),
                     sacct=(1, "", "Slurm accounting storage is disabled\n"))  # fmt: skip
    assert SlurmScheduler(env=env).jobs(["41"])["41"].state == JobState.UNKNOWN
    # 22.05's text squeue with slurmctld stopped (measured on the local cluster: ~30 s, then this).
    env = fake_tools(tmp_path, "22.05.8", squeue=(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"))
    with pytest.raises(SchedulerError, match="Unable to contact slurm controller"):
        SlurmScheduler(env=env).jobs(["41", "42"])
    # 24.11 with slurmctld stopped: exit 1 and no output at all.
    env = fake_tools(tmp_path, "24.11.5", squeue=(1, "", ""))
    with pytest.raises(SchedulerError, match="no output: slurmctld is not answering"):
        SlurmScheduler(env=env).jobs(["41"])


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
    with pytest.raises(SchedulerError, match="expected a wait status or EXIT:SIGNAL"):
        SlurmScheduler(
            env=fake_tools(
                tmp_path, squeue=(0, '{"jobs": []}', ""), sacct=(0, "41|run|COMPLETED|x:y|n1\n", "")
            )
        ).jobs(["41"])


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
    assert shown in str(info.value) or "WEIRD" in str(info.value) or "job_id" in str(info.value)


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
        "JobId=5 JobName=x JobState=PENDING Reason=Dependency Partition=debug  Command=/a b/c.sh WorkDir=/tmp"
    )
    assert record["JobState"] == "PENDING" and record["Command"] == "/a b/c.sh"
    assert record["Partition"] == "debug", "two spaces after a value (as scontrol prints them) are not part of it"
    with pytest.raises(SchedulerError, match="cannot parse"):
        parse_scontrol_record("slurm_load_jobs error: Invalid job id specified")


@pytest.mark.parametrize(("ping", "expected"), [
    ((0, "Slurmctld(primary) at ctl1 is UP\n", ""), None),
    ((1, "Slurmctld(primary) at ctl1 is DOWN\n", ""), SchedulerError),
])  # fmt: skip
def test_a_failed_probe_step_is_the_nodes_only_while_slurmctld_answers(tmp_path, ping, expected):
    """srun fails the same way for a node that does not answer and for a slurmctld that does not:
    `scontrol ping` tells them apart (the node is lost only while the controller is UP)."""
    env = fake_tools(tmp_path, srun=(1, "", "srun: error: Unable to create step for job 7\n"), scontrol=ping)
    scheduler = SlurmScheduler(env=env)
    if expected is None:
        assert scheduler.probe_node("7", "node02", "true", 5.0) is None
    else:
        with pytest.raises(SchedulerError, match="slurmctld does not answer"):
            scheduler.probe_node("7", "node02", "true", 5.0)
    assert "scontrol ping" in (tmp_path / "argv.log").read_text()
    (tmp_path / "ok").mkdir()
    answered = fake_tools(tmp_path / "ok", srun=(0, "rank 1 101 T\nfs ok\n", ""))
    assert SlurmScheduler(env=answered).probe_node("7", "node02", "true", 5.0) == "rank 1 101 T\nfs ok\n"
