"""The controller's read-only view of checkpoints: which exist, which verify, how big they are.

The trainer resumes from the newest checkpoint whose MANIFEST verifies; the controller checks the
same thing to say which step a restart will resume from, to report a damaged checkpoint (never
deleting it) and to size the next one for the disk check. Verification reads every byte (sha256),
so the controller does it only when it restarts or reports, not on every pass.

The manifest format and its verification are the contract's (orchestrator.protocol.verify_manifest),
shared with the trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.protocol import LATEST_NAME, MANIFEST_NAME, step_of, verify_manifest


@dataclass
class CheckpointInfo:
    step: int
    path: Path
    complete: bool  # has a manifest
    size_bytes: int  # from the manifest (0 when incomplete)
    saved_at: float | None  # mtime of the manifest: when the checkpoint became complete


def list_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Every step_N directory, oldest first (cheap: reads manifests, hashes nothing)."""
    found: list[CheckpointInfo] = []
    try:
        children = list(Path(directory).iterdir())
    except FileNotFoundError:
        return found
    for child in children:
        step = step_of(child.name)
        if step is None or not child.is_dir():
            continue
        manifest_path = child / MANIFEST_NAME
        size, saved_at, complete = 0, None, False
        try:
            manifest = json.loads(manifest_path.read_text())
            size = sum(int(meta.get("size", 0)) for meta in manifest["files"].values())
            saved_at = manifest_path.stat().st_mtime
            complete = True
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        found.append(CheckpointInfo(step, child, complete, size, saved_at))
    return sorted(found, key=lambda c: c.step)


def verify_checkpoint(path: Path) -> str | None:
    """None if every file of the manifest is there with its size and sha256; else what is wrong."""
    problems = verify_manifest(Path(path))
    return "; ".join(problems[:3]) if problems else None


def newest_verified(directory: Path) -> tuple[CheckpointInfo | None, list[tuple[CheckpointInfo, str]]]:
    """The checkpoint a resume will use, and the newer ones that were skipped with the reason."""
    skipped: list[tuple[CheckpointInfo, str]] = []
    for info in reversed(list_checkpoints(directory)):
        problem = verify_checkpoint(info.path)
        if problem is None:
            return info, skipped
        skipped.append((info, problem))
    return None, skipped


def latest_pointer(directory: Path) -> str | None:
    try:
        return (Path(directory) / LATEST_NAME).read_text().strip() or None
    except OSError:
        return None
