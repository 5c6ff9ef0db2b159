"""The run's exclude list: nodes that failed or hung, kept out of every later job of the run.

It lives in control/excluded-nodes.json, so that an on-call operator (group-writable control/)
can clear a node that was repaired with `runctl nodes RUN_DIR --clear NODE` while the controller
(the owner) adds nodes. Read-modify-write happens under an flock so that neither loses the other's
change.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from orchestrator.protocol import RunPaths, atomic_write_json, read_json

EXCLUDE_FILE = "excluded-nodes.json"
_LOCK_FILE = ".excluded-nodes.lock"


def exclude_path(paths: RunPaths):
    return paths.control / EXCLUDE_FILE


def read_excluded(paths: RunPaths) -> dict[str, dict[str, Any]]:
    """node -> {"since", "reason", "by"}."""
    data = read_json(exclude_path(paths)) or {}
    return dict(data.get("nodes", {}))


def excluded_nodes(paths: RunPaths) -> list[str]:
    return sorted(read_excluded(paths))


@contextmanager
def _locked(paths: RunPaths):
    paths.control.mkdir(parents=True, exist_ok=True)
    fd = os.open(paths.control / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _update(paths: RunPaths, change: Callable[[dict[str, dict[str, Any]]], None]) -> dict[str, dict[str, Any]]:
    with _locked(paths):
        nodes = read_excluded(paths)
        change(nodes)
        atomic_write_json(exclude_path(paths), {"nodes": nodes}, mode=0o664)
        return nodes


def add_excluded(paths: RunPaths, nodes: list[str], reason: str, by: str) -> dict[str, dict[str, Any]]:
    def change(current: dict[str, dict[str, Any]]) -> None:
        for node in nodes:
            current.setdefault(node, {"since": time.time(), "reason": reason, "by": by})

    return _update(paths, change)


def clear_excluded(paths: RunPaths, nodes: list[str] | None) -> list[str]:
    """Remove the given nodes (None: all); returns the nodes that were removed."""
    removed: list[str] = []

    def change(current: dict[str, dict[str, Any]]) -> None:
        for node in list(current) if nodes is None else nodes:
            if current.pop(node, None) is not None:
                removed.append(node)

    _update(paths, change)
    return removed
