"""The checkpoint format both trainer.checkpoint (save, resume) and trainer.universal (conversion)
write: the MANIFEST of a checkpoint directory, hashed by every rank in parallel, and the name of a
universal conversion. Imports neither of them, so that the two never import each other.

A checkpoint directory is complete once MANIFEST.json (every file, its size and sha256; the format
is orchestrator.contract.manifest's) is written, last and atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as tdist

from orchestrator.contract import MANIFEST_NAME, Mark, verify_manifest
from orchestrator.contract.client.progress import sha256_counted, waiting

# `step_NNNNNNN_universal` beside `step_NNNNNNN`: its layout-free conversion (trainer.universal).
UNIVERSAL_SUFFIX = "_universal"


# -- helpers that work without torch.distributed too (tests, single process) --------------------
def dist_world() -> tuple[int, int]:
    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank(), tdist.get_world_size()
    return 0, 1


def dist_barrier() -> None:
    if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
        with waiting():  # for the peers: the controller tells this rank from the one holding them up
            tdist.barrier()


def gather_to_all(obj: Any) -> list[Any]:
    rank, world = dist_world()
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    with waiting():
        tdist.all_gather_object(out, obj)
    return out


# -- manifest --------------------------------------------------------------------------------
def hash_files_shared(ckpt_dir: Path, files: list[str]) -> dict[str, dict[str, Any]]:
    """Hash `files` with every rank taking its share; every rank returns the full table."""
    rank, world = dist_world()
    mine = {}
    for rel in files[rank::world]:
        path = ckpt_dir / rel
        mine[rel] = {"size": path.stat().st_size, "sha256": sha256_counted(path, Mark.SAVE_BYTES)}
    table: dict[str, dict[str, Any]] = {}
    for part in gather_to_all(mine):
        table.update(part)
    return table


def verify_shared(ckpt_dir: Path) -> list[str]:
    """Collective: each rank verifies its share of the files; every rank gets all problems."""
    rank, world = dist_world()
    problems = verify_manifest(ckpt_dir, shard=(rank, world), digest=lambda path: sha256_counted(path, Mark.LOAD_BYTES))
    merged: list[str] = []
    for part in gather_to_all(problems):
        merged.extend(part)
    return sorted(set(merged))


def require_verified(ckpt_dir: Path) -> Path:
    """`ckpt_dir` once its manifest is the run owner's and every file in it is the owner's, with
    its size and sha256 (orchestrator.contract.verify_manifest), in this one process: what must
    stand before any torch.load(weights_only=False) of it outside the collective resume (pickle
    runs code as whoever loads it). ValueError naming the problems otherwise; nothing is loaded."""
    problems = verify_manifest(ckpt_dir)
    if problems:
        raise ValueError(
            f"{ckpt_dir} does not verify against its {MANIFEST_NAME}, so none of it is loaded: "
            f"{'; '.join(problems[:3])}"
        )
    return ckpt_dir
