"""The mocked SLURM's core: its state file, the scenario state machine, sbatch's option parsing
and the shims. NOT SLURM.

Shared by the `Scheduler` over it (`mock.MockScheduler`), the command-line emulation
(`mock_cli`) and the executor (`mock_exec`); it imports none of them, so that the three never
import each other in a circle. What each file of the state directory holds is in `mock`'s
docstring.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal as signal_module
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.contract import append_jsonl, atomic_write_json, read_json, read_jsonl
from orchestrator.errors import SchedulerError
from orchestrator.plan.config.slurm_time import slurm_time_seconds

from .answers import SlurmAnswerError, read_job_state
from .hostlist import compress_hostlist

DEFAULT_SCENARIO: list[dict[str, Any]] = [
    {"state": "PENDING", "polls": 1},
    {"state": "RUNNING", "polls": 2},
    {"state": "COMPLETED", "exit_code": 0},
]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SHIM_COMMANDS = ["sbatch", "squeue", "scontrol", "scancel", "sacct", "srun"]
NOT_SLURM = "mock-slurm: this is NOT SLURM, a local stand-in (orchestrator.slurm.mock)"
REPO_ROOT = Path(__file__).resolve().parents[2]
KILL_WAIT_SECONDS = 2.0


def default_mock_dir() -> Path:
    return Path(os.environ.get("RUNCTL_MOCK_SLURM_DIR", str(Path.home() / ".runctl" / "mock-slurm")))


def parse_time_limit(text: str | None) -> float | None:
    """SLURM --time in any of its forms to seconds; None for none/unlimited."""
    if not text or text.upper() in {"UNLIMITED", "INFINITE"}:
        return None
    return float(slurm_time_seconds(text))


def parse_sbatch_args(argv: list[str], script_text: str = "") -> dict[str, str]:
    """Options of an sbatch call: the script's #SBATCH lines first, then the command line (which
    wins, as in SLURM). Returns long option name -> value ("" for flags)."""
    short = {"J": "job-name", "d": "dependency", "H": "hold", "x": "exclude", "N": "nodes", "o": "output",
             "e": "error", "t": "time", "p": "partition", "n": "ntasks", "c": "cpus-per-task", "D": "chdir"}  # fmt: skip
    flags = {"hold", "parsable", "exclusive", "wait", "test-only"}
    options: dict[str, str] = {}

    def take(tokens: list[str]) -> list[str]:
        rest, i = [], 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.startswith("--"):
                key, eq, value = tok[2:].partition("=")
                if not eq and key not in flags and i + 1 < len(tokens):
                    i += 1
                    value = tokens[i]
                options[key] = value
            elif tok.startswith("-") and len(tok) >= 2 and tok[1] in short:
                key = short[tok[1]]
                value = tok[2:]
                if not value and key not in flags and i + 1 < len(tokens):
                    i += 1
                    value = tokens[i]
                options[key] = value
            else:
                rest = tokens[i:]
                break
            i += 1
        return rest

    for line in script_text.splitlines():
        if line.startswith("#SBATCH"):
            take(shlex.split(line[len("#SBATCH") :], comments=True))
        elif line.strip() and not line.startswith("#"):
            break  # sbatch stops reading #SBATCH at the first command
    rest = take(list(argv))
    if rest:
        options["script"] = rest[0]
    return options


def check_state(slurm_state: str) -> None:
    """ValueError unless the reading layer knows this SLURM job state."""
    try:
        read_job_state(slurm_state, "", "mock")
    except SlurmAnswerError:
        raise ValueError(
            f"unknown SLURM job state {slurm_state!r} in a mock scenario: use SLURM's names "
            f"(PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...)"
        ) from None


class MockSlurm:
    """The state machine and its state file. Thread-unsafe but process-safe (fcntl lock)."""

    def __init__(self, directory: Path | str | None = None, execute: bool | None = None):
        self.dir = Path(directory or default_mock_dir()).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        config = read_json(self.dir / "config.json") or {}
        if execute is not None and config.get("execute") != execute:
            config["execute"] = execute
            atomic_write_json(self.dir / "config.json", config)
        self.execute = bool(config.get("execute", False))

    @property
    def shim_dir(self) -> Path:
        return self.dir / "bin"

    # State -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The state, locked; changes are written back atomically when the block ends."""
        with open(self.dir / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = read_json(self.dir / "state.json") or {"next_id": 1000, "jobs": {}, "scenarios": []}
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                atomic_write_json(self.dir / "state.json", state)

    def record_command(self, argv: list[str]) -> None:
        append_jsonl(self.dir / "commands.jsonl", {"argv": list(argv), "time": time.time()})

    def commands(self) -> list[list[str]]:
        return [r["argv"] for r in read_jsonl(self.dir / "commands.jsonl")]

    def push_scenario(self, steps: list[dict[str, Any]]) -> None:
        """Queue a scenario for the next submitted job (FIFO)."""
        for step in steps:
            check_state(step["state"])  # refuse a typo now, not at the first poll
        with self.locked() as state:
            state["scenarios"].append(steps)

    def job(self, job_id: str) -> dict[str, Any]:
        with self.locked() as state:
            if str(job_id) not in state["jobs"]:
                raise SchedulerError(f"mock-slurm: Invalid job id specified: {job_id}")
            return dict(state["jobs"][str(job_id)])

    # Commands ----------------------------------------------------------------------------------
    def submit(self, options: dict[str, str], script_path: str, cwd: str | None = None) -> str:
        script = Path(script_path)
        if not script.is_file():
            raise SchedulerError(f"mock-slurm sbatch: error: Unable to open file {script_path}")
        nodes = int(str(options.get("nodes", "1")).split("-")[0])
        with self.locked() as state:
            job_id = str(state["next_id"])
            state["next_id"] += 1
            width = max(2, len(str(nodes)))
            # Like slurmctld, keep a copy of the script as submitted: the caller may move or
            # rewrite its file before the job starts.
            spooled = self.dir / "spool" / f"job{job_id}.sh"
            spooled.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(script, spooled)
            job = {
                "job_id": job_id,
                "name": options.get("job-name") or script.name,
                "script": str(spooled),
                "options": options,
                "cwd": options.get("chdir") or cwd or os.getcwd(),
                "dependency": options.get("dependency", ""),
                "held": "hold" in options,
                "exclude": options.get("exclude", ""),
                "num_nodes": nodes,
                "nodelist": compress_hostlist([f"node{k:0{width}d}" for k in range(1, nodes + 1)]),
                "state": "PENDING",
                "reason": "JobHeldUser" if "hold" in options else "None",
                "raw_exit": 0,
                "submit_time": time.time(),
                "start_time": 0,
                "end_time": 0,
                "scenario": state["scenarios"].pop(0) if state["scenarios"] else DEFAULT_SCENARIO,
                "step": 0,
                "polls": 0,
                "signals": [],
            }
            state["jobs"][job_id] = job
        return job_id

    def _singleton_blocked(self, state: dict[str, Any], job: dict[str, Any]) -> bool:
        if "singleton" not in job["dependency"]:
            return False
        return any(
            other["name"] == job["name"]
            and int(other["job_id"]) < int(job["job_id"])
            and other["state"] not in TERMINAL
            for other in state["jobs"].values()
        )

    def _advance(self, state: dict[str, Any], job: dict[str, Any]) -> None:
        """One observation of a scenario-driven job."""
        if job["state"] in TERMINAL:
            return
        if job["held"]:
            job["state"], job["reason"] = "PENDING", "JobHeldUser"
            return
        if job["state"] == "PENDING" and self._singleton_blocked(state, job):
            job["reason"] = "Dependency"
            return
        step = job["scenario"][job["step"]]
        self._enter(job, step)
        job["polls"] += 1
        if job["polls"] > int(step.get("polls", 1)) and job["step"] + 1 < len(job["scenario"]):
            job["step"] += 1
            job["polls"] = 1
            self._enter(job, job["scenario"][job["step"]])

    @staticmethod
    def _enter(job: dict[str, Any], step: dict[str, Any]) -> None:
        new = step["state"]
        if new == job["state"] and job["reason"] not in ("Dependency", "JobHeldUser"):
            return
        job["state"] = new
        job["reason"] = step.get("reason", "None" if new != "PENDING" else "Priority")
        now = time.time()
        if new in ("RUNNING", "COMPLETING") and not job["start_time"]:
            job["start_time"] = now
        if new in TERMINAL:
            job["end_time"] = now
            code = int(step.get("exit_code", 0 if new == "COMPLETED" else 1))
            job["raw_exit"] = (code & 0xFF) << 8

    def observe(self, job_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """The jobs (all, or those asked), each advanced one scenario step when not executing."""
        with self.locked() as state:
            wanted = [str(j) for j in job_ids] if job_ids is not None else list(state["jobs"])
            out = []
            for job_id in wanted:
                job = state["jobs"].get(job_id)
                if job is None:
                    continue
                if not self.execute:
                    self._advance(state, job)
                elif job["state"] == "PENDING":  # the runner may not have looked yet
                    blocked = self._singleton_blocked(state, job)
                    job["reason"] = "JobHeldUser" if job["held"] else "Dependency" if blocked else "Priority"
                out.append(dict(job))
            return out

    def set_state(
        self, job_id: str, slurm_state: str, exit_code: int | None = None, reason: str = "None"
    ) -> None:
        """Test hook: put a job in a state now (the scenario stops driving it)."""
        check_state(slurm_state)
        with self.locked() as state:
            job = state["jobs"][str(job_id)]
            job["scenario"], job["step"], job["polls"] = [{"state": slurm_state, "polls": 10**9}], 0, 0
            job["state"], job["reason"] = slurm_state, reason
            if slurm_state in TERMINAL:
                job["end_time"] = time.time()
                job["raw_exit"] = ((exit_code if exit_code is not None else 0) & 0xFF) << 8

    def cancel(self, job_ids: list[str], signal: str | None = None) -> list[tuple[dict[str, Any], str]]:
        """Mark the jobs cancelled (or record the signal). Returns (job, signal) for each job whose
        processes must get a signal: the executor (mock_exec) delivers them in execute mode."""
        to_kill = []
        with self.locked() as state:
            for job_id in map(str, job_ids):
                job = state["jobs"].get(job_id)
                if job is None:
                    raise SchedulerError(f"mock-slurm scancel: error: Invalid job id {job_id}")
                if job["state"] in TERMINAL:
                    continue
                if signal:
                    job["signals"].append(signal)
                    to_kill.append((job, signal))
                    continue
                # SLURM: ExitCode 0:15 for a job cancelled while running, 0:0 while pending.
                job["raw_exit"] = signal_module.SIGTERM if job["start_time"] else 0
                job["state"], job["reason"] = "CANCELLED", "None"
                job["end_time"] = time.time()
                to_kill.append((job, "TERM"))
        return to_kill

    def set_held(self, job_ids: list[str], held: bool) -> None:
        with self.locked() as state:
            for job_id in map(str, job_ids):
                job = state["jobs"].get(job_id)
                if job is None:
                    raise SchedulerError(f"mock-slurm scontrol: error: Invalid job id specified {job_id}")
                if job["state"] != "PENDING":
                    raise SchedulerError(
                        f"mock-slurm scontrol: error: Job {job_id} is not pending (it is {job['state']})"
                    )
                job["held"] = held
                job["reason"] = "JobHeldUser" if held else "None"

    def update(self, job_id: str, fields: dict[str, str]) -> None:
        with self.locked() as state:
            job = state["jobs"].get(str(job_id))
            if job is None:
                raise SchedulerError(f"mock-slurm scontrol: error: Invalid job id specified {job_id}")
            for key, value in fields.items():
                if key.lower() == "excnodelist":
                    if job["state"] != "PENDING":
                        raise SchedulerError(f"mock-slurm scontrol: error: Job {job_id} is no longer pending")
                    job["exclude"] = value
                else:
                    raise SchedulerError(
                        f"mock-slurm scontrol update: {key} is not emulated (only ExcNodeList)"
                    )


def write_shims(
    directory: Path | str, mock_dir: Path | str | None = None, execute: bool | None = None
) -> list[Path]:
    """Write executable sbatch/squeue/scontrol/scancel/sacct/srun wrappers into `directory`; put it
    first on PATH and every SLURM tool talks to the mock in `mock_dir`."""
    slurm = MockSlurm(mock_dir, execute)
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for command in SHIM_COMMANDS:
        path = directory / command
        path.write_text(
            "#!/bin/sh\n"
            f"# {NOT_SLURM}: shim for `{command}`\n"
            f"RUNCTL_MOCK_SLURM_DIR={shlex.quote(str(slurm.dir))}; export RUNCTL_MOCK_SLURM_DIR\n"
            f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH\n"
            f'exec {shlex.quote(sys.executable)} -m orchestrator.slurm.mock_cli {command} "$@"\n'
        )
        path.chmod(0o755)
        written.append(path)
    config = read_json(slurm.dir / "config.json") or {}
    config["shim_dir"] = str(directory)
    atomic_write_json(slurm.dir / "config.json", config)
    return written
