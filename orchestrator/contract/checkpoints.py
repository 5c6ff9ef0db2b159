"""The controller's read-only view of checkpoints: which exist, which a resume will use, how big.

The login node never reads a checkpoint's bytes to decide a restart: hashing BLOOM's 2.3 TB on one
thread is most of an hour, with nothing supervised meanwhile. The ranks verify hashes when they
resume (in parallel, each its own shard) and report a damaged checkpoint in
`checkpoints/damaged.jsonl`. The controller predicts their choice with the same rule
(contract.resume_candidates: newest with a manifest, not newer than `latest`) and checks only what
is cheap: the manifest and every file's presence and size (stat), plus the ranks' damage reports.
A checkpoint removed meanwhile (keep-last) is skipped, never an error. Nothing is ever deleted here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract import (
    MANIFEST_NAME,
    ContractError,
    DirectiveError,
    damaged_names,
    read_checkpoint_state,
    read_manifest,
    resume_candidates,
    step_of,
    training_health,
    verify_manifest,
)


@dataclass
class CheckpointInfo:
    step: int
    path: Path
    complete: bool  # has a manifest
    size_bytes: int  # from the manifest (0 when incomplete)
    saved_at: float | None  # mtime of the manifest: when the checkpoint became complete


# A manifest's identity between two looks: a file replaced or rewritten changes its inode, size,
# mtime or ctime (ctime cannot be set back by its writer).
ManifestKey = tuple[int, int, int, int]
ManifestsSeen = dict[Path, tuple[ManifestKey, "CheckpointInfo"]]


def _manifest_key(path: Path) -> ManifestKey | None:
    try:
        st = os.stat(path / MANIFEST_NAME, follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _info(path: Path, seen: ManifestsSeen | None) -> CheckpointInfo | None:
    step = step_of(path.name)
    if step is None:
        return None
    key = _manifest_key(path) if seen is not None else None
    if key is not None and seen is not None and path in seen and seen[path][0] == key:
        return seen[path][1]
    size, saved_at, complete = 0, None, False
    try:
        manifest = read_manifest(path)  # bounded, never through a link, never blocking
        if manifest is not None:
            size, complete = manifest.size_bytes, True
            saved_at = os.stat(path / MANIFEST_NAME, follow_symlinks=False).st_mtime
    except (OSError, ContractError):
        pass
    info = CheckpointInfo(step, path, complete, size, saved_at)
    if key is not None and seen is not None:
        seen[path] = (key, info)
    return info


def list_checkpoints(directory: Path, seen: ManifestsSeen | None = None) -> list[CheckpointInfo]:
    """Every step_N directory, oldest first (cheap: reads manifests, hashes nothing). `seen`: the
    manifests read by earlier calls (the controller's, every pass), read again only when changed;
    a BLOOM manifest lists thousands of shards."""
    found: list[CheckpointInfo] = []
    try:
        children = list(Path(directory).iterdir())
    except OSError:
        return found
    for child in children:
        try:
            if not child.is_dir():
                continue
        except OSError:
            continue
        info = _info(child, seen)
        if info is not None:
            found.append(info)
    if seen is not None:  # forget the checkpoints deleted since
        for gone in set(seen) - {c.path for c in found}:
            del seen[gone]
    return sorted(found, key=lambda c: c.step)


def resume_point(
    directory: Path, check_hashes: bool = False
) -> tuple[CheckpointInfo | None, list[tuple[CheckpointInfo, str]]]:
    """The checkpoint the next job will resume from, and the newer ones skipped with the reason
    (reported, never deleted). The controller checks sizes only and trusts the ranks' damage
    reports; `check_hashes=True` reads every byte, as the ranks do (tools and test trainers)."""
    skipped: list[tuple[CheckpointInfo, str]] = []
    damaged = set() if check_hashes else damaged_names(directory)
    for path in resume_candidates(Path(directory)):
        info = _info(path, None)
        if info is None:
            continue
        if path.name in damaged:
            skipped.append((info, "the ranks found it damaged (checkpoints/damaged.jsonl)"))
            continue
        try:
            problems = verify_manifest(path, check_hashes=check_hashes)
        except OSError as exc:  # removed while we looked (keep-last): not a candidate
            problems = [f"vanished while checked: {exc.strerror}"]
        if not problems:
            return info, skipped
        skipped.append((info, "; ".join(problems[:3])))
    return None, skipped


def rollback_candidates(directory: Path) -> list[training_health.RollbackCandidate]:
    """Every complete checkpoint with its data position (its trainer_state.json), for the rollback
    planner: verified = its manifest and sizes check and the ranks never reported it damaged (the
    same cheap check as resume_point; the ranks verify the hashes and the probe when they load
    it). One without a readable trainer_state.json (saved before it existed, or not the owner's)
    has no known data position and is left out."""
    damaged = damaged_names(directory)
    out = []
    for info in list_checkpoints(directory):
        if not info.complete:
            continue
        try:
            state = read_checkpoint_state(info.path)
            problems = verify_manifest(info.path, check_hashes=False)
        except (OSError, DirectiveError):
            continue
        if state is None:
            continue
        verified = not problems and info.path.name not in damaged
        out.append(training_health.RollbackCandidate(info.step, state.consumed_samples, verified))
    return out
