"""The Triton kernels compile for a real GPU (sm_90), with the launch configurations the wrappers
use, even on a machine without one: triton's full pipeline down to a cubin via its bundled ptxas.

The interpreter tests check numerics; this catches what only the compiler sees (types, constructs
the interpreter accepts but the compiler does not, shared memory over the device limit). It runs
`python -m bloom_kernels.aot_check` in a subprocess because this pytest process interprets (conftest.py).
`python -m bloom_kernels.aot_check --full` adds fp32, more sizes and sm_80 (~10 minutes on 2 cores).
Compiled kernels are cached by triton (~/.triton/cache): ~1 minute the first time, seconds after.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
REPO = Path(__file__).resolve().parents[2]


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "bloom_kernels.aot_check"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    print(proc.stdout)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.count("ok  ") == 10  # LN, GeLU, softmax: fwd + bwd; attention: fwd, delta, dkdv, dq
