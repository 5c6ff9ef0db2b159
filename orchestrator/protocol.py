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
      jobs/<job_id>/allocation.json  the in-allocation launcher's nodes, spares and launches
      jobs/<job_id>/decisions/     the controller's decision after a failed launch (owner-only)
      jobs/<job_id>/health/        per-node health-check results before the first launch
      jobs/submissions.jsonl       one line per submitted job (the ledger)
      jobs/last_seen.json          last state seen from the scheduler, per job
      heartbeats/rank-NNNNN.json   one per rank
      controller.json              the controller's own heartbeat (pid, host, passes)
      control/                     operator requests (group-writable drop box; untrusted)
      accepted/                    requests the controller authenticated (owner-only); the
                                   trainer acts on these, never on control/ directly
      checkpoints/step_NNNNNNN/    one checkpoint, MANIFEST.json written last
      checkpoints/latest           name of the newest complete checkpoint
      checkpoints/damaged.jsonl    checkpoints skipped at resume because they did not verify
                                   (checkpoints/ is `checkpoint.dir` of the config when set)
      metrics.jsonl                one line per training step
      data_cache/                  index files of the data pipeline
"""

from __future__ import annotations

import enum
import errno
import hashlib
import json
import os
import re
import stat
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
    # The in-allocation launcher found fewer healthy nodes than the run needs (allocation.json
    # says which failed and why): a failure, restarted at job level without them.
    UNHEALTHY_NODES = 20

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


class JobState(str, enum.Enum):
    """A job's state as both sides record it (state.json, jobs/last_seen.json). The scheduler
    backends map their own states onto these (orchestrator.slurm.base.SLURM_STATE_TABLE)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"
    HELD = "held"
    UNKNOWN = "unknown"  # not in squeue any more and no accounting to ask

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES

    @classmethod
    def parse(cls, value: str) -> JobState:
        """A recorded state back to the enum; anything unrecognised is UNKNOWN."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


TERMINAL_JOB_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL}
)


class Outcome(str, enum.Enum):
    """What an ended job means for the run (classify_end)."""

    FINISHED = "finished"
    KILLED = "killed"
    TIME_BUDGET = "time_budget"
    CONFIG_ERROR = "config_error"
    FAILED = "failed"
    CANCELLED = "cancelled"  # cancelled from outside (scancel by a person, preemption)


def classify_end(state: str, exit_code: int | None) -> Outcome:
    """How a job ended: the exit code when known (it says why), else the scheduler's end state.
    The one classification: the controller acts on it and `runctl status` shows it."""
    state = JobState.parse(state)
    if exit_code is not None:
        if exit_code == ExitCode.FINISHED:
            if state in (JobState.COMPLETED, JobState.UNKNOWN):
                return Outcome.FINISHED
            return Outcome.FAILED
        if exit_code == ExitCode.KILLED:
            return Outcome.KILLED
        if exit_code == ExitCode.TIME_BUDGET:
            return Outcome.TIME_BUDGET
        if exit_code == ExitCode.CONFIG_ERROR:
            return Outcome.CONFIG_ERROR
        return Outcome.FAILED
    if state is JobState.COMPLETED:
        return Outcome.FINISHED
    if state is JobState.TIMEOUT:
        return Outcome.TIME_BUDGET  # the scheduler's limit: the pre-timeout signal made the trainer save
    if state is JobState.CANCELLED:
        return Outcome.CANCELLED
    return Outcome.FAILED


# Names of the operator requests in control/. The file's presence is the request; its JSON body
# says who asked and why.
KILL_REQUEST = "kill"  # graceful: checkpoint, then stop, never restart
DUMP_STACKS_REQUEST = "dump-stacks"  # every rank writes its Python stacks to stacks/
RESUME_REQUEST = "resume"  # undo a kill or a crash-loop stop
FLIGHT_RECORDER_PREFIX = "nccl-trace-"  # stacks/nccl-trace-<job>-rank-<rank>: NCCL flight recorder dumps
CHECKPOINT_NAME_FORMAT = "step_{step:07d}"
MANIFEST_NAME = "MANIFEST.json"
LATEST_NAME = "latest"
DAMAGED_LOG_NAME = "damaged.jsonl"  # in the checkpoints dir: checkpoints the ranks found damaged


@dataclass(frozen=True)
class RunPaths:
    """Every path of the contract, derived from the run directory and, for the checkpoints, the
    config's `checkpoint.dir` (checkpoints_dir): both sides build it with
    `RunPaths.of(run_dir, cfg.checkpoint.dir)`. Without it the checkpoints are the default
    <run_dir>/checkpoints, which is right only for a config that does not move them."""

    root: Path
    checkpoints_root: Path | None = None  # None: <root>/checkpoints

    @classmethod
    def of(
        cls, run_dir: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str] | None = None
    ) -> RunPaths:
        root = Path(run_dir).resolve()
        if checkpoint_dir is None:
            return cls(root)
        return cls(root, checkpoints_dir(root, checkpoint_dir))

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

    def allocation(self, job_id: str | int) -> Path:
        """The in-allocation launcher's record of its job (orchestrator/allocation.py)."""
        return self.job_dir(job_id) / "allocation.json"

    def launch_decision(self, job_id: str | int, launch: int) -> Path:
        """The controller's decision about launch `launch` of a job (orchestrator/allocation.py)."""
        return self.job_dir(job_id) / "decisions" / f"launch-{int(launch)}.json"

    def launch_stderr(self, job_id: str | int, launch: int) -> Path:
        """srun's stderr of one launch of the trainer inside a job (which task failed, where)."""
        return self.job_dir(job_id) / f"launch-{int(launch)}.srun.stderr"

    def health(self, job_id: str | int) -> Path:
        """Per-node results of the health check before launch (trainer/health)."""
        return self.job_dir(job_id) / "health"

    @property
    def submissions(self) -> Path:
        """The submission ledger: one line per submitted job (orchestrator.runs writes it)."""
        return self.jobs / "submissions.jsonl"

    @property
    def last_seen(self) -> Path:
        """The last state seen from the scheduler per job (SLURM forgets ended jobs)."""
        return self.jobs / "last_seen.json"

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
    def accepted(self) -> Path:
        """Requests the controller authenticated, written by the owner only (see control/)."""
        return self.root / "accepted"

    def accepted_request(self, name: str) -> Path:
        return self.accepted / name

    @property
    def stacks(self) -> Path:
        return self.root / "stacks"

    def flight_recorder_prefix(self, job_id: str | int) -> Path:
        """Where a GPU job's NCCL flight recorder writes: PyTorch appends the rank to this
        (the job script sets TORCH_NCCL_DEBUG_INFO_TEMP_FILE to it, in stacks/)."""
        return self.stacks / f"{FLIGHT_RECORDER_PREFIX}{job_id}-rank-"

    @property
    def controller_heartbeat(self) -> Path:
        """The controller's own beat, rewritten every pass (`runctl doctor` watches it)."""
        return self.root / "controller.json"

    @property
    def checkpoints(self) -> Path:
        return self.checkpoints_root if self.checkpoints_root is not None else self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / CHECKPOINT_NAME_FORMAT.format(step=step)

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST_NAME

    @property
    def damaged(self) -> Path:
        """Checkpoints found damaged at resume, one JSON line each (skipped, never deleted)."""
        return self.checkpoints / DAMAGED_LOG_NAME

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
    # Which incarnation of the job wrote this beat: SLURM keeps the job id across a requeue, so
    # SLURM_RESTART_COUNT and the process start time tell a requeued job's beats from the old ones.
    restart_count: int = 0
    process_started: float = 0.0
    # Bumped on every write: the controller judges liveness by whether a beat *changed*, on its
    # own monotonic clock, never by comparing a node's clock with the login node's.
    seq: int = 0
    # Which launch of the trainer inside the job (RUNCTL_LAUNCH, set by trainer.in_allocation):
    # a launch on a spare keeps the job id and the ranks, so this tells its beats from the last one's.
    launch: int = 0

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
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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


