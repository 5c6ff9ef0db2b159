"""Real checkpoint directories with BLOOM's sizes and no terabytes on disk.

Rank 0 of the simulated trainer writes, per save, `checkpoints/step_NNNNNNN/` with one sparse
file per model-parallel rank (48 files for tp4 x pp12, each holding its share of the planner's
2.47 TB: `os.truncate` makes the size without the bytes), then MANIFEST.json (last, atomically),
then `latest`, then keep-last cleanup: the contract of orchestrator/protocol.py and
trainer/checkpoint.py, byte for byte except the contents.

Hashing: the files are zeros, so a real sha256 would read terabytes of them. The simulation's
digest is sha256 over (size, the first 4 KiB) -- a corrupted first block changes it -- and
`simulated_sha256` stands in for `orchestrator.protocol.sha256_file` while a harness runs,
charging the virtual clock size / login_hash_bytes_per_second: hashing on the login node costs
what it would cost on GPFS (2.47 TB at 1 GB/s = 41 min), without the wait.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from orchestrator.protocol import (
    CHECKPOINT_NAME_FORMAT,
    LATEST_NAME,
    MANIFEST_NAME,
    atomic_write_text,
    step_of,
)

HEAD_BYTES = 4096
DAMAGED_LOG = "damaged.jsonl"  # trainer/checkpoint.py's report of checkpoints it skipped


def simulated_digest(path: Path) -> str:
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(HEAD_BYTES)
    return hashlib.sha256(f"sim:{size}:".encode() + head).hexdigest()


def make_hasher(charge: Callable[[int], None]) -> Callable[..., str]:
    """A drop-in for protocol.sha256_file that charges virtual time for the bytes it 'reads'."""

    def simulated_sha256(path: Path, chunk: int = 1 << 22) -> str:
        charge(os.path.getsize(path))
        return simulated_digest(Path(path))

    return simulated_sha256


def write_checkpoint(directory: Path, step: int, total_bytes: int, shards: int, saved_at_wall: float) -> Path:
    """One complete checkpoint: sparse shards, MANIFEST.json last (mtime = the node's clock)."""
    ckpt = Path(directory) / CHECKPOINT_NAME_FORMAT.format(step=step)
    ckpt.mkdir(parents=True, exist_ok=True)
    files = {}
    each = total_bytes // shards
    for index in range(shards):
        rel = f"mp_rank_{index:02d}_model_states.pt"
        size = each + (total_bytes - each * shards if index == 0 else 0)
        with open(ckpt / rel, "wb") as handle:
            handle.truncate(size)
        files[rel] = {"size": size, "sha256": simulated_digest(ckpt / rel)}
    manifest = {"version": 1, "step": step, "files": files, "simulated": True}
    atomic_write_text(ckpt / MANIFEST_NAME, json.dumps(manifest, sort_keys=True))
    os.utime(ckpt / MANIFEST_NAME, (saved_at_wall, saved_at_wall))
    atomic_write_text(Path(directory) / LATEST_NAME, ckpt.name + "\n")
    return ckpt


def complete_steps(directory: Path) -> list[int]:
    steps = []
    try:
        for child in Path(directory).iterdir():
            step = step_of(child.name)
            if step is not None and (child / MANIFEST_NAME).exists():
                steps.append(step)
    except FileNotFoundError:
        pass
    return sorted(steps)


def damaged(directory: Path) -> set[str]:
    names = set()
    try:
        for line in (Path(directory) / DAMAGED_LOG).read_text().splitlines():
            names.add(json.loads(line).get("checkpoint", ""))
    except (OSError, ValueError):
        pass
    return names


def verify(ckpt: Path) -> list[str]:
    """The trainer's check (all ranks, in shards): every file there with its size and digest."""
    try:
        files = json.loads((ckpt / MANIFEST_NAME).read_text())["files"]
    except (OSError, ValueError, KeyError):
        return ["manifest unreadable"]
    problems = []
    for rel, meta in sorted(files.items()):
        path = ckpt / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
        elif path.stat().st_size != meta.get("size"):
            problems.append(f"{rel}: size {path.stat().st_size} != {meta.get('size')} in the manifest")
        elif simulated_digest(path) != meta.get("sha256"):
            problems.append(f"{rel}: sha256 differs from the manifest (corrupted)")
    return problems


def keep_last(directory: Path, keep: int) -> list[int]:
    """Delete complete, undamaged checkpoints older than the newest `keep`; never `latest`'s."""
    steps = complete_steps(directory)
    protected = {CHECKPOINT_NAME_FORMAT.format(step=s) for s in steps[-max(1, keep) :]} | damaged(directory)
    try:
        protected.add((Path(directory) / LATEST_NAME).read_text().strip())
    except OSError:
        pass
    deleted = []
    for step in steps:
        name = CHECKPOINT_NAME_FORMAT.format(step=step)
        if name not in protected:
            doomed = Path(directory) / f".deleting-{name}"
            os.replace(Path(directory) / name, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            deleted.append(step)
    return deleted
