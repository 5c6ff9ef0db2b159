"""Simulation tests run their run directory on tmpfs when there is one: a pass rewrites up to 384
heartbeat files, and on ext4 each rename over an existing file flushes its data (auto_da_alloc),
~1.5 ms apiece; on /dev/shm the same pass costs a few ms."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def sim_run_dir(tmp_path):
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    holder = Path(tempfile.mkdtemp(prefix="sim-", dir=base))
    yield holder / "run"
    shutil.rmtree(holder, ignore_errors=True)
