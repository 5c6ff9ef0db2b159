"""A checkpoint and `latest`: the rule that says what is a checkpoint, for both sides.

    checkpoints/step_NNNNNNN/MANIFEST.json   every file with its size and sha256, written LAST
    checkpoints/latest                       name of the newest complete checkpoint (atomic rename)

A directory without a manifest (or whose files fail it) is not a checkpoint. Resume takes the
newest `step_N` not newer than the one `latest` names whose manifest verifies: the trainer by
hash (each rank its share, in parallel), the controller by sizes only (stat, no bytes read).
A damaged checkpoint is skipped and reported, never deleted.

A checkpoint's files are loaded with pickle (DeepSpeed's torch.load(weights_only=False)), which
runs code: `verify_manifest` is what stands before such a load. The manifest is read with the
bounded no-follow reader and must be the run owner's (a single-link regular file of that uid),
and so must every file it lists, besides its size and hash.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import (
    ContractError,
    UntrustedFileError,
    append_jsonl,
    atomic_write_json,
    atomic_write_text,
    check_version,
    read_jsonl,
    read_untrusted,
    read_untrusted_json,
)
from .paths import DAMAGED_LOG_NAME, LATEST_NAME, MANIFEST_NAME, step_of
from .values import int_or_none, is_int, number_or_none

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20  # BLOOM's has ~1,500 entries of ~150 bytes


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    files: dict[str, FileEntry]
    step: int | None = None  # None for a universal conversion
    created: float = 0.0
    world_size: int | None = None
    job_id: str | None = None
    # The parallel layout it was saved with ({"tp":..,"pp":..,"dp":..}); a universal
    # conversion says which checkpoint it came from instead.
    layout: dict[str, int] = field(default_factory=dict)
    universal_from: str | None = None
    # What the saved model computes on the probe batch (trainer.probe), checked after a load.
    probe: dict[str, Any] = field(default_factory=dict)
    version: int = MANIFEST_VERSION

    @property
    def size_bytes(self) -> int:
        return sum(entry.size for entry in self.files.values())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": self.version,
            "created": self.created,
            "files": {rel: {"size": e.size, "sha256": e.sha256} for rel, e in sorted(self.files.items())},
            "step": self.step,
            "world_size": self.world_size,
            "job_id": self.job_id,
            "layout": dict(self.layout),
            "probe": dict(self.probe),
        }
        if self.universal_from is not None:
            data["universal_from"] = self.universal_from
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        if not isinstance(data, dict):
            raise ContractError(f"{MANIFEST_NAME}: expected a JSON object")
        check_version(data, MANIFEST_NAME, MANIFEST_VERSION)
        files = data.get("files")
        if not isinstance(files, dict) or not files:
            raise ContractError(f"{MANIFEST_NAME} lists no files")
        entries = {}
        for rel, meta in files.items():
            size = meta.get("size") if isinstance(meta, dict) else None
            digest = meta.get("sha256") if isinstance(meta, dict) else None
            if not is_int(size) or size < 0 or not isinstance(digest, str):
                raise ContractError(f"{MANIFEST_NAME}: entry {str(rel)[:80]!r} has no valid size and sha256")
            entries[str(rel)] = FileEntry(size, digest)
        step = data.get("step")
        layout = data.get("layout") if isinstance(data.get("layout"), dict) else {}
        probe = data.get("probe") if isinstance(data.get("probe"), dict) else {}
        return cls(
            files=entries,
            step=int_or_none(step),
            created=number_or_none(data.get("created")) or 0.0,
            world_size=int_or_none(data.get("world_size")),
            job_id=None if data.get("job_id") is None else str(data.get("job_id")),
            layout={str(k): v for k, v in layout.items() if is_int(v)},
            universal_from=data.get("universal_from")
            if isinstance(data.get("universal_from"), str)
            else None,
            probe=dict(probe),
        )


def read_manifest(ckpt_dir: Path, owner_uid: int | None = None) -> Manifest | None:
    """The manifest of a checkpoint directory; None when there is none (the save did not finish).
    ContractError when it is there but malformed, not a regular file (never followed, never
    blocked on), too big, nested too deep, or, with `owner_uid`, not that user's own file."""
    try:
        data, _ = read_untrusted_json(Path(ckpt_dir) / MANIFEST_NAME, MAX_MANIFEST_BYTES, owner_uid=owner_uid)
    except FileNotFoundError:
        return None
    except UntrustedFileError as exc:
        raise ContractError(f"{MANIFEST_NAME} unreadable: {exc.reason}") from None
    return Manifest.from_dict(data)


def write_manifest(ckpt_dir: Path, manifest: Manifest) -> None:
    """Last, atomically: from here on the directory is a checkpoint."""
    if not manifest.created:
        manifest = Manifest(**{**manifest.__dict__, "created": time.time()})
    atomic_write_json(Path(ckpt_dir) / MANIFEST_NAME, manifest.to_dict())


def read_latest(ckpt_root: Path) -> str | None:
    """The checkpoint `latest` names; None when there is none, or when `latest` is not a small
    regular file (never followed, never blocked on: the controller reads it every pass)."""
    try:
        data, _ = read_untrusted(Path(ckpt_root) / LATEST_NAME, 4096)
        return data.decode("utf-8").strip() or None
    except (OSError, UntrustedFileError, UnicodeDecodeError):
        return None


def write_latest(ckpt_root: Path, name: str) -> None:
    """After the manifest, atomically: `latest` names the newest complete checkpoint."""
    atomic_write_text(Path(ckpt_root) / LATEST_NAME, name + "\n")


