"""The reading layer (orchestrator/slurm/answers.py) reads the recorded answers of every SLURM
release from 22.05 to 25.11 (tests/slurm/answers/: 22.05 captured on the local cluster, the others
written from SchedMD's sources, see write_fixtures.py) to the same jobs, and refuses what it does
not understand, naming the field, the value and the release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.slurm.answers import SlurmAnswerError, jobs_from_json, jobs_from_text
from orchestrator.slurm.base import JobState
from orchestrator.slurm.node_query import nodes_from_text
from orchestrator.slurm.release_shapes import DATA_PARSERS

ANSWERS = Path(__file__).parent / "answers"
S = JobState
# job id -> (state, exit code, signal, held, nodes): the same on every release.
EXPECTED = {
    "17001": (S.COMPLETED, 0, None, False, ["node01"]),
    "17002": (S.TIMEOUT, 143, 15, False, ["node01"]),
    "17004": (S.FAILED, 3, None, False, ["node01"]),
    "17005": (S.RUNNING, None, None, False, ["node01"]),
    "17006": (S.CANCELLED, 143, 15, False, ["node01"]),
    "17007": (S.PENDING, None, None, False, []),  # requeued
    "17008": (S.HELD, None, None, True, []),  # requeued and held
    "17009": (S.PENDING, None, None, False, []),
    "17010": (S.HELD, None, None, True, []),
    "17011": (S.CANCELLED, 0, None, False, []),  # cancelled while pending
    "17012": (S.COMPLETING, None, None, False, ["node01", "node02"]),  # not ended yet
    "17013": (S.NODE_FAIL, 0, None, False, ["node03"]),
    "17014": (S.FAILED, 137, 9, False, ["node04"]),  # out of memory
    "17015": (S.CANCELLED, 143, 15, False, ["node02"]),  # preempted
    "17016": (S.PENDING, None, None, False, []),  # launch failed, requeued
}


def _check(jobs, release: str, expected=EXPECTED) -> None:
    got = {j.job_id: (j.state, j.exit_code, j.signal, j.held, j.nodes) for j in jobs}
    want = {k: v for k, v in expected.items() if k in got}
    assert got == want, release
    by_id = {j.job_id: j for j in jobs}
    assert by_id["17005"].end_time is None and by_id["17005"].start_time, "a running job has no end yet"
    assert by_id["17004"].end_time and by_id["17004"].submit_time, "ended: its times are read"
    assert by_id["17009"].start_time is None, "a pending job never started"


@pytest.mark.parametrize("release", list(DATA_PARSERS))
def test_squeue_json_of_every_release(release):
    text = (ANSWERS / f"squeue-json-{release}.json").read_text()
    data = json.loads(text)
    assert data["fixture"]["release"] == release and data["fixture"]["source"]
    jobs = jobs_from_json(text, lambda: "fixture")
    assert len(jobs) == len(EXPECTED)
    _check(jobs, release)


@pytest.mark.parametrize("release", ["22.05", "25.11"])
def test_squeue_text_of_both_exit_code_forms(release):
    jobs = jobs_from_text((ANSWERS / f"squeue-text-{release}.txt").read_text(), release)
    # 22.05's text was captured a little later: the requeued job had started again.
    later = {"17003": EXPECTED["17001"], "17007": (S.RUNNING, None, None, False, ["node01"])}
    _check(jobs, release, {**EXPECTED, **later} if release == "22.05" else EXPECTED)
    assert len(jobs) == (11 if release == "22.05" else len(EXPECTED))
    assert {j.job_id: j.reason for j in jobs}["17008"] in ("job requeued in held state", "JobHeldUser")


@pytest.mark.parametrize("release", ["22.05", "23.11", "24.11"])
def test_an_unknown_state_is_refused_naming_field_value_and_release(release):
    data = json.loads((ANSWERS / f"squeue-json-{release}.json").read_text())
    record = data["jobs"][3]
    record["job_state"] = "QUANTUM" if release == "22.05" else ["PENDING", "QUANTUM"]
    with pytest.raises(SlurmAnswerError) as info:
        jobs_from_json(json.dumps(data), lambda: "fixture")
    message = str(info.value)
    print(message)
    full = data["meta"].get("slurm", data["meta"].get("Slurm"))["release"]
    assert "job_state" in message and "QUANTUM" in message and full in message


@pytest.mark.parametrize(
    "field, value",
    [("exit_code", {"status": ["MYSTERY"], "return_code": {"set": True, "infinite": False, "number": 0}}),
     ("exit_code", "seven"), ("end_time", {"number": 5}), ("job_state", ["RUNNING", "PENDING"])],
)  # fmt: skip
def test_other_unreadable_fields_are_refused_not_guessed(field, value):
    data = json.loads((ANSWERS / "squeue-json-24.11.json").read_text())
    record = data["jobs"][0]  # COMPLETED: exit code and end time are read
    record[field] = value
    with pytest.raises(SlurmAnswerError, match=field.split("_")[0]):
        jobs_from_json(json.dumps(data), lambda: "fixture")


SCONTROL_NODE_24_11 = (
    # Written from slurm-24-11-7-1's src/api/node_info.c (one_liner: line_end is " ", after
    # "Partitions=%s " comes another): two spaces, then Reason followed by Comment.
    "NodeName=node04 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=0.00 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=38604 Version=24.11.5 OS=Linux 6.1.0 #1 SMP  RealMemory=4000 AllocMem=0 FreeMem=N/A Sockets=8 "
    "Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=debug,gpu  BootTime=None SlurmdStartTime=None LastBusyTime=2026-12-05T01:56:09 "
    "ResumeAfterTime=None CfgTRES=cpu=8,mem=4000M,billing=8 AllocTRES= CurrentWatts=n/a AveWatts=n/a "
    "Reason=disk errors | seen twice [root@2026-12-05T01:59:06] Comment=rack 7\n"
)


def test_scontrol_node_text_keeps_partitions_on_22_05_and_24_11():
    nodes = nodes_from_text((ANSWERS / "scontrol-node-22.05.txt").read_text())
    assert [n.partitions for n in nodes.values()] == [("debug",)] * 4
    assert nodes["node04"].drained and nodes["node04"].reason.startswith("disk errors | seen twice")
    node = nodes_from_text(SCONTROL_NODE_24_11)["node04"]
    assert node.partitions == ("debug", "gpu")
    assert node.reason == "disk errors | seen twice [root@2026-12-05T01:59:06]"
    assert node.states == {"IDLE", "DRAIN"}


def test_the_unknown_state_fixture_is_refused_naming_field_value_and_release():
    text = (ANSWERS / "squeue-json-25.11-unknown-state.json").read_text()
    with pytest.raises(SlurmAnswerError) as info:
        jobs_from_json(text, lambda: "fixture")
    print(info.value)
    assert (info.value.field, info.value.release) == ("job_state", "25.11.1")
    assert "HIBERNATING" in str(info.value) and "25.11.1" in str(info.value)
