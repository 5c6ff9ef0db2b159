"""The folder of an aux job, checked before submitit unpickles anything in it; results as JSON.

submitit pickles the call into <run_dir>/aux/<kind>-<job_id>/<job_id>_submitted.pkl and unpickles
it inside the job. Loading a pickle can run any code, so whoever can write that folder runs code
as the owner. Hence:

- aux/ and each job's folder are 0700, and everything in them 0600 (the sbatch script holds the
  exported cluster.env): orchestrator.operate.auxjobs submits under PRIVATE_UMASK, the script's first
  setup line is `umask 077`, and aux/ is fchmodded 0700;
- the job runs `python -m orchestrator.operate.aux_files FOLDER` where submitit would run
  `python -m submitit.core._submit FOLDER`: `verify_job_folder` checks the run root, aux/, the
  job's folder and the pickle (owner, mode, one link, no symlink: filemodes.verify_private), and
  only then hands over to submitit. A folder that fails is refused: nothing is loaded;
- the task's outcome comes back as JSON, <job_id>_<task>_result.json (0600), written by
  auxjobs.TaskCall inside the job and read on the login node by `read_result` through the bounded,
  no-follow reader. submitit's own result pickle is written but never loaded.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import UntrustedFileError, atomic_write_text, read_untrusted_json
from orchestrator.contract.filemodes import PRIVATE_UMASK, NotPrivateError, verify_private

RESULT_MAX_BYTES = 1 << 20
TRACE_MAX_CHARS = 8000
PICKLE_WAIT_SECONDS = 60  # submitit's own wait for a pickle moved in after sbatch returned
STATUSES = ("success", "error")


class AuxResultError(Exception):
    """The result of an aux job cannot be trusted or read; the message says why."""


def result_json(job_paths: Any) -> Path:
    """<folder>/<job_id>_<task>_result.json, beside submitit's result pickle."""
    return Path(job_paths.result_pickle).with_suffix(".json")


def _not_writable_by_others(path: Path) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise NotPrivateError(
            f"{path} must be a folder of uid {os.geteuid()} that nobody else can write "
            f"(mode {stat.S_IMODE(info.st_mode):04o}, uid {info.st_uid}): chmod go-w {path}"
        )


def verify_folders(job_paths: Any) -> None:
    """The run root writable by nobody else, aux/ and the job's folder owner-only (0700)."""
    folder = Path(job_paths.folder)
    _not_writable_by_others(folder.parent.parent)
    verify_private(folder.parent, directory=True)
    verify_private(folder, directory=True)


def verify_job_folder(job_paths: Any) -> None:
    """What must hold before the job unpickles its call; NotPrivateError (or OSError) otherwise."""
    verify_folders(job_paths)
    verify_private(Path(job_paths.submitted_pickle), directory=False)


def write_result(path: Path, status: str, **fields: Any) -> None:
    """Inside the job: the outcome as JSON, 0600, written atomically."""
    atomic_write_text(path, json.dumps({"status": status, **fields}, default=str), mode=0o600)


def read_result(job_paths: Any) -> dict[str, Any] | None:
    """On the login node: the job's outcome {"status": "success", "result": ...} or {"status":
    "error", "traceback": ...}; None while there is none. AuxResultError when the folder is not
    owner-only or the file is not a small regular JSON object of this user."""
    path = result_json(job_paths)
    try:
        verify_folders(job_paths)
        value, info = read_untrusted_json(path, RESULT_MAX_BYTES)
    except FileNotFoundError:
        return None
    except (NotPrivateError, UntrustedFileError, ValueError, OSError) as exc:
        raise AuxResultError(f"refusing the result {path}: {exc}") from None
    if info.st_uid != os.geteuid() or not isinstance(value, dict) or value.get("status") not in STATUSES:
        raise AuxResultError(f"refusing the result {path}: not an aux job's result written by this user")
    return value


def tail_bytes(path: Path, max_bytes: int) -> bytes:
    """The last `max_bytes` of a regular file, opened without following a link or blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(path, "is not a regular file")
        os.lseek(fd, max(0, info.st_size - max_bytes), os.SEEK_SET)
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """`python -m orchestrator.operate.aux_files FOLDER`, inside the job (FOLDER still holds %j)."""
    os.umask(PRIVATE_UMASK)
    (folder,) = sys.argv[1:] if argv is None else argv
    os.environ["SUBMITIT_FOLDER"] = folder
    from submitit import JobEnvironment  # noqa: PLC0415
    from submitit.core.submission import process_job  # noqa: PLC0415

    paths = JobEnvironment().paths
    waited = 0
    while not os.path.lexists(paths.submitted_pickle) and waited < PICKLE_WAIT_SECONDS:
        time.sleep(1)  # submitit moves the pickle in just after sbatch returns: the job may be first
        waited += 1
    try:
        verify_job_folder(paths)
    except (NotPrivateError, OSError) as exc:
        print(f"[aux] refusing to load {paths.submitted_pickle}: {exc}", file=sys.stderr, flush=True)
        return 1
    process_job(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