# -- files another user can write -----------------------------------------------------------------
class UntrustedFileError(Exception):
    """A file another user could have planted is not a small regular file; `reason` says what."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


def read_untrusted(path: Path, max_bytes: int = 64 * 1024) -> tuple[bytes, os.stat_result]:
    """Read a file someone else may control, safely: never follows a symlink (O_NOFOLLOW), never
    blocks on a FIFO or device (O_NONBLOCK), accepts only a regular file of at most `max_bytes`.
    Returns the bytes and the fstat of the opened file (its st_uid is who wrote it).
    Raises FileNotFoundError when it is gone, UntrustedFileError for anything else that is wrong."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFileError(path, "is a symbolic link") from None
        raise UntrustedFileError(path, f"cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileError(path, "is not a regular file")
        if info.st_size > max_bytes:
            raise UntrustedFileError(path, f"is {info.st_size} bytes, more than the {max_bytes} allowed")
        data = os.read(fd, max_bytes + 1)
        if len(data) > max_bytes:
            raise UntrustedFileError(path, f"grew past the {max_bytes} bytes allowed while being read")
        return data, info
    finally:
        os.close(fd)


def checkpoints_dir(run_root: Path, configured: str | os.PathLike[str]) -> Path:
    """Where the checkpoints of a run live: `checkpoint.dir` of the config, relative to the run
    directory unless absolute (BLOOM kept them on a scratch filesystem). The one definition both
    sides use."""
    configured_path = Path(configured)
    return configured_path if configured_path.is_absolute() else Path(run_root) / configured_path


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


def _confined(ckpt_dir: Path, rel: object) -> Path | None:
    """The file `rel` of a manifest, or None when it could leave the checkpoint folder: not a
    plain relative path, a `..` part, or a symlink anywhere on the way (a file name from a
    manifest is data, not a path to follow)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        return None
    parts = rel.split("/")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return None
    path = Path(ckpt_dir)
    for part in parts:
        path = path / part
        if path.is_symlink():
            return None
    return path


def verify_manifest(ckpt_dir: Path, shard: tuple[int, int] = (0, 1), check_hashes: bool = True) -> list[str]:
    """Problems found (empty = good): every file of the manifest present, with its size and sha256.
    `shard=(i, n)` checks every n-th file from i, so that n ranks verify in parallel.
    `check_hashes=False` checks presence and sizes only (stat, no bytes read): what the login node
    does before a restart, since hashing 2.3 TB there would take most of an hour.
    A file name that is absolute, holds `..` or passes through a symlink is a problem, never read:
    a manifest must not make the verifier (or the loader after it) touch a file outside its
    checkpoint."""
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
        expected = files[rel] if isinstance(files[rel], dict) else {}
        path = _confined(Path(ckpt_dir), rel)
        if path is None:
            problems.append(f"{rel!r}: not a plain path inside the checkpoint (absolute, '..' or a symlink)")
            continue
        try:
            info = path.stat()
        except FileNotFoundError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):
            problems.append(f"{rel}: missing")
            continue
        size = info.st_size
        if size != expected.get("size"):
            problems.append(f"{rel}: size {size} != {expected.get('size')} in the manifest")
            continue
        if check_hashes and sha256_file(path) != expected.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the manifest (corrupted)")
    return problems


def resume_candidates(ckpt_root: Path) -> list[Path]:
    """The checkpoints a resume may use, best first: every `step_N` with a manifest, newest first,
    leaving out any newer than the one `latest` names (its save died between MANIFEST and
    `latest`: not a checkpoint by the contract). The one rule both sides follow: the trainer
    takes the first that verifies by hash (ranks in parallel), the controller predicts the same
    with sizes only. A directory that vanishes while being listed (keep-last) is just not there."""
    root = Path(ckpt_root)
    try:
        latest_name = (root / LATEST_NAME).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        latest_name = ""
    latest_step = step_of(latest_name) if latest_name else None
    found: list[tuple[int, Path]] = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        step = step_of(name)
        if step is None or (latest_step is not None and step > latest_step):
            continue
        child = root / name
        try:
            if child.is_dir() and not child.is_symlink() and (child / MANIFEST_NAME).is_file():
                found.append((step, child))
        except OSError:
            continue
    return [path for _, path in sorted(found, reverse=True)]
