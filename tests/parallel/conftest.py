"""Fixtures of the 3D-parallel tests: the harness's single-process run, the reference of test_3d_slurm.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def single_process(tmp_path_factory):
    """single_process(dtype) -> the (1,1,1) reference run of the tiny BLOOM, computed once per session."""
    from tests.parallel.three_d_runs import run_layout

    cache: dict[str, dict] = {}

    def get(dtype: str) -> dict:
        if dtype not in cache:
            cache[dtype] = run_layout(tmp_path_factory.mktemp(f"single-{dtype}"), 1, 1, 1, dtype)
            print(f"single process {dtype}: losses {[round(x, 4) for x in cache[dtype]['losses']]}")
        return cache[dtype]

    return get
