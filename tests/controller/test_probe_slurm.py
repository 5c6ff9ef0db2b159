"""The probe job on the real local SLURM cluster, through `runctl submit` and `runctl check-env`:
an interpreter without torch, a set-up command that fails and a dataset the node cannot read
are each caught by a job on a node, with one clear message, and no training job is queued. The
passing probe runs in every real-cluster `runctl submit` of the suite (test_site_env_slurm.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml
from fakes import REPO

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths
from orchestrator.slurm.render import run_job_name

pytestmark = pytest.mark.slurm
CORPUS = REPO / "data" / "corpus" / "multilingual_text_document"


@pytest.fixture
def one_rank(local_cluster, tmp_path, monkeypatch):
    for name, value in {**local_cluster.env(), "RUNCTL_SCHEDULER": "slurm", "PYTHONPATH": str(REPO),
                        "PATH": local_cluster.slurm_env()["PATH"]}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for suffix in (".bin", ".idx"):
        shutil.copy(CORPUS.with_name(CORPUS.name + suffix), data_dir / f"corpus{suffix}")
    config = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    config["cluster"].update(nodes=1, gpus_per_node=1, python=sys.executable, spare_nodes=0)
    config["parallel"].update(tp=1, pp=1, global_batch_size=8)
    config["data"].update(datasets=[{"path": str(data_dir / "corpus")}], tokenizer=str(REPO / "data" / "tokenizer.json"))
    return config, data_dir


def write(tmp_path, config) -> str:
    path = tmp_path / "probe.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


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
    path = write(tmp_path, config)
    run_dir = tmp_path / "run"
    code = main(["submit", path, "--run-dir", str(run_dir), "--probe-timeout", "180", *flags])
    err = capsys.readouterr().err
    with capsys.disabled():
        print(err)
    assert code == 2, err
    assert "the nodes cannot run this training; nothing was submitted" in err and said in err
    assert not RunPaths.of(run_dir).config.exists(), "no run directory is made for a run that cannot start"
    assert run_job_name(config["name"], str(run_dir)) not in queued_names(local_cluster)
    # check-env says the same, without a run
    assert main(["check-env", path, "--run-dir", str(run_dir), "--timeout", "180"]) == 2
    assert said in capsys.readouterr().out
