"""Evidence before a cancel: ask the live ranks for their Python stacks and list what they wrote.

The controller publishes accepted/dump-stacks (only it may ask); each rank's heartbeat thread
answers with stacks/rank-NNNNN.txt. A stack file counts as an answer when it is new or its mtime
changed since just before the request: the mtime is stamped by a node or the file server, so it
is compared only with earlier stamps of the same file, never with the login node's clock. GPU
jobs also leave NCCL flight-recorder dumps (stacks/<FLIGHT_RECORDER_PREFIX><job>-rank-N), listed
apart. Waiting is bounded (`wait_seconds`): stacks are evidence, not a reason to delay a restart.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from orchestrator.contract import DUMP_STACKS_REQUEST, RunPaths, atomic_write_json
from orchestrator.contract import failure_events as fev
from orchestrator.contract.paths import STACK_DUMP_PATTERN


def _stack_mtimes(paths: RunPaths) -> dict[str, float]:
    try:
        entries = list(os.scandir(paths.stacks))
    except OSError:
        return {}
    stamps = {}
    for entry in entries:
        if not STACK_DUMP_PATTERN.match(entry.name):  # flight-recorder dumps, files being written
            continue
        try:
            stamps[entry.name] = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
    return stamps


def _flight_recorder_dumps(paths: RunPaths, job_id: str) -> list[str]:
    prefix = paths.flight_recorder_prefix(job_id).name
    try:
        return sorted(name for name in os.listdir(paths.stacks) if name.startswith(prefix))
    except OSError:
        return []


def collect_stacks(
    paths: RunPaths,
    job_id: str,
    *,
    expected: int,
    wait_seconds: float,
    now: float,
    monotonic: Callable[[], float],
    sleep: Callable[[float], None],
) -> fev.StacksDumped | fev.StacksNotDumped:
    """Ask, wait until `expected` ranks answered or `wait_seconds` passed, and return the event
    to record."""
    before = _stack_mtimes(paths)
    request = paths.accepted_request(DUMP_STACKS_REQUEST)
    try:
        atomic_write_json(request, {"time": now, "job_id": job_id, "by": "controller"}, mode=0o644)
    except OSError as exc:
        return fev.StacksNotDumped(job_id=job_id, error=str(exc))

    def answered() -> list[str]:
        return sorted(name for name, stamp in _stack_mtimes(paths).items() if before.get(name) != stamp)

    deadline = monotonic() + wait_seconds
    files = answered()
    while len(files) < expected and monotonic() < deadline:
        sleep(min(0.5, max(0.05, wait_seconds / 10)))
        files = answered()
    request.unlink(missing_ok=True)
    recorder = _flight_recorder_dumps(paths, job_id)
    return fev.StacksDumped(
        job_id=job_id,
        files=files[:64],
        ranks_answered=len(files),
        ranks_expected=expected,
        directory=str(paths.stacks),
        flight_recorder=recorder[:64],
        flight_recorder_dumps=len(recorder),
    )
