"""Will the next checkpoint fit? Checked on every pass, reported when the answer changes.

BLOOM lost hours to a full disk. The expected size of the next checkpoint is the last complete
one's size (its MANIFEST) once there is one, else the planner's estimate. A save writes the new
checkpoint before keep-last cleanup deletes an old one, so the space needed is one whole
checkpoint plus a margin (PAUSE_MARGIN: files the manifest does not count, block rounding).
Levels: ok; "warning" when free < WARNING_MARGIN x expected (warned while there is still time to
clean up); "critical" when free < needed (the next save will fail). A failure seen while the
disk is critical pauses the run (disk_pause.py), with `what_to_delete` as the advice.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import MANIFEST_NAME, damaged_names, step_of

from .checkpoints import list_checkpoints

WARNING_MARGIN = 1.5
PAUSE_MARGIN = 0.10  # needed = expected x (1 + margin)
# Leftovers of the trainer's own housekeeping (contract.manifest.prune_checkpoints renames to
# .deleting-<name> before removing; a re-save moves an old folder to .replaced-<name>-<time>).
LEFTOVER_PREFIXES = (".deleting-", ".replaced-")


@dataclass
class DiskCheck:
    level: str  # "ok" | "warning" | "critical" | "unknown"
    free_bytes: int
    expected_bytes: int | None
    source: str  # where the expected size came from
    path: str
    mount: str = ""  # the mount point of the filesystem that holds `path`

    @property
    def needed_bytes(self) -> int | None:
        if self.expected_bytes is None:
            return None
        return math.ceil(self.expected_bytes * (1 + PAUSE_MARGIN))

    @property
    def fits(self) -> bool:
        """False only when the next checkpoint is known not to fit (an unknown size fits)."""
        needed = self.needed_bytes
        return needed is None or self.free_bytes >= needed

    def message(self, next_due_in: float | None = None) -> str:
        due = f", next checkpoint due in {next_due_in / 60:.0f} min" if next_due_in is not None else ""
        where = f"{self.path} (filesystem {self.mount})" if self.mount else self.path
        if self.expected_bytes is None:
            return f"{gib(self.free_bytes)} free on {where}; checkpoint size unknown{due}"
        return (
            f"{gib(self.free_bytes)} free on {where}, next checkpoint needs ~{gib(self.needed_bytes or 0)} "
            f"({gib(self.expected_bytes)}, {self.source}, +{PAUSE_MARGIN:.0%}){due}"
        )


def gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def free_bytes(path: Path) -> int:
    """Bytes this user can still write on the filesystem of `path` (statvfs f_bavail)."""
    return shutil.disk_usage(path).free


def mount_point(path: Path) -> str:
    """The mount point of the filesystem holding `path` (what a person runs `df` on)."""
    probe = Path(os.path.abspath(path))
    while not os.path.ismount(probe) and probe != probe.parent:
        probe = probe.parent
    return str(probe)


def check_disk(
    checkpoint_dir: Path,
    last_checkpoint_bytes: int | None,
    planned_bytes: int | None,
    free: int | None = None,
) -> DiskCheck:
    path = Path(checkpoint_dir)
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the directory may not exist before the first save
    if free is None:
        free = free_bytes(probe)
    mount = mount_point(probe)
    if last_checkpoint_bytes:
        expected, source = int(last_checkpoint_bytes), "size of the last checkpoint"
    elif planned_bytes:
        expected, source = int(planned_bytes), "planner's estimate"
    else:
        return DiskCheck("unknown", free, None, "no estimate", str(probe), mount)
    check = DiskCheck("ok", free, expected, source, str(probe), mount)
    if not check.fits:
        check.level = "critical"
    elif free < WARNING_MARGIN * expected:
        check.level = "warning"
    return check


def what_to_delete(checkpoint_dir: Path, keep_last: int, shortfall: int) -> list[dict[str, Any]]:
    """What a person can delete to make room, safest first, as {"path", "bytes", "why"}:
    unfinished saves (no MANIFEST: never resumed from) and the trainer's leftovers, then complete
    checkpoints older than the newest `keep_last`, then (only while that is not enough for
    `shortfall`) older complete checkpoints. Never the newest complete one: the run resumes from it.
    Sizes of complete checkpoints come from their manifests; unfinished ones are walked."""
    directory = Path(checkpoint_dir)
    try:
        children = sorted(directory.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    unfinished: list[dict[str, Any]] = []
    for child in children:
        if child.is_symlink() or not child.is_dir():
            continue
        if child.name.startswith(LEFTOVER_PREFIXES):
            why = "left by an interrupted keep-last cleanup or set aside by a re-save: not a checkpoint"
        elif step_of(child.name) is not None and not (child / MANIFEST_NAME).is_file():
            why = "unfinished save (no MANIFEST): never resumed from"
        else:
            continue
        unfinished.append({"path": str(child), "bytes": tree_bytes(child), "why": why})
    damaged = damaged_names(directory)
    complete = [(c.step, c.path, c.size_bytes) for c in list_checkpoints(directory) if c.complete]
    advice = list(unfinished)
    freed = sum(item["bytes"] for item in advice)
    newest = complete[-1][1].name if complete else None
    beyond_keep = len(complete) - max(1, keep_last)  # the oldest this many are past keep-last
    for index, (_step, path, size) in enumerate(complete[:-1]):
        note = ""
        if path.name in damaged:
            note = " (reported damaged, kept for inspection: copy it away first if someone needs it)"
        if index < beyond_keep:
            why = f"older than the newest keep_last={keep_last} complete checkpoints{note}"
        elif freed < shortfall:
            why = f"an older complete checkpoint: the run resumes from {newest}{note}"
        else:
            continue
        advice.append({"path": str(path), "bytes": size, "why": why})
        freed += size
    return advice


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path`, links not followed."""
    total = 0
    for root, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # removed while we looked
    return total
