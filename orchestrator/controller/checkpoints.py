"""The controller's read-only view of checkpoints: which exist, which verify, how big they are.

The trainer resumes from the newest checkpoint whose MANIFEST verifies; the controller checks the
same thing to say which step a restart will resume from, to report a damaged checkpoint (never
deleting it) and to size the next one for the disk check. Verification reads every byte (sha256),
so the controller does it only when it restarts or reports, not on every pass.

MANIFEST.json: {"step": N, "files": [{"path": rel, "size": bytes, "sha256": hex}, ...]}; a
mapping {rel: {"size", "sha256"}} is accepted too.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.protocol import LATEST_NAME, MANIFEST_NAME

_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class CheckpointInfo:
    step: int
    path: Path
    complete: bool  # has a manifest
    size_bytes: int  # from the manifest (0 when incomplete)
    saved_at: float | None  # mtime of the manifest: when the checkpoint became complete


def manifest_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    files = manifest.get("files", [])
    if isinstance(files, dict):
        return [{"path": rel, **(meta or {})} for rel, meta in files.items()]
    return list(files)


def list_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """Every step_N directory, oldest first (cheap: reads manifests, hashes nothing)."""
    found: list[CheckpointInfo] = []
    try:
        children = list(Path(directory).iterdir())
    except FileNotFoundError:
        return found
    for child in children:
        match = _STEP_DIR.match(child.name)
        if not match or not child.is_dir():
            continue
        manifest_path = child / MANIFEST_NAME
        size, saved_at, complete = 0, None, False
        try:
            manifest = json.loads(manifest_path.read_text())
            size = sum(int(f.get("size", 0)) for f in manifest_files(manifest))
            saved_at = manifest_path.stat().st_mtime
            complete = True
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        found.append(CheckpointInfo(int(match.group(1)), child, complete, size, saved_at))
    return sorted(found, key=lambda c: c.step)


def verify_checkpoint(path: Path) -> str | None:
    """None if every file of the manifest is there with its size and sha256; else what is wrong."""
    manifest_path = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        return "no MANIFEST.json (the save did not complete)"
    except (OSError, ValueError) as exc:
        return f"MANIFEST.json unreadable: {exc}"
    for entry in manifest_files(manifest):
        rel = entry.get("path", "")
        file_path = Path(path) / rel
        try:
            size = file_path.stat().st_size
        except OSError:
            return f"{rel}: missing"
        if "size" in entry and size != int(entry["size"]):
            return f"{rel}: size {size} bytes, manifest says {entry['size']}"
        if "sha256" in entry:
            digest = hashlib.sha256()
            with open(file_path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            if digest.hexdigest() != entry["sha256"]:
                return f"{rel}: sha256 differs from the manifest (corrupted)"
    return None


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