def complete_checkpoints(ckpt_root: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every `step_N` folder with a manifest, oldest first."""
    found = []
    try:
        children = list(Path(ckpt_root).iterdir())
    except OSError:
        return []
    for child in children:
        step = step_of(child.name)
        try:
            if (
                step is not None
                and child.is_dir()
                and not child.is_symlink()
                and (child / MANIFEST_NAME).is_file()
            ):
                found.append((step, child))
        except OSError:  # removed while listed (keep-last)
            continue
    return sorted(found)


def prune_checkpoints(ckpt_root: Path, keep_last: int) -> list[str]:
    """Keep-last: delete complete checkpoints older than the newest `keep_last`, never one the
    ranks reported damaged (kept for a person to look at) nor the one `latest` names. Renamed
    first, so that a half-deleted folder never looks like a checkpoint. Returns the names deleted."""
    complete = complete_checkpoints(ckpt_root)
    protected = {d.name for _, d in complete[-max(1, keep_last) :]} | damaged_names(ckpt_root)
    protected.add(read_latest(ckpt_root) or "")
    deleted = []
    for _, ckpt_dir in complete:
        if ckpt_dir.name in protected:
            continue
        doomed = ckpt_dir.with_name(f".deleting-{ckpt_dir.name}")
        os.replace(ckpt_dir, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(ckpt_dir.name)
    return deleted


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


def verify_manifest(
    ckpt_dir: Path,
    shard: tuple[int, int] = (0, 1),
    check_hashes: bool = True,
    owner_uid: int | None = None,
    digest: Callable[[Path], str] | None = None,
) -> list[str]:
    """Problems found (empty = good): the manifest is the owner's (`owner_uid`, default this
    process's user: the trainer and the controller run as the run's owner), and every file of it
    is present, the owner's, with its size and sha256.
    `shard=(i, n)` checks every n-th file from i, so that n ranks verify in parallel.
    `check_hashes=False` checks presence, owner and sizes only (stat, no bytes read): what the
    login node does before a restart, since hashing 2.3 TB there would take most of an hour.
    A file name that is absolute, holds `..` or passes through a symlink is a problem, never read:
    a manifest must not make the verifier (or the loader after it) touch a file outside its
    checkpoint. `digest`: how a file's sha256 is taken (default `sha256_file`; the simulation's
    sparse terabytes have their own)."""
    digest = digest or sha256_file
    owner = os.geteuid() if owner_uid is None else owner_uid
    try:
        manifest = read_manifest(ckpt_dir, owner_uid=owner)
    except (OSError, ContractError) as exc:
        return [str(exc) if isinstance(exc, ContractError) else f"{MANIFEST_NAME} unreadable: {exc}"]
    if manifest is None:
        return [f"no {MANIFEST_NAME} (the save did not finish)"]
    problems = []
    index, count = shard
    for rel in sorted(manifest.files)[index::count]:
        expected = manifest.files[rel]
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
        if info.st_uid != owner:
            problems.append(f"{rel}: written by uid {info.st_uid}, not the run's owner (uid {owner})")
            continue
        if info.st_size != expected.size:
            problems.append(f"{rel}: size {info.st_size} != {expected.size} in the manifest")
            continue
        if check_hashes and digest(path) != expected.sha256:
            problems.append(f"{rel}: sha256 differs from the manifest (corrupted)")
    return problems


def resume_candidates(ckpt_root: Path) -> list[Path]:
    """The checkpoints a resume may use, best first: every `step_N` with a manifest, newest first,
    leaving out any newer than the one `latest` names (its save died between MANIFEST and
    `latest`: not a checkpoint by the contract). The one rule both sides follow: the trainer
    takes the first that verifies by hash (ranks in parallel), the controller predicts the same
    with sizes only. A directory that vanishes while being listed (keep-last) is just not there."""
    latest_step = step_of(read_latest(ckpt_root) or "")
    complete = complete_checkpoints(ckpt_root)
    return [path for step, path in reversed(complete) if latest_step is None or step <= latest_step]


# -- checkpoints/damaged.jsonl: what the ranks found damaged at resume ------------------------------
@dataclass(frozen=True)
class DamageReport:
    checkpoint: str  # the step_N directory's name
    problems: list[str]
    job_id: str | None = None
    time: float | None = None
    # The damaged save's MANIFEST.json sha256, when the probe found it (its hashes verify): that
    # exact save is skipped from then on (a later save of the same step is another checkpoint).
    manifest_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"checkpoint": self.checkpoint, "problems": self.problems[:20], "job_id": self.job_id}
        data["time"] = self.time
        if self.manifest_sha256:
            data["manifest_sha256"] = self.manifest_sha256
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DamageReport:
        problems = data.get("problems") if isinstance(data.get("problems"), list) else []
        stamp = data.get("time")
        return cls(
            checkpoint=str(data.get("checkpoint", "")),
            problems=[str(p) for p in problems],
            job_id=None if data.get("job_id") is None else str(data.get("job_id")),
            time=number_or_none(stamp),
            manifest_sha256=data["manifest_sha256"] if isinstance(data.get("manifest_sha256"), str) else None,
        )


def report_damage(ckpt_root: Path, report: DamageReport) -> None:
    append_jsonl(Path(ckpt_root) / DAMAGED_LOG_NAME, report.to_dict())


def read_damage_reports(ckpt_root: Path) -> list[DamageReport]:
    return [DamageReport.from_dict(r) for r in read_jsonl(Path(ckpt_root) / DAMAGED_LOG_NAME)]


def damaged_names(ckpt_root: Path) -> set[str]:
    """The checkpoints the ranks reported damaged (kept by keep-last for a person to look at)."""
    return {r.checkpoint for r in read_damage_reports(ckpt_root)}
