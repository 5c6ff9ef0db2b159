"""The checkpoint format both trainer.checkpoint (save, resume) and trainer.universal (conversion)
write: the MANIFEST of a checkpoint directory, hashed by every rank in parallel, and the name of a
universal conversion. Imports neither of them, so that the two never import each other.

A checkpoint directory is complete once MANIFEST.json (every file, its size and sha256; the format
is orchestrator.protocol's) is written, last and atomically.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch.distributed as tdist

from orchestrator.protocol import MANIFEST_NAME, atomic_write_json, sha256_file, verify_manifest

# `step_NNNNNNN_universal` beside `step_NNNNNNN`: its layout-free conversion (trainer.universal).
UNIVERSAL_SUFFIX = "_universal"


# -- helpers that work without torch.distributed too (tests, single process) --------------------
def dist_world() -> tuple[int, int]:
    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank(), tdist.get_world_size()
    return 0, 1


def dist_barrier() -> None:
    if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.barrier()


def gather_to_all(obj: Any) -> list[Any]:
    rank, world = dist_world()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    tdist.all_gather_object(out, obj)
    return out


def list_files(ckpt_dir: Path) -> list[str]:
    """Every file under the checkpoint, relative, sorted; the manifest itself excluded."""
    return sorted(
        str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST_NAME
    )


# -- manifest --------------------------------------------------------------------------------
def hash_files_shared(ckpt_dir: Path, files: list[str]) -> dict[str, dict[str, Any]]:
    """Hash `files` with every rank taking its share; every rank returns the full table."""
    rank, world = dist_world()
    mine = {}
    for rel in files[rank::world]:
        path = ckpt_dir / rel
        mine[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    table: dict[str, dict[str, Any]] = {}
    for part in gather_to_all(mine):
        table.update(part)
    return table


def write_manifest(ckpt_dir: Path, entries: dict[str, dict[str, Any]], meta: dict[str, Any]) -> None:
    manifest = {"version": 1, "created": time.time(), "files": entries, **meta}
    atomic_write_json(ckpt_dir / MANIFEST_NAME, manifest)


def verify_shared(ckpt_dir: Path) -> list[str]:
    """Collective: each rank verifies its share of the files; every rank gets all problems."""
    rank, world = dist_world()
    problems = verify_manifest(ckpt_dir, shard=(rank, world))
    merged: list[str] = []
    for part in gather_to_all(problems):
        merged.extend(part)
    return sorted(set(merged))
