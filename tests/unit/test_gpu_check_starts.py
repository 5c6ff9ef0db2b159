"""`make gpu-check` must be ready for the day an accelerator is lent: it starts, and without a GPU
it skips every part cleanly (exit 0, a summary that says so) instead of failing or hanging, and
leaves the recorded GPU summary in bench/results/ alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, _has_cuda


def test_gpu_check_starts_and_skips_cleanly_without_a_gpu():
    if _has_cuda():
        pytest.skip("a GPU is here: run `make gpu-check` itself")
    recorded = REPO_ROOT / "bench" / "results" / "gpu_check.json"
    before = recorded.read_bytes() if recorded.exists() else None
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "gpu_check.py")],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no CUDA GPU" in proc.stdout
    parts = json.loads(proc.stdout[proc.stdout.index("{"):])["parts"]
    assert set(parts) == {"gpu_tests", "kernels_side_by_side", "train_step_gpu"}
    assert {p["status"] for p in parts.values()} == {"skipped"}
    assert (recorded.read_bytes() if recorded.exists() else None) == before
