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

from .answers import jobs_from_json, jobs_from_text, json_filters
from .base import JobInfo, JobState, NodeInfo, SubmitRequest, sbatch_argv
from .mock_cli import mock_release, squeue_answer
from .mock_core import (  # noqa: F401 - the mock's public names, re-exported
    DEFAULT_SCENARIO,
    NOT_SLURM,
    MockSlurm,
    default_mock_dir,
    parse_sbatch_args,
    write_shims,
)
from .mock_exec import ExecutingMockSlurm
from .release_shapes import FULL_RELEASE


def read_as_slurm(jobs: list[dict[str, Any]], selection: list[str]) -> list[JobInfo]:
    """The jobs as the chosen release's squeue would say them, read back by the reading layer
    (the same choice of form as SlurmScheduler), so that every release's shape is exercised."""
    release = mock_release()
    as_json = json_filters(release)
    text = squeue_answer(jobs, release, as_json, ["squeue", *selection])
    if as_json:
        return jobs_from_json(text, lambda: text[:2000])
    return jobs_from_text(text, FULL_RELEASE[release])


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
        selection = [f"--jobs={','.join(map(str, job_ids))}"]
        self.slurm.record_command(["squeue", "--states=all", *selection])
        found = {i.job_id: i for i in read_as_slurm(self.slurm.observe([str(j) for j in job_ids]), selection)}
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
        self.slurm.record_command(["squeue", "--states=all", f"--name={name}"])
        named = [j for j in self.slurm.observe() if j["name"] == name]
        return {i.job_id: i for i in read_as_slurm(named, [f"--name={name}"])}

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
