"""The node-local folder where the ranks of one node leave their beats for local rank 0, which
gathers them into the node's one heartbeat file (orchestrator.contract.NodeBeat).

    /dev/shm/runctl-<uid>/<job>-<restart>-<launch>-<host>/rank-NNNNN.json

In memory (tmpfs), written about once a second by every rank: no shared filesystem touched. Keyed
by host too, because the local test cluster's emulated nodes share one /dev/shm; by the job's
incarnation, so a relaunch never reads the last launch's beats. Both folders are this user's, mode
0700, checked (orchestrator.contract.filemodes.private_dir), and every file is opened through the folder's
descriptor without following links and read bounded: another user cannot feed a beat in.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

from orchestrator.contract import ContractError, Heartbeat
from orchestrator.contract.filemodes import private_dir
from orchestrator.contract.files import loads_bounded
from orchestrator.contract.heartbeat import HEARTBEAT_MAX_BYTES
from orchestrator.contract.paths import rank_file_name

SHM = Path("/dev/shm")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,200}")
RANK_FILE = re.compile(r"rank-\d{5,}\.json")
# A live node's folder changes every LOCAL_BEAT_SECONDS (a rename per rank beat): one untouched this
# long is a job's whose local rank 0 was killed (SIGKILL, a lost node) before it could remove it.
STALE_FOLDER_SECONDS = 6 * 3600.0


def node_local_root() -> Path:
    """/dev/shm where there is one (Linux), else the temporary folder."""
    return SHM if SHM.is_dir() else Path(tempfile.gettempdir())


class NodeLocalBeats:
    """One rank's view of its node's folder: `write` its own beat; `read` the peers' (local rank 0)."""

    def __init__(self, job_id: str, restart_count: int, launch: int, host: str, root: Path | None = None):
        name = f"{job_id}-{restart_count}-{launch}-{host}"
        if not SAFE_NAME.fullmatch(name):
            raise ValueError(
                f"job id {job_id!r} and host {host!r} cannot name a folder under /dev/shm "
                "(letters, digits, . _ - only): set SLURM_JOB_ID/TRAINER_JOB_ID and SLURMD_NODENAME"
            )
        self.parent = (root or node_local_root()) / f"runctl-{os.geteuid()}"
        self.path = self.parent / name
        self._dir_fd: int | None = None

    def open(self) -> NodeLocalBeats:
        """Create (or join) the folder; every rank of the node does, whichever comes first."""
        private_dir(self.parent)
        private_dir(self.path)
        self._dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        return self

    def write(self, beat: Heartbeat) -> None:
        """Atomically, through the folder's descriptor: once local rank 0 removed the folder at its
        exit, a late write fails (FileNotFoundError) instead of leaving a new folder behind."""
        name = rank_file_name(beat.rank)
        tmp = f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=self._dir_fd)
        try:
            os.write(fd, beat.to_json().encode())
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)

    def read(self, skip_rank: int | None = None) -> list[Heartbeat]:
        """The beats the node's ranks left (but `skip_rank`'s): a bad or vanishing file is skipped."""
        beats = []
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        for name in os.listdir(self._dir_fd):
            if not RANK_FILE.fullmatch(name) or name == (skip_rank is not None and rank_file_name(skip_rank)):
                continue
            try:
                fd = os.open(name, flags, dir_fd=self._dir_fd)
            except OSError:
                continue
            try:
                beats.append(Heartbeat.from_dict(loads_bounded(os.read(fd, HEARTBEAT_MAX_BYTES))))
            except (OSError, ValueError, ContractError):
                continue
            finally:
                os.close(fd)
        return beats

    def sweep(self, older_than: float = STALE_FOLDER_SECONDS, now: float | None = None) -> list[str]:
        """Local rank 0 at its start: remove the folders of this user's earlier jobs left behind
        (a local rank 0 SIGKILLed never ran `remove`), those untouched for `older_than` seconds.
        Only directories named like ours, owned by this user, inside our private folder (checked
        by `open`); never through a link (lstat, and rmtree by descriptors). Returns their names."""
        now = time.time() if now is None else now
        removed = []
        try:
            names = os.listdir(self.parent)
        except OSError:
            return removed
        for name in names:
            if name == self.path.name or not SAFE_NAME.fullmatch(name):
                continue
            try:
                info = os.lstat(self.parent / name)
            except OSError:
                continue
            if (
                not stat.S_ISDIR(info.st_mode)
                or info.st_uid != os.geteuid()
                or now - info.st_mtime < older_than
            ):
                continue
            shutil.rmtree(self.parent / name, ignore_errors=True)  # fd-based: a link inside is not followed
            removed.append(name)
        return removed

    def remove(self) -> None:
        """Local rank 0 at its exit: nothing left in /dev/shm."""
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None
        shutil.rmtree(self.path, ignore_errors=True)
