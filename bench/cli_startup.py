"""How fast the two commands people type first start: `runctl --help` and `runctl status`.

    python bench/cli_startup.py [--repeats 10 --out bench/results/cli_startup.json]

Each repeat runs the command in a fresh interpreter and times, in that process, the CPU seconds
from its first import of the orchestrator to the end (so a busy machine does not count, but a
slow one does), and lists the heavy modules it imported. The figure is the median over the
repeats; the targets are `--help` under 0.5 s and `status` under 1 s of CPU. The test
(tests/unit/test_cli_help.py) checks the behaviour behind the figure, that neither command imports
a heavy module; the figure itself belongs here, because it depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = {"help": 0.5, "status": 1.0}
# Modules that none of these commands may import (torch for the trainer; the others are imported
# only by the one command that needs them).
HEAVY = ("torch", "deepspeed", "triton", "numpy", "matplotlib", "apprise", "shtab", "requests")


def timed_command(code: str, env: dict) -> dict:
    """Run `code` in a fresh interpreter: its CPU seconds from the first import to the end, and the
    heavy modules it imported."""
    wrapped = (
        "import time, sys, json, io, contextlib\n"
        "t = time.process_time()\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps({'cpu': time.process_time() - t, 'heavy': heavy}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"the command failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def commands(run_dir: Path) -> dict[str, str]:
    return {
        "help": "from orchestrator.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
        "status": f"from orchestrator.cli.main import main\nmain(['status', {str(run_dir)!r}])",
    }


def submitted_run(tmp: Path, env: dict) -> Path:
    """A run submitted to the mocked SLURM, for `status` to read."""
    run_dir = tmp / "run"
    subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "submit", str(REPO / "configs" / "demo-cpu-4node.yaml"),
                    "--run-dir", str(run_dir)], env=env, check=True, capture_output=True, timeout=120)  # fmt: skip
    return run_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cli_startup.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(REPO), "RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": f"{tmp}/mock"}
        run_dir = submitted_run(Path(tmp), env)
        samples: dict[str, list[float]] = {}
        heavy: dict[str, list[str]] = {}
        for _ in range(args.repeats):
            for name, code in commands(run_dir).items():
                result = timed_command(code, env)
                samples.setdefault(name, []).append(result["cpu"])
                heavy[name] = result["heavy"]
    medians = {name: statistics.median(values) for name, values in samples.items()}
    figures = {
        "what": "CPU seconds of `runctl --help` and `runctl status` in a fresh interpreter, first import to end; median of repeats",
        "repeats": args.repeats,
        "cpu_seconds_median": medians,
        "cpu_seconds_max": {name: max(values) for name, values in samples.items()},
        "heavy_modules_imported": heavy,
        "targets": TARGETS,
        "targets_met": {name: medians[name] < TARGETS[name] for name in TARGETS},
        "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(),
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    for name, seconds in medians.items():
        mark = "ok" if figures["targets_met"][name] else "OVER TARGET"
        print(f"{name}: {seconds:.3f} CPU s median (target < {TARGETS[name]} s) {mark}; heavy modules: {heavy[name] or 'none'}")
    print(f"written: {args.out}")
    return 0 if all(figures["targets_met"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
