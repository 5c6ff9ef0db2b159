"""Fake `srun`, `squeue`, `scancel` and `scontrol` for the in-allocation launcher's tests.

Installed as executables in a bin dir put first on PATH. Each srun records its argv (JSON line in
$FAKE_DIR/srun.log) and plays what $FAKE_DIR/plan.json says for its step name (--job-name):
    {"launch-0": {"rc": 1, "stderr": "srun: error: node02: task 2: Killed"},
     "launch-1": {"rc": 0},
     "launch-2": {"hang": true},                       # until scancel kills it
     "health-check": {"unhealthy": {"node02": "MemAvailable 1 GiB < 64 GiB"}}}
A running step is listed by squeue --steps as "<job>.<n> <name>" and killed by scancel.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

FAKE = Path(os.environ.get("FAKE_DIR", "."))


def _steps() -> dict:
    try:
        return json.loads((FAKE / "steps.json").read_text())
    except (OSError, ValueError):
        return {}


def _save_steps(steps: dict) -> None:
    tmp = FAKE / "steps.json.tmp"
    tmp.write_text(json.dumps(steps))
    tmp.replace(FAKE / "steps.json")


def srun(argv: list[str]) -> int:
    options = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if a.startswith("--") and "=" in a}
    name = options.get("--job-name", "?")
    with open(FAKE / "srun.log", "a") as log:
        log.write(json.dumps({"name": name, "argv": argv, "env_launch": os.environ.get("RUNCTL_LAUNCH")}) + "\n")
    plan = json.loads((FAKE / "plan.json").read_text()).get(name, {"rc": 0})
    steps = _steps()
    step_id = f"{os.environ['SLURM_JOB_ID']}.{len(steps)}"
    steps[step_id] = {"name": name, "pid": os.getpid(), "running": True}
    _save_steps(steps)
    try:
        if name == "health-check":
            health = Path(argv[argv.index("--job-dir") + 1]) / "health"
            health.mkdir(parents=True, exist_ok=True)
            for node in options["--nodelist"].split(","):
                why = plan.get("unhealthy", {}).get(node)
                (health / f"{node}.json").write_text(json.dumps({"node": node, "ok": why is None, "reason": why or ""}))
            return 0
        if plan.get("hang"):
            while True:
                time.sleep(0.1)
        if plan.get("stderr"):
            print(plan["stderr"], file=sys.stderr, flush=True)
        return int(plan.get("rc", 0))
    finally:
        steps = _steps()
        steps[step_id]["running"] = False
        _save_steps(steps)


def squeue(argv: list[str]) -> int:
    for step_id, step in _steps().items():
        if step["running"]:
            print(f"{step_id} {step['name']}")
    return 0


def scancel(argv: list[str]) -> int:
    with open(FAKE / "scancel.log", "a") as log:
        log.write(json.dumps(argv) + "\n")
    step = _steps().get(argv[-1])
    if step and step["running"]:
        os.kill(step["pid"], signal.SIGKILL)
        steps = _steps()
        steps[argv[-1]]["running"] = False
        _save_steps(steps)
    return 0


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        print("\n".join(os.environ["FAKE_NODES"].split()))
    elif argv[:2] == ["show", "node"]:
        print(f"NodeName={argv[2]} NodeAddr=127.0.0.1 State=ALLOCATED")
    return 0


def install(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in ("srun", "squeue", "scancel", "scontrol"):
        path = bin_dir / tool
        path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                        f"import fake_slurm_steps as f\nsys.exit(f.{tool}(sys.argv[1:]))\n")
        path.chmod(0o755)
