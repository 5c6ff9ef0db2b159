"""How a launch of the trainer ended, from srun's own report: parsed once, by the launcher that
ran it, and recorded in allocation.json (`LaunchEnd`) for the controller. Nobody else parses
srun's stderr.

srun reports each task that ended badly on its stderr, e.g.
    srun: error: node03: task 2: Killed
    srun: error: node01: task 0: Exited with exit code 19
Rules:
- exit code: the code of the FIRST task srun reports, when that task exited with a code. With
  --kill-on-bad-exit SLURM terminates the other tasks as soon as one exits non-zero, and srun's
  own code would then be theirs (143) instead of the code the ranks agreed on. A first task killed
  by a signal leaves srun's own code (a failure).
- culprit: a task that died of a signal (OOM killer, a dying node) is the culprit even when srun
  reports it after others (its peers see the broken connection and exit 1 on their own, sometimes
  before slurmstepd reported the killed one); without one, the first task srun reports.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from .codes import ExitCode
from .files import ContractError
from .values import is_int

TASK_REPORT = re.compile(r"srun: error: ([^:\s]+): tasks? ([0-9,\-]+): (.+)")
EXITED = re.compile(r"Exited with exit code ([0-9]+)")


@dataclass(frozen=True)
class TaskReport:
    host: str
    task: str  # "2", or "0-3" when srun groups them
    what: str  # "Killed", "Exited with exit code 1", "Terminated", ...

    @property
    def signalled(self) -> bool:
        return "Killed" in self.what or "signal" in self.what.lower()

    @property
    def exit_code(self) -> int | None:
        found = EXITED.search(self.what)
        return int(found.group(1)) if found else None


def parse_srun_report(text: str) -> list[TaskReport]:
    """The tasks srun reported, in its order."""
    reports = []
    for line in text.splitlines():
        found = TASK_REPORT.search(line)
        if found:
            reports.append(TaskReport(found.group(1), found.group(2), found.group(3).strip()))
    return reports


@dataclass(frozen=True)
class LaunchEnd:
    """One launch's end: the exit code the run acts on and the task to blame, if any."""

    launch: int
    exit_code: int
    srun_exit_code: int
    failed_host: str | None = None
    failed_task: str | None = None
    what: str | None = None  # what srun said about that task

    @property
    def blames_signalled_task(self) -> bool:
        """Only a task killed by a signal is blamed: a task that exited with a code is not (its
        peers exit too when one dies, and a bug fails the same way on every node)."""
        return bool(self.failed_host and self.what and TaskReport(self.failed_host, "", self.what).signalled)

    def describe(self) -> str:
        where = f"; {self.failed_host} task {self.failed_task}: {self.what}" if self.failed_host else ""
        return f"launch {self.launch}: {ExitCode.describe(self.exit_code)}{where}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_srun(cls, launch: int, srun_exit_code: int, stderr_text: str) -> LaunchEnd:
        reports = parse_srun_report(stderr_text)
        code = srun_exit_code
        if srun_exit_code != 0 and reports and reports[0].exit_code is not None:
            code = reports[0].exit_code
        culprit = next((r for r in reports if r.signalled), reports[0] if reports else None)
        return cls(
            launch=launch,
            exit_code=code,
            srun_exit_code=srun_exit_code,
            failed_host=culprit.host if culprit else None,
            failed_task=culprit.task if culprit else None,
            what=culprit.what[:300] if culprit else None,
        )

    @classmethod
    def from_dict(cls, data: Any) -> LaunchEnd:
        if not isinstance(data, dict):
            raise ContractError("launch end: expected a JSON object")

        def number(name: str) -> int:
            value = data.get(name)
            if not is_int(value):
                raise ContractError(f"launch end: {name} {value!r} is not an integer")
            return value

        def text(name: str) -> str | None:
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise ContractError(f"launch end: {name} {str(value)[:40]!r} is not a string")
            return None if value is None else value[:300]

        return cls(
            launch=number("launch"),
            exit_code=number("exit_code"),
            srun_exit_code=number("srun_exit_code"),
            failed_host=text("failed_host"),
            failed_task=text("failed_task"),
            what=text("what"),
        )
