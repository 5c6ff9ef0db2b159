"""The smallest real run there is, for the real-cluster tests driven through the CLI: one rank on
one node (tp = pp = dp = 1) of the demo model, on a private copy of the shipped corpus (a test may
take it away), with the environment a job inherits from `runctl submit` (sbatch's --export=ALL)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml
from fakes import REPO

CORPUS = REPO / "data" / "corpus" / "multilingual_text_document"


def submit_environment(local_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**local_cluster.env(), "RUNCTL_SCHEDULER": "slurm", "PYTHONPATH": str(REPO),
                        "PATH": local_cluster.slurm_env()["PATH"], "TRAINER_TENSORBOARD": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)


def one_rank_config(tmp_path: Path) -> tuple[dict, Path]:
    """(the config as a dict, the folder holding its corpus.bin/.idx)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for suffix in (".bin", ".idx"):
        shutil.copy(CORPUS.with_name(CORPUS.name + suffix), data_dir / f"corpus{suffix}")
    config = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    config["cluster"].update(nodes=1, gpus_per_node=1, python=sys.executable, spare_nodes=0)
    config["parallel"].update(tp=1, pp=1, global_batch_size=8)
    config["data"].update(datasets=[{"path": str(data_dir / "corpus")}], tokenizer=str(REPO / "data" / "tokenizer.json"))
    config["watchdog"].update(poll_seconds=1, heartbeat_seconds=1)
    return config, data_dir


def write_config(tmp_path: Path, config: dict, name: str = "one-rank.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return str(path)
