"""The run-directory contract between the controller (login node) and the trainer (SLURM tasks).

Everything the two sides say to each other is a file under one run directory on the shared
filesystem; this module is the only place that knows the names, the exit codes and how a file is
written so that a reader never sees half of it. It is imported by both sides, so it must stay
stdlib-only (no torch, no pydantic).

    <run_dir>/
      run.yaml                     frozen config of this run
      state.json                   controller state
      events.jsonl                 what the controller saw and did
      audit.jsonl                  operator actions (append-only)
      jobs/<job_id>/               rendered sbatch script and job output
      heartbeats/rank-NNNNN.json   one per rank
      control/                     kill switch and other operator requests
      checkpoints/step_NNNNNNN/    one checkpoint, MANIFEST.json written last
      checkpoints/latest           name of the newest complete checkpoint
      metrics.jsonl                one line per training step
      data_cache/                  index files of the data pipeline
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class ExitCode(enum.IntEnum):
    """How a trainer process tells the controller why it stopped.

    Anything not listed here (a Python traceback gives 1, a signal gives 128+N) is a failure:
    the controller restarts after checks.
    """

    FINISHED = 0  # trained all samples: never restart
    FAILED = 1  # generic failure: restart from the newest good checkpoint
    KILLED = 17  # stopped by the kill switch after saving: never restart
    TIME_BUDGET = 18  # exit duration / pre-timeout signal reached, checkpoint saved: continue the chain
    CONFIG_ERROR = 19  # the trainer refused the config: restarting would fail the same way

    @classmethod
    def describe(cls, code: int | None) -> str:
        if code is None:
            return "unknown"
        try:
            return cls(code).name.lower()
        except ValueError:
            if code > 128:
                return f"failed (signal {code - 128})"
            return f"failed (exit {code})"


class Phase(str, enum.Enum):
    """What a rank is doing; hang timeouts are per phase."""

    INIT = "init"
    STEP = "step"
    CHECKPOINT = "checkpoint"
    EVAL = "eval"
    EXITING = "exiting"


# Names of the operator requests in control/. The file's presence is the request; its JSON body
# says who asked and why.
KILL_REQUEST = "kill"  # graceful: checkpoint, then stop, never restart
DUMP_STACKS_REQUEST = "dump-stacks"  # every rank writes its Python stacks to stacks/
CHECKPOINT_NAME_FORMAT = "step_{step:07d}"
MANIFEST_NAME = "MANIFEST.json"
LATEST_NAME = "latest"


@dataclass(frozen=True)
class RunPaths:
    """Every path of the contract, derived from the run directory alone."""

    root: Path

    @classmethod
    def of(cls, run_dir: str | os.PathLike[str]) -> RunPaths:
        return cls(Path(run_dir).resolve())

    @property
    def config(self) -> Path:
        return self.root / "run.yaml"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def audit(self) -> Path:
        return self.root / "audit.jsonl"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    def job_dir(self, job_id: str | int) -> Path:
        return self.jobs / str(job_id)

    @property
    def heartbeats(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeats / f"rank-{rank:05d}.json"

    @property
    def control(self) -> Path:
        return self.root / "control"

    def control_request(self, name: str) -> Path:
        return self.control / name

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / CHECKPOINT_NAME_FORMAT.format(step=step)

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST_NAME

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def data_cache(self) -> Path:
        return self.root / "data_cache"

    @property
    def reports(self) -> Path:
        return self.root / "reports"


@dataclass
class Heartbeat:
    """One rank's beat. `beat_time` moves on a background thread (liveness); `progress_time`
    moves only when the training loop advances (progress). A rank stuck in a collective keeps
    beating but stops progressing: that is a hang."""

    rank: int
    world_size: int
    host: str  # SLURM's node name (SLURMD_NODENAME), else the hostname
    job_id: str
    pid: int
    step: int
    phase: str
    beat_time: float
    progress_time: float
    phase_started: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Heartbeat:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never half.

    Temp file in the same directory (same filesystem), fsync, rename, then fsync the directory
    so that the rename itself survives a node crash on GPFS/ext4.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; the other side (and other operators) must be able to read it.
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any, mode: int | None = None) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=mode)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line. A single write() of a line under PIPE_BUF-ish sizes
    with O_APPEND is not interleaved with other appenders on a local or POSIX filesystem."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o664)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read every complete line; a torn last line (a writer died mid-write) is skipped."""
    records: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if not line:
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return records


def read_json(path: Path) -> Any | None:
    """Read a file written by atomic_write_json; None if it is not there (yet)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def now() -> float:
    return time.time()


# -- checkpoint manifests -------------------------------------------------------------------------
# MANIFEST.json: {"version": 1, "step": N, "files": {rel_path: {"size": bytes, "sha256": hex}}, ...},
# written last by the trainer; a checkpoint without one (or that fails it) is not a checkpoint.
CHECKPOINT_DIR_PATTERN = re.compile(r"^step_(\d+)$")


def step_of(name: str) -> int | None:
    """The step of a checkpoint directory name (step_NNNNNNN), None for anything else."""
    match = CHECKPOINT_DIR_PATTERN.match(name)
    return int(match.group(1)) if match else None


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_manifest(ckpt_dir: Path, shard: tuple[int, int] = (0, 1)) -> list[str]:
    """Problems found (empty = good): every file of the manifest present, with its size and sha256.
    `shard=(i, n)` checks every n-th file from i, so that n ranks verify in parallel."""
    try:
        manifest = read_json(Path(ckpt_dir) / MANIFEST_NAME)
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST_NAME} unreadable: {exc}"]
    if manifest is None:
        return [f"no {MANIFEST_NAME} (the save did not finish)"]
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        return [f"{MANIFEST_NAME} lists no files"]
    problems = []
    index, count = shard
    for rel in sorted(files)[index::count]:
        expected = files[rel] or {}
        path = Path(ckpt_dir) / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != expected.get("size"):
            problems.append(f"{rel}: size {size} != {expected.get('size')} in the manifest")
            continue
        if sha256_file(path) != expected.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the manifest (corrupted)")
    return problems
