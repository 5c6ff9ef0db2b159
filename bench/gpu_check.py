"""Every GPU check in one script, for the machine with an accelerator (`make gpu-check`).

    python bench/gpu_check.py [--budget-seconds 480]

Runs, each under its share of an 8-minute budget, and writes what it measured to bench/results/:
1. the GPU-marked tests (`pytest -m gpu`: compiled Triton kernels vs their references, the model's
   bf16 paths) -> bench/results/gpu_tests.xml (JUnit);
2. bench/kernels_side_by_side.py (every implementation of every op at BLOOM's shapes, checked, then
   timed: ours, torch.compile, FlexAttention, SDPA) -> bench/results/kernels_side_by_side.{json,md},
   and the rows it measured into bloom_kernels/dispatch_table.json (what bloom_kernels/dispatch.py follows);
3. bench/train_step_gpu.py (the bloom-1b7 step's TFLOP/s and MFU beside transformers + AdamW, and a
   torch.profiler summary) -> bench/results/train_step_gpu.json, train_step_gpu_profile.md.
The table is rewritten before the step is timed, so the step runs with the kernels just chosen.
A summary of exit codes and times goes to bench/results/gpu_check.json. Without a CUDA GPU it says
so, prints that summary with every part skipped (written only where --summary says: the recorded
GPU summary is not overwritten) and exits 0: it must always start cleanly (CI checks that it does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
# (name, command, share of the budget): the tests first, they say whether the numbers mean anything.
# Measured on an H200 (2026-11-30): the tests 147 s (fp32 attention compiles), our step alone 42 s.
PARTS = [
    ("gpu_tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                   f"--junitxml={RESULTS / 'gpu_tests.xml'}", "tests"], 0.34),
    ("kernels_side_by_side", [sys.executable, str(REPO / "bench" / "kernels_side_by_side.py")], 0.38),
    ("train_step_gpu", [sys.executable, str(REPO / "bench" / "train_step_gpu.py")], 0.28),
]
# The kernel benchmark stops starting new cases this long before its limit (one case: compiles + timing).
CASE_RESERVE_SECONDS = 40


def cuda_device() -> str | None:
    """The GPU's name, or None; asked in a child so that this script never initialises CUDA itself."""
    probe = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-seconds", type=float, default=480.0)
    parser.add_argument("--summary", default=None,
                        help="where the summary goes (default: bench/results/gpu_check.json on a GPU, nowhere without)")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    device = cuda_device()
    summary: dict = {"device": device, "budget_seconds": args.budget_seconds, "parts": {}}
    if device is None:
        print("gpu-check: no CUDA GPU here; every part skipped (run it on a machine with one)")
        summary["parts"] = {name: {"status": "skipped", "why": "no CUDA GPU"} for name, _, _ in PARTS}
    else:
        print(f"gpu-check on {device}, budget {args.budget_seconds:.0f} s")
        # The Makefile exports DS_ACCELERATOR=cpu (for the CPU tests); passed on, it would make
        # train_step_gpu.py print "no CUDA GPU here; nothing measured" and exit 0, counted as passed.
        env = {**os.environ, "DS_ACCELERATOR": "cuda"}
        for name, command, share in PARTS:
            limit = args.budget_seconds * share
            if name == "kernels_side_by_side":  # it ends itself, keeping what it measured, rather than be killed
                command = [*command, "--budget-seconds", f"{max(limit - CASE_RESERVE_SECONDS, 1):.0f}"]
            start = time.monotonic()
            try:
                code = subprocess.call(command, cwd=REPO, env=env, timeout=limit)
                status = "passed" if code == 0 else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                status = f"timed out after {limit:.0f} s"
            took = time.monotonic() - start
            summary["parts"][name] = {"status": status, "seconds": round(took, 1)}
            print(f"gpu-check: {name}: {status} in {took:.0f} s", flush=True)
    text = json.dumps(summary, indent=2) + "\n"
    summary_path = args.summary or (RESULTS / "gpu_check.json" if device else None)
    if summary_path:
        Path(summary_path).write_text(text)
    else:
        print(text, end="")
    failed = [n for n, p in summary["parts"].items() if p["status"] not in ("passed", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
