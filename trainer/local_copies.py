"""Node-local copies of the newest checkpoint (`checkpoint.local_dir`): where they live, how they
are written, what a node holds.

A relaunch inside the allocation (a spare replaces a lost node) restarts every rank, so a copy kept
in a process's memory dies with it: the copies are files on node-local storage (`/dev/shm` is host
memory that outlives the process; NVMe outlives a reboot too). One tree per run, job and node:

    <local_dir>/<run key>/<job id>/<node>/step_NNNNNNN/
        own/<rel>         the files this node's ranks wrote at the save (rank 0's node: the JSON
                          files and everything else only rank 0 wrote, too)
        peer/<rel>        the buddy replicas: the files of the nodes whose buddy this node is
        fetched/<rel>     files a relaunched rank fetched from a peer (trainer/peer_replica.py)
        owners.json       {rel: rank that wrote it} (the same on every node)
        MANIFEST.json     the shared checkpoint's manifest, verbatim, written LAST: the copy exists

`<run key>` is a digest of the run directory's path (several runs share a node's /dev/shm) and the
job id keeps a later job from reading what an earlier job left on a node: job-level restarts, on
new nodes or not, read the shared copy. The shared checkpoint stays the source of truth: a local
copy is a cache checked against the same manifest (sha256 of every file) before it is loaded.

/dev/shm is writable by every user of the node: the tree is created 0700 and a directory that is a
symlink or belongs to someone else is refused (nothing under it is read).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from orchestrator.contract import CHECKPOINT_NAME_FORMAT, MANIFEST_NAME, step_of

OWN, PEER, FETCHED = "own", "peer", "fetched"
OWNERS_NAME = "owners.json"
RESTORE_PREFIX = "restore-rank-"  # restore-rank-NNNNN/step_N: what one rank's restore loads (trainer/restore_order.py)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
KEEP_STEPS = 1  # the newest sealed copy, plus the one being written: local space is scarce


class LocalCopyError(RuntimeError):
    pass


def node_name() -> str:
    """This node's SLURM name (SLURMD_NODENAME), else its short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run_key(run_dir: Path) -> str:
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def _safe(name: str, what: str) -> str:
    if not _SAFE_NAME.match(name) or name in (".", ".."):
        raise LocalCopyError(f"{what} {name!r} cannot name a local copy folder (letters, digits, . _ - only)")
    return name


