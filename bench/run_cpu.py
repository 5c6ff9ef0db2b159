"""Run every CPU benchmark in turn (`make bench-cpu`); each writes its figures to bench/results/.

Run them on an otherwise idle machine: the timings are wall-clock and share the 2 cores.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
CPU_BENCHMARKS = [
    "kernels_cpu.py",
    "train_step_cpu.py",
    "data_index.py",
    "parallel_layouts.py",
    "controller_supervision.py",
    "controller_latency.py",
    "soak_month.py",
    "async_checkpoint.py",
]


def main() -> int:
    failed = []
    for name in CPU_BENCHMARKS:
        start = time.time()
        print(f"== bench/{name}", flush=True)
        code = subprocess.call([sys.executable, str(BENCH / name)], cwd=BENCH.parent)
        print(f"== bench/{name}: exit {code} after {time.time() - start:.0f} s", flush=True)
        if code:
            failed.append(name)
    print(f"results in {BENCH / 'results'}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
