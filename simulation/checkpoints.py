"""Real checkpoint folders with BLOOM's sizes and no terabytes on disk, written and read by the
contract's own rules (orchestrator.contract.manifest): the manifest last, then `latest`, then
keep-last; resume = the first of `resume_candidates` whose manifest verifies, damage reported.

Each save is one sparse file per model-parallel rank (48 for tp4 x pp12, each its share of the
planner's 2.47 TB: `truncate` makes the size without the bytes). The files are zeros, so a real
sha256 would read terabytes of them: the simulation's digest is sha256 over (size, the first
4 KiB) -- a corrupted first block changes it. The harness charges the login node's hashing cost
to the virtual clock (`make_hasher`), what GPFS would cost (2.47 TB at 1 GB/s = 41 min).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from orchestrator.contract import (
    CHECKPOINT_NAME_FORMAT,
    MANIFEST_NAME,
    resume_candidates,
    step_of,
    verify_manifest,
)
from orchestrator.contract.client.checkpoints import seal_checkpoint
from orchestrator.contract.manifest import DamageReport, report_damage

HEAD_BYTES = 4096


def simulated_digest(path: Path) -> str:
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(HEAD_BYTES)
    return hashlib.sha256(f"sim:{size}:".encode() + head).hexdigest()


def make_hasher(charge: Callable[[int], None]) -> Callable[..., str]:
    """A drop-in for contract.manifest.sha256_file that charges virtual time for the bytes it 'reads'."""

    def simulated_sha256(path: Path, chunk: int = 1 << 22) -> str:
        charge(os.path.getsize(path))
        return simulated_digest(Path(path))

    return simulated_sha256


def save(
    ckpt_root: Path,
    step: int,
    *,
    total_bytes: int,
    shards: int,
    saved_at_wall: float,
    job_id: str,
    world_size: int,
    keep_last: int,
) -> Path:
    """Rank 0's save: sparse shards, MANIFEST.json last (its mtime the node's clock), `latest`,
    keep-last. OSError (ENOSPC) as the real save raises it."""
    ckpt = Path(ckpt_root) / CHECKPOINT_NAME_FORMAT.format(step=step)
    ckpt.mkdir(parents=True, exist_ok=True)
    files = {}
    each = total_bytes // shards
    for index in range(shards):
        rel = f"mp_rank_{index:02d}_model_states.pt"
        size = each + (total_bytes - each * shards if index == 0 else 0)
        with open(ckpt / rel, "wb") as handle:
            handle.truncate(size)
        files[rel] = {"size": size, "sha256": simulated_digest(ckpt / rel)}
    meta = {"step": step, "created": saved_at_wall, "world_size": world_size, "job_id": job_id}
    seal_checkpoint(Path(ckpt_root), ckpt, files, meta, keep_last)
    os.utime(ckpt / MANIFEST_NAME, (saved_at_wall, saved_at_wall))
    return ckpt


def choose_resume(ckpt_root: Path, job_id: str, now_wall: float) -> int | None:
    """trainer.checkpoint.find_resume_checkpoint on one rank's view: the first candidate whose
    manifest verifies; each damaged one met on the way is reported (as rank 0 does), never deleted."""
    for path in resume_candidates(ckpt_root):
        problems = verify_manifest(path, digest=simulated_digest)
        if not problems:
            return step_of(path.name)
        report_damage(ckpt_root, DamageReport(path.name, problems[:20], job_id, now_wall))
    return None