def _private_dir(path: Path) -> Path:
    """`path` as a directory of ours: created 0700, or refused (a symlink, another owner, writable
    by others) with an error that names it."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise LocalCopyError(f"{path} is not a plain directory (a symlink?): local copies are off for this save")
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise LocalCopyError(f"{path} belongs to uid {info.st_uid} or is writable by others: remove it, "
                             "local copies are off until then")
    return path


class IncomingFile:
    """A file written chunk by chunk under a temporary name beside its place, moved there only
    when it is complete (a copy that stopped half-way is never mistaken for one)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # two ranks of a node may fetch one file
        self.handle = open(self.tmp, "wb")

    def write(self, chunk: memoryview) -> None:
        self.handle.write(chunk)

    def finish(self, complete: bool) -> None:
        try:
            self.handle.close()
            if complete:
                os.replace(self.tmp, self.target)
        finally:
            if not complete:
                self.tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class LocalStore:
    """One node's local copies of one job's checkpoints."""

    base: Path  # <local_dir>/<run key>/<job id>/<node>
    node: str

    @classmethod
    def of(cls, local_dir: str | Path, run_dir: Path, job_id: str, node: str | None = None) -> LocalStore:
        node = _safe(node or node_name(), "node name")
        base = Path(local_dir) / run_key(run_dir) / _safe(str(job_id), "job id") / node
        return cls(base, node)

    def create(self) -> LocalStore:
        path = self.base
        parts = [path]
        while len(parts) < 4:  # run key, job id, node (local_dir itself may be /dev/shm: not ours)
            parts.append(parts[-1].parent)
        parts[-1].mkdir(parents=True, exist_ok=True)
        for part in reversed(parts[:-1]):
            _private_dir(part)
        return self

    def usable(self) -> bool:
        """The tree exists and is ours (nothing under a refused folder is read)."""
        try:
            for part in (self.base.parent.parent, self.base.parent, self.base):
                info = part.lstat()
                if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
                    return False
        except OSError:
            return False
        return True

    def step_dir(self, step: int) -> Path:
        return self.base / CHECKPOINT_NAME_FORMAT.format(step=step)

    def path(self, step: int, kind: str, rel: str) -> Path:
        return self.step_dir(step) / kind / rel

    def incoming(self, step: int, kind: str, rel: str) -> IncomingFile:
        """A file to be written chunk by chunk (trainer/peer_replica.py): it takes its place only once complete."""
        target = self.path(step, kind, rel)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return IncomingFile(target)

    def copy_in(self, step: int, kind: str, rel: str, source: Path) -> Path:
        target = self.path(step, kind, rel)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
        return target

    def seal(self, step: int, manifest_text: str, owners: dict[str, int]) -> None:
        """owners.json, then MANIFEST.json last: from now on this node holds a copy of `step`."""
        folder = self.step_dir(step)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name, text in ((OWNERS_NAME, json.dumps(owners, sort_keys=True)), (MANIFEST_NAME, manifest_text)):
            tmp = folder / f".{name}.{os.getpid()}.tmp"  # the node's ranks all seal
            tmp.write_text(text)
            os.replace(tmp, folder / name)

    def sealed_steps(self) -> list[int]:
        if not self.usable():
            return []
        steps = []
        for child in self.base.iterdir():
            step = step_of(child.name)
            if step is not None and (child / MANIFEST_NAME).is_file():
                steps.append(step)
        return sorted(steps)

    def holdings(self, step: int) -> dict[str, str]:
        """{rel: own | peer | fetched} of the files this node holds for `step` (own first)."""
        held: dict[str, str] = {}
        for kind in (FETCHED, PEER, OWN):  # later kinds win: own is the nearest copy
            root = self.path(step, kind, "")
            if root.is_dir():
                for path in root.rglob("*"):
                    if path.is_file() and not path.name.startswith("."):
                        held[str(path.relative_to(root))] = kind
        return held

    def open_held(self, step: int, kind: str, rel: str) -> BinaryIO | None:
        """A copy opened for reading (the caller closes it), or None."""
        try:
            return open(self.path(step, kind, rel), "rb")
        except OSError:
            return None

    def manifest_text(self, step: int) -> str:
        return (self.step_dir(step) / MANIFEST_NAME).read_text()

    def owners(self, step: int) -> dict[str, int]:
        return {k: int(v) for k, v in json.loads((self.step_dir(step) / OWNERS_NAME).read_text()).items()}

    def drop(self, step: int, kind: str, rel: str) -> None:
        """A copy that failed its check: gone from this node (the next load does not meet it again)."""
        try:
            self.path(step, kind, rel).unlink()
        except FileNotFoundError:
            pass

    def prune(self, keep: int) -> None:
        """Every step folder but `keep`'s and any newer one (a save in flight), and the folders a
        restore loaded from."""
        if not self.usable():
            return
        for child in self.base.iterdir():
            step = step_of(child.name)
            if (step is not None and step < keep) or child.name.startswith(RESTORE_PREFIX):
                shutil.rmtree(child, ignore_errors=True)  # a restore's links hold old files' space


# -- the buddy ring -------------------------------------------------------------------------------
def node_order(rank_nodes: list[str]) -> list[str]:
    """The launch's nodes in rank order (each once)."""
    return list(dict.fromkeys(rank_nodes))


def buddy_nodes(nodes: list[str], offset: int = 1, failure_domains: list[list[str]] | None = None) -> dict[str, str]:
    """{node: its buddy}: the node `offset` places after it in the ring, or, when failure domains
    are known, the first node from there on outside its own domain (if the launch has one). Never
    the node itself; a launch of one node has no buddies."""
    if len(nodes) < 2:
        return {}
    domain = {node: index for index, group in enumerate(failure_domains or []) for node in group}
    buddies = {}
    for index, node in enumerate(nodes):
        ring = [nodes[(index + offset + k) % len(nodes)] for k in range(len(nodes))]
        ring = [other for other in ring if other != node]
        apart = [other for other in ring if node not in domain or domain.get(other) != domain[node]]
        buddies[node] = (apart or ring)[0]
    return buddies


def buddy_ranks(rank_nodes: list[str], offset: int = 1,
                failure_domains: list[list[str]] | None = None) -> dict[int, int]:
    """{rank: the rank that keeps its replica}: the rank of the same local index on the buddy node
    (modulo that node's rank count), so that every rank sends one set and the work is spread."""
    nodes = node_order(rank_nodes)
    on_node: dict[str, list[int]] = {node: [] for node in nodes}
    for rank, node in enumerate(rank_nodes):
        on_node[node].append(rank)
    buddies = buddy_nodes(nodes, offset, failure_domains)
    out = {}
    for rank, node in enumerate(rank_nodes):
        if node in buddies:
            peers = on_node[buddies[node]]
            out[rank] = peers[on_node[node].index(rank) % len(peers)]
    return out
