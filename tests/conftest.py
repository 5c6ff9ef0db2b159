"""Shared pytest setup: markers that skip what this machine cannot run, the repo root, and the CI rule
that a missing test dependency is a failure, not a skip."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
# Fixtures of the SLURM layer (local_cluster, slurm_scheduler, mock_slurm_dir; the 24.11 cluster and
# accounting in fixtures_slurm_releases).
pytest_plugins = ["tests.fixtures_slurm", "tests.fixtures_slurm_releases", "tests.fixtures_disk"]
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Without a GPU, Triton kernels can only run interpreted, and triton fixes compiled/interpreted at
# its first import (transformers and deepspeed import it): decide before any test module loads.
# See bloom_kernels/dispatch.py.
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


# `make test` runs the tests marked `idle` in a second pytest session beside the first, at the lowest
# CPU priority (nice 19): they take only the cycles the real-cluster tests leave while they wait on
# SLURM and the watchdog. Idle means in-process Python with no deadline on the wall clock (the
# simulation's clock is virtual): however long it waits for the CPU, it cannot fail for it. The
# files named here run subprocesses with timeouts, so they stay in the first session.
IDLE_DIRS = (REPO_ROOT / "tests" / "simulation", REPO_ROOT / "tests" / "unit")
NOT_IDLE = {"test_ci_no_silent_skips.py", "test_cli_help.py", "test_gpu_check_starts.py", "test_planner.py",
            "test_status_screen.py"}  # fmt: skip


def _idle(item: pytest.Item) -> bool:
    path = Path(item.path)
    return path.name not in NOT_IDLE and any(path.is_relative_to(d) for d in IDLE_DIRS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _idle(item):
            item.add_marker(pytest.mark.idle)
    if any("gpu" in item.keywords for item in items) and not _has_cuda():
        skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on a machine with one")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


# Under CI (env CI set, as .ci/run and every CI service set it), a test dependency that does not
# import FAILS the run: a half-failed install must not turn the oracle suites (megatron-core,
# transformers, DeepSpeed, Triton) into quiet skips while CI stays green. Locally it stays a skip.
# This catches every `pytest.importorskip`, at module level (collection) and inside tests, in one place.
IMPORT_SKIP = "could not import"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _fail_import_skip(report) -> None:
    if _in_ci() and report.skipped and IMPORT_SKIP in str(report.longrepr):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = (f"CI is set, so a missing test dependency fails instead of skipping: {reason}. "
                           "Install it (make install: the [train,kernels,dev] extras of setup.cfg).")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_import_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_import_skip(outcome.get_result())


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
