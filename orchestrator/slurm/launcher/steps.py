"""Running srun steps from the launcher: one step (a launch, a standby, the health check), its
stderr teed to the job output and to a file in the owner-only job folder, and killing a step by
name (a hung rank ignores SIGTERM).

srun's report (how each task ended) is parsed from the lines the tee saw on srun's own pipe, never
read back from the file: the file is evidence for people, and a file can be replaced (a job folder
made by an older runctl was group-writable) where a pipe cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.contract import LaunchEnd

SRUN_LINE = b"srun: "
MAX_REPORT_LINES = 20_000  # srun's own lines kept for its report (a line per failed task, and some)


def open_new_file(path: Path):
    """A fresh file only this user can read, never through a planted file or link: the old one (a
    requeued job reuses its id and launch numbers) is removed, then O_CREAT|O_EXCL|O_NOFOLLOW."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "ab")


@dataclass
class Step:
    """One srun step of the launcher: a launch, or the standby that may become one."""

    proc: subprocess.Popen
    name: str
    launch: int
    nodes: list[str]
    stderr_path: Path
    copier: threading.Thread = field(default_factory=threading.Thread)
    srun_lines: deque[bytes] = field(default_factory=lambda: deque(maxlen=MAX_REPORT_LINES))

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], name: str, launch: int, nodes: list[str],
              stderr_path: Path) -> Step:  # fmt: skip
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        step = cls(proc, name, launch, list(nodes), stderr_path)
        step.copier = threading.Thread(target=step._tee, daemon=True)
        step.copier.start()
        return step

    def _tee(self) -> None:
        """srun's stderr to the job output and to `stderr_path`, which moves from the standby's
        file to the launch's when the standby becomes one."""
        path, copy = None, None
        try:
            for line in iter(self.proc.stderr.readline, b""):
                if line.startswith(SRUN_LINE):
                    self.srun_lines.append(line)
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
                if path != self.stderr_path:
                    if copy is not None:
                        copy.close()
                    path = self.stderr_path
                    copy = open_new_file(path)
                copy.write(line)
                copy.flush()
        finally:
            if copy is not None:
                copy.close()

    def covers(self, nodes: list[str]) -> bool:
        return self.proc.poll() is None and set(nodes) <= set(self.nodes)

    def finish(self, timeout: float | None = None) -> LaunchEnd:
        """How it ended, from srun's code and its report (contract.job_end parses it, once), as
        srun wrote it to its pipe."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.copier.join(timeout=10)
        text = b"".join(self.srun_lines).decode(errors="replace")
        return LaunchEnd.from_srun(self.launch, self.proc.returncode, text)


def kill_step(job_id: str, name: str) -> bool:
    """SIGKILL the running step named `name` of the job (a hung rank ignores SIGTERM; a stopped one too)."""
    listed = subprocess.run(
        ["squeue", "--steps", f"--jobs={job_id}", "--noheader", "--format=%i %j"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in listed.stdout.splitlines():
        step, _, step_name = line.strip().partition(" ")
        if step_name.strip() == name:
            subprocess.run(["scancel", "--signal=KILL", step], check=False)
            return True
    return False
