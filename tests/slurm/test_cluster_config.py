"""The local cluster's generated config and the backend selection: no daemons needed."""

from __future__ import annotations

import re

import pytest

from orchestrator.errors import UsageError
from orchestrator.slurm import get_scheduler, scheduler_name
from orchestrator.slurm.local_cluster import ClusterError, ClusterSpec, LocalCluster
from orchestrator.slurm.mock import MockScheduler


def test_slurm_conf_has_one_port_per_node_and_gres_files_for_48_nodes(tmp_path):
    cluster = LocalCluster(tmp_path)
    spec = ClusterSpec(nodes=48, gpus_per_node=8, ctld_port=20017, slurmd_base_port=21001)
    conf = cluster.render_slurm_conf(spec)
    gres = cluster.render_gres_conf(spec)
    nodes = re.findall(r"^NodeName=(node\d+) NodeHostname=localhost NodeAddr=127.0.0.1 Port=(\d+) .*Gres=gpu:8", conf, re.M)
    assert [n for n, _ in nodes] == [f"node{k:02d}" for k in range(1, 49)]
    assert sorted(int(p) for _, p in nodes) == list(range(21001, 21049))
    for line in ("SlurmctldPort=20017", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SlurmUser=root",
                 "GresTypes=gpu", "SlurmdParameters=config_overrides", f"AuthInfo=socket={tmp_path}/munge/munge.socket.2"):  # fmt: skip
        assert line in conf.splitlines()
    path_keys = ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile", "SlurmdLogFile")
    paths = {k: v for k, _, v in (line.partition("=") for line in conf.splitlines()) if k in path_keys}
    assert len(paths) == len(path_keys) and all(v.startswith("/") for v in paths.values()), (
        f"paths must be absolute, the daemons chdir to /: {paths}"
    )
    assert gres.splitlines()[0] == "AutoDetect=off"
    assert f"NodeName=node48 Name=gpu File={tmp_path}/gres/node48/gpu[0-7]" in gres
    cluster._write_files(spec)
    assert len(list((tmp_path / "gres" / "node07").iterdir())) == 8
    assert oct((tmp_path / "munge" / "munge.key").stat().st_mode & 0o777) == "0o400"
    assert cluster.status()["slurm_conf"] == str(tmp_path / "slurm.conf") and not cluster.status()["up"]


def test_cluster_spec_limits():
    with pytest.raises(ClusterError, match="--nodes"):
        ClusterSpec(nodes=0)
    assert ClusterSpec(nodes=100).node_names()[:2] == ["node001", "node002"]


def test_backend_selection_never_falls_back_to_the_mock(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNCTL_SCHEDULER", "mock")
    assert scheduler_name() == "mock"
    assert isinstance(get_scheduler(directory=tmp_path), MockScheduler)
    monkeypatch.setenv("RUNCTL_SCHEDULER", "pbs")
    with pytest.raises(UsageError, match="slurm, mock"):
        scheduler_name()
    # A login node where SLURM's module is not loaded: an error that says what to load, not the mock.
    monkeypatch.delenv("RUNCTL_SCHEDULER")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on PATH
    for ask in (scheduler_name, get_scheduler):
        with pytest.raises(UsageError, match=r"module load slurm.*RUNCTL_SCHEDULER=mock"):
            ask()
    assert scheduler_name(require_sbatch=False) == "slurm"  # a dry run needs no sbatch
    (tmp_path / "sbatch").write_text("#!/bin/sh\n")
    (tmp_path / "sbatch").chmod(0o755)
    assert scheduler_name() == "slurm"


def test_demo_without_a_cluster_stops_unless_the_mock_is_asked_for(monkeypatch, tmp_path, capsys):
    from orchestrator import demo

    monkeypatch.delenv("RUNCTL_SCHEDULER", raising=False)
    monkeypatch.setattr(demo, "real_cluster_or_reason", lambda nodes, release: (None, "not root (test)"))
    assert demo.main(["--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "not root (test)" in err and "DEMO_ARGS=--mock" in err
    assert not (tmp_path / "run").exists(), "nothing may be submitted anywhere"


@pytest.mark.parametrize(
    ("finished", "saw_steps", "fault_wanted", "fault_done", "incidents", "why"),
    [
        (True, True, True, True, 1, ""),
        (True, True, False, True, 0, ""),
        # the controller could not read the job: the run "finished" unwatched, goodput 0
        (True, False, True, False, 0, "never saw a rank train"),
        (True, True, True, True, 0, "reported no incident"),
        (True, True, True, False, 0, "before the rank could be killed"),
        (False, True, True, True, 1, "did not finish"),
    ],
)
def test_a_demo_that_supervised_nothing_fails(finished, saw_steps, fault_wanted, fault_done, incidents, why):
    from orchestrator.demo import demo_failed

    said = demo_failed(finished, saw_steps, fault_wanted, fault_done, incidents)
    assert (why in said and said) if why else said == ""
