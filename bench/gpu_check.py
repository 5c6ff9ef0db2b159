"""Every GPU check in one script, for the machine with an accelerator (`make gpu-check`).

    python bench/gpu_check.py [--budget-seconds 480]

Runs, each under its share of an 8-minute budget, and writes what it measured to bench/results/:
1. the GPU-marked tests (`pytest -m gpu`: compiled Triton kernels vs their references, the model's
   bf16 paths) -> bench/results/gpu_tests.xml (JUnit);
2. bench/kernels_gpu.py (kernel bandwidth and attention TFLOP/s) -> bench/results/kernels_gpu.json;
3. bench/train_step_gpu.py (achieved TFLOPs and MFU of a training step) -> bench/results/train_step_gpu.json.
A summary of exit codes and times goes to bench/results/gpu_check.json. Without a CUDA GPU it says
so, writes that summary with every part skipped, and exits 0: it must always start cleanly (CI
checks that it does).
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
PARTS = [
    ("gpu_tests", [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                   f"--junitxml={RESULTS / 'gpu_tests.xml'}", "tests"], 0.45),
    ("kernels_gpu", [sys.executable, str(REPO / "bench" / "kernels_gpu.py")], 0.30),
    ("train_step_gpu", [sys.executable, str(REPO / "bench" / "train_step_gpu.py")], 0.25),
]


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
    parser.add_argument("--summary", default=str(RESULTS / "gpu_check.json"), help="where the summary goes")
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
            start = time.monotonic()
            try:
                code = subprocess.call(command, cwd=REPO, env=env, timeout=limit)
                status = "passed" if code == 0 else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                status = f"timed out after {limit:.0f} s"
            took = time.monotonic() - start
            summary["parts"][name] = {"status": status, "seconds": round(took, 1)}
            print(f"gpu-check: {name}: {status} in {took:.0f} s", flush=True)
    Path(args.summary).write_text(json.dumps(summary, indent=2) + "\n")
    failed = [n for n, p in summary["parts"].items() if p["status"] not in ("passed", "skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
