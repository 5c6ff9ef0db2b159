"""The probe job on the real local SLURM cluster, through `runctl submit` and `runctl check-env`:
an interpreter without torch, a set-up command that fails and a dataset the node cannot read
are each caught by a job on a node, with one clear message, and no training job is queued. The
passing probe runs in every real-cluster `runctl submit` of the suite (test_site_env_slurm.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fakes import REPO  # noqa: F401 - puts tests/controller on the path first
from one_rank_run import one_rank_config, submit_environment, write_config

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths
from orchestrator.slurm.render import run_job_name

pytestmark = pytest.mark.slurm


@pytest.fixture
def one_rank(local_cluster, tmp_path, monkeypatch):
    submit_environment(local_cluster, monkeypatch)
    return one_rank_config(tmp_path)


def queued_names(local_cluster) -> list[str]:
    listed = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, env=local_cluster.slurm_env())
    return listed.stdout.split()


def a_venv_without_torch(tmp_path, _config, _data_dir):
    venv = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _config["cluster"]["python"] = str(venv / "bin" / "python")
    return [], "FAIL  import torch: ModuleNotFoundError: No module named 'torch'"


def a_setup_command_that_fails(_tmp_path, config, _data_dir):
    config["cluster"]["setup"] = [["true"], ["test", "-d", "/no/such/module/tree"]]
    return [], "FAIL  setup: cluster.setup[1] failed: test -d /no/such/module/tree (exit 1)"


def a_dataset_the_node_cannot_read(_tmp_path, _config, data_dir):
    (data_dir / "corpus.bin").unlink()
    (data_dir / "corpus.bin").mkdir()  # root reads any file: a folder in its place is unreadable
    return ["--skip-host-checks"], f"FAIL  data readable: {data_dir / 'corpus.bin'}: Is a directory"


@pytest.mark.parametrize("case", [a_venv_without_torch, a_setup_command_that_fails, a_dataset_the_node_cannot_read])
def test_the_probe_catches_it_and_nothing_is_queued(case, one_rank, local_cluster, tmp_path, capsys):
    config, data_dir = one_rank
    flags, said = case(tmp_path, config, data_dir)
    path = write_config(tmp_path, config, "probe.yaml")
    run_dir = tmp_path / "run"
    code = main(["submit", path, "--run-dir", str(run_dir), "--probe-timeout", "180", *flags])
    err = capsys.readouterr().err
    with capsys.disabled():
        print(err)
    assert code == 2, err
    assert "the nodes cannot run this training; nothing was submitted" in err and said in err
    assert not RunPaths.of(run_dir).config.exists(), "no run directory is made for a run that cannot start"
    assert run_job_name(config["name"], str(run_dir)) not in queued_names(local_cluster)


def test_check_env_says_the_same_without_a_run(one_rank, tmp_path, capsys):
    config, data_dir = one_rank
    _, said = a_setup_command_that_fails(tmp_path, config, data_dir)
    path = write_config(tmp_path, config, "probe.yaml")
    assert main(["check-env", path, "--run-dir", str(tmp_path / "run"), "--timeout", "180"]) == 2
    out = capsys.readouterr().out
    assert said in out and out.rstrip().endswith("the nodes cannot run this training as configured")
    assert not (tmp_path / "run").exists()
