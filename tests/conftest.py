"""Shared pytest setup: markers that skip what this machine cannot run, and the repo root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
# Fixtures of the SLURM layer (local_cluster, slurm_scheduler, mock_slurm_dir).
pytest_plugins = ["tests.fixtures_slurm"]
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Without a GPU, Triton kernels can only run interpreted, and triton fixes compiled/interpreted at
# its first import (transformers and deepspeed import it): decide before any test module loads.
# See kernels/dispatch.py.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on a machine with one")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
