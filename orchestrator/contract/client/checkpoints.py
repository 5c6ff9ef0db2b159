"""A checkpoint made complete by the contract's rules: every file hashed, MANIFEST.json written
last and atomically, then `latest` renamed to name it, then keep-last. Before the manifest the
folder is not a checkpoint (a save that died half-way is never resumed from); after it, the
controller's restart (sizes only) and every rank's resume (sizes and sha256) can trust it.

One writer for every loop: our trainer seals its DeepSpeed saves here (trainer/checkpoint.py,
trainer/async_checkpoint.py), any other loop through `Supervision.checkpoint_saved`, the
simulation its simulated shards.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.contract import MANIFEST_NAME, Manifest, Mark, prune_checkpoints, write_latest
from orchestrator.contract.manifest import FileEntry
from orchestrator.contract.manifest import write_manifest as write_manifest_record

from .progress import sha256_counted

# {relative path: {"size": bytes, "sha256": hex}}: what hashing a checkpoint's files gives.
Entries = Mapping[str, Mapping[str, Any]]


def list_files(ckpt_dir: Path) -> list[str]:
    """Every file under the checkpoint, relative, sorted; the manifest itself excluded."""
    return sorted(
        str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME
    )


def hash_files(ckpt_dir: Path, files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Size and sha256 of each file (relative to `ckpt_dir`), a SAVE_BYTES mark per chunk hashed:
    hashing is part of the save, and a long one is not a hang."""
    return {
        rel: {
            "size": (ckpt_dir / rel).stat().st_size,
            "sha256": sha256_counted(ckpt_dir / rel, Mark.SAVE_BYTES),
        }
        for rel in files
    }


def write_manifest(ckpt_dir: Path, entries: Entries, meta: Mapping[str, Any]) -> Manifest:
    """The manifest of `entries`; `meta`: the Manifest's other fields (step, world_size, job_id,
    layout, universal_from, probe; `created` defaults to now). Written last: from here on the
    folder is a checkpoint."""
    files = {rel: FileEntry(int(e["size"]), str(e["sha256"])) for rel, e in entries.items()}
    manifest = Manifest(**{"created": time.time(), **meta, "files": files})
    write_manifest_record(ckpt_dir, manifest)
    return manifest


def seal_checkpoint(
    ckpt_root: Path, ckpt_dir: Path, entries: Entries, meta: Mapping[str, Any], keep_last: int
) -> Manifest:
    """One process (rank 0), once every rank's files are on disk: the manifest, then `latest`, then
    keep-last (never the damaged nor the one `latest` names)."""
    manifest = write_manifest(ckpt_dir, entries, meta)
    write_latest(ckpt_root, ckpt_dir.name)
    prune_checkpoints(ckpt_root, keep_last)
    return manifest
