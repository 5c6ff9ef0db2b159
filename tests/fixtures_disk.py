"""A small real filesystem that fills up: `small_filesystem(directory, size_bytes)` mounts a
tmpfs of that size on `directory` (root, as CI is), or a loop-mounted ext4 image where tmpfs
cannot be mounted, and unmounts it at the end of the test. Without either it skips with why.
Registered for every test through `pytest_plugins` in tests/conftest.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _mount_tmpfs(directory: Path, size: int) -> str | None:
    done = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(directory))
    return None if done.returncode == 0 else done.stderr.strip()


def _mount_loop_ext4(directory: Path, size: int, image: Path) -> str | None:
    if shutil.which("mkfs.ext4") is None:
        return "no mkfs.ext4"
    with open(image, "wb") as handle:
        handle.truncate(max(size, 1 << 20))
    made = _run("mkfs.ext4", "-q", "-m", "0", "-F", str(image))
    if made.returncode != 0:
        return made.stderr.strip()
    done = _run("mount", "-o", "loop", str(image), str(directory))
    return None if done.returncode == 0 else done.stderr.strip()


def resize(directory: Path, size_bytes: int) -> None:
    """Give a mounted tmpfs another size (it cannot shrink below what it holds)."""
    done = _run("mount", "-o", f"remount,size={size_bytes}", str(directory))
    if done.returncode != 0:
        raise RuntimeError(f"cannot resize the tmpfs on {directory}: {done.stderr.strip()}")


def fill(directory: Path, leave_bytes: int = 0, name: str = "filler.bin") -> Path:
    """Write a file that leaves about `leave_bytes` free on the filesystem of `directory` (another
    writer of a shared filesystem); it stops at ENOSPC whatever the block rounding."""
    path = Path(directory) / name
    chunk = b"\0" * (1 << 16)
    with open(path, "ab") as handle:
        while (room := shutil.disk_usage(directory).free - leave_bytes) > 0:
            try:
                handle.write(chunk[: min(len(chunk), room)])
                handle.flush()
            except OSError:
                break
    return path


@pytest.fixture
def small_filesystem(tmp_path: Path):
    mounted: list[Path] = []

    def mount(directory: Path, size_bytes: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small filesystem needs root (CI runs as root)")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        why = _mount_tmpfs(directory, size_bytes)
        if why is not None:
            why_loop = _mount_loop_ext4(directory, size_bytes, tmp_path / f"fs-{len(mounted)}.img")
            if why_loop is not None:
                pytest.skip(f"cannot mount a small filesystem: tmpfs: {why}; loop ext4: {why_loop}")
        mounted.append(directory)
        return directory

    yield mount
    for directory in reversed(mounted):
        done = _run("umount", str(directory))
        if done.returncode != 0:
            _run("umount", "-l", str(directory))  # a process still holds it: detach it now
