"""Simulation tests run their run directory on tmpfs when there is one (simulation.runner.scratch_run_dir)."""

from __future__ import annotations

import pytest

from simulation.runner import scratch_run_dir


@pytest.fixture
def sim_run_dir():
    with scratch_run_dir() as run_dir:
        yield run_dir
