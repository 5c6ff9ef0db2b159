"""The mocked SLURM: no daemons, a state file, every command recorded. NOT SLURM.

State lives in one directory (env RUNCTL_MOCK_SLURM_DIR, default ~/.runctl/mock-slurm):
    state.json      jobs and the scenario queue (locked with fcntl while changed)
    commands.jsonl  every command run against it: {"argv": [...], "time": ...}
    config.json     {"execute": bool, "shim_dir": ...}
    bin/            the shims (sbatch, squeue, scontrol, scancel, sacct, srun) once written

Two modes:
- scenario (default): jobs move through states as a test scenario says, one step per
  observation (squeue / scontrol show job / jobs()). A scenario is a list of steps, e.g.
  [{"state": "PENDING", "polls": 1}, {"state": "RUNNING", "polls": 2}, {"state": "FAILED", "exit_code": 1}];
  `push_scenario` queues one for the next submitted job (FIFO), else DEFAULT_SCENARIO.
  Held jobs and unfulfilled singleton dependencies stay PENDING without using up polls.
- execute: each batch script really runs here (`mock_exec.run_job`), with an `srun` shim that
  starts the tasks with SLURM's variables set. It prints that it is not SLURM.

Modules: `mock_core` (the state machine, shared), `mock_exec` (execute mode), `mock_cli` (the
shims' commands), this one (`MockScheduler`); none imports another in a circle.
`MockScheduler` is the `Scheduler` over it; the shims (`python -m orchestrator.slurm.mock
shim-dir DIR`) let any tool, including `SlurmScheduler`, drive the same state through PATH.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .base import JobInfo, JobState, NodeInfo, SubmitRequest, job_state_from_slurm, sbatch_argv
from .hostlist import expand_hostlist
from .mock_core import (  # noqa: F401 - the mock's public names, re-exported
    DEFAULT_SCENARIO,
    NOT_SLURM,
    MockSlurm,
    default_mock_dir,
    parse_sbatch_args,
    write_shims,
)
from .mock_exec import ExecutingMockSlurm
from .real import HELD_REASONS, decode_wait_status


def job_info(job: dict[str, Any]) -> JobInfo:
    state = job_state_from_slurm(job["state"])
    held = job["reason"] in HELD_REASONS
    if held and state == JobState.PENDING:
        state = JobState.HELD
    exit_code = signal = None
    if state.is_terminal:
        exit_code, signal = decode_wait_status(int(job["raw_exit"]))
    running = bool(job["start_time"])
    return JobInfo(
        job_id=job["job_id"], name=job["name"], state=state,
        nodes=expand_hostlist(job["nodelist"]) if running else [], exit_code=exit_code, signal=signal,
        reason="" if job["reason"] == "None" else job["reason"], start_time=job["start_time"] or None,
        end_time=job["end_time"] or None, held=held,
    )  # fmt: skip


class MockScheduler:
    """`Scheduler` over MockSlurm, in-process (no shims needed)."""

    name = "mock"

    def __init__(self, directory: Path | str | None = None, execute: bool | None = None):
        self.slurm = ExecutingMockSlurm(directory, execute)

    @property
    def runs_job_scripts(self) -> bool:
        """Scenario mode moves jobs through states without running their scripts."""
        return bool(self.slurm.execute)

    def submit(self, request: SubmitRequest) -> str:
        argv = sbatch_argv(request)
        self.slurm.record_command(argv)
        script_text = Path(request.script).read_text() if Path(request.script).is_file() else ""
        options = parse_sbatch_args(argv[1:], script_text)
        return self.slurm.submit(options, options.get("script", str(request.script)))

    def jobs(self, job_ids: list[str]) -> dict[str, JobInfo]:
        self.slurm.record_command(["squeue", "--json"])
        found = {j["job_id"]: job_info(j) for j in self.slurm.observe([str(j) for j in job_ids])}
        return {
            str(j): found.get(
                str(j),
                JobInfo(job_id=str(j), name="", state=JobState.UNKNOWN, reason="not known to mock-slurm"),
            )
            for j in job_ids
        }

    def nodes(self) -> dict[str, NodeInfo]:
        """The mock has no nodes to speak of: nothing is judged by node state."""
        return {}

    def jobs_by_name(self, name: str) -> dict[str, JobInfo]:
        self.slurm.record_command(["squeue", "--json"])
        return {j["job_id"]: job_info(j) for j in self.slurm.observe() if j["name"] == name}

    def cancel(self, job_ids: list[str], signal: str | None = None) -> None:
        self.slurm.record_command(
            ["scancel", *([f"--signal={signal}"] if signal else []), *map(str, job_ids)]
        )
        # Like SlurmScheduler: a job the scheduler no longer knows is not an error.
        with self.slurm.locked() as state:
            known = [str(j) for j in job_ids if str(j) in state["jobs"]]
        self.slurm.cancel(known, signal)

    def hold(self, job_ids: list[str]) -> None:
        self.slurm.record_command(["scontrol", "hold", ",".join(map(str, job_ids))])
        self.slurm.set_held(job_ids, True)

    def release(self, job_ids: list[str]) -> None:
        self.slurm.record_command(["scontrol", "release", ",".join(map(str, job_ids))])
        self.slurm.set_held(job_ids, False)

    def update_exclude(self, job_ids: list[str], exclude: list[str]) -> None:
        for job_id in job_ids:
            self.slurm.record_command(
                ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}"]
            )
            self.slurm.update(job_id, {"ExcNodeList": ",".join(exclude)})


if __name__ == "__main__":
    from orchestrator.slurm.mock_cli import main

    sys.exit(main(sys.argv[1:]))
