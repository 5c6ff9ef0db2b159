"""The in-allocation contract: how a job with spare nodes restarts its trainer inside itself.

A job with `cluster.spare_nodes` > 0 allocates nodes + spares and runs `python -m
trainer.allocation` as its batch script's program (the launcher). The launcher checks every node's
health, then launches the trainer as an srun step on `nodes` healthy nodes ("launch 0"). When a
launch fails it does not decide what failed: it records the launch's end in allocation.json and
waits for the controller's decision, a file only the run's owner writes:

    jobs/<job_id>/allocation.json          written by the launcher (atomic), read by the controller
    jobs/<job_id>/decisions/launch-K.json  written by the controller, read by the launcher
    jobs/<job_id>/launch-K.srun.stderr     srun's stderr of launch K (which task failed, where)

A decision is `relaunch`: leave out the named nodes (maybe none), replace them with spares, and
start launch K+1 in the same allocation (no queue wait). When the controller chooses a job-level
restart instead (spares exhausted, a crash loop) it cancels the job, as without spares. It may
decide while a launch still runs (a hang): the launcher then kills that launch's step first. No
decision within `watchdog.relaunch_decision_seconds` (controller down): the launcher exits with the
launch's exit code, the job ends, and whoever supervises next restarts it at job level.

Both sides read the other's file as untrusted input (a run directory is shared): a regular file,
bounded, written by the run's owner, with the fields checked here. Stdlib only: imported by the
controller (login node) and by the launcher (inside the job).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.protocol import UntrustedFileError, atomic_write_json, read_untrusted

VERSION = 1
# The launcher's states, in order: checking health, a launch running, a launch ended and a
# decision awaited, the launcher gone (the job ends with `exit_code`).
STATES = ("health_check", "running", "waiting_decision", "ended")
ACTIONS = ("relaunch",)
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,127}")
MAX_BYTES = 256 * 1024  # 1,000 nodes with a reason each


class ContractError(ValueError):
    """A file of the contract is malformed or not the owner's; the message says which and why."""


def _nodes(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(n, str) and NODE_NAME.fullmatch(n) for n in value):
        raise ContractError(f"{what}: expected a list of SLURM node names, got {str(value)[:120]!r}")
    return list(value)


def _reasons(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ContractError(f"{what}: expected {{node: reason}}, got {str(value)[:120]!r}")
    _nodes(list(value), what)
    return {node: str(reason)[:500] for node, reason in value.items()}


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ContractError(f"{what}: expected an integer >= {minimum}, got {value!r}")
    return value


@dataclass
class Allocation:
    """The launcher's record: what it has, what it runs, what it waits for."""

    job_id: str
    state: str
    launch: int  # the current (or last) launch: 0, 1, ...
    nodes: list[str]  # the current launch's nodes, in rank order
    spares: list[str]  # healthy nodes not in use, in the order they will be taken
    unhealthy: dict[str, str] = field(default_factory=dict)  # failed the health check: reason
    left_out: dict[str, str] = field(default_factory=dict)  # left out by a decision: reason
    exit_code: int | None = None  # of the current launch once it ended
    note: str = ""  # why the launcher ended, when it did
    standby_ready: bool = False  # the next launch's warm standby has imported everything
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Allocation:
        if not isinstance(data, dict):
            raise ContractError("allocation.json: expected a JSON object")
        if data.get("version") != VERSION:
            raise ContractError(
                f"allocation.json: version {data.get('version')!r}, this controller reads {VERSION}"
            )
        state = data.get("state")
        if state not in STATES:
            raise ContractError(f"allocation.json: state {state!r} is not one of {STATES}")
        code = data.get("exit_code")
        if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
            raise ContractError(f"allocation.json: exit_code {code!r} is not an integer")
        job_id = str(data.get("job_id", ""))
        if not re.fullmatch(r"[0-9]{1,12}", job_id):
            raise ContractError(f"allocation.json: job_id {job_id[:40]!r} is not a SLURM job id")
        return cls(
            job_id=job_id,
            state=state,
            launch=_int(data.get("launch"), "allocation.json launch"),
            nodes=_nodes(data.get("nodes"), "allocation.json nodes"),
            spares=_nodes(data.get("spares"), "allocation.json spares"),
            unhealthy=_reasons(data.get("unhealthy", {}), "allocation.json unhealthy"),
            left_out=_reasons(data.get("left_out", {}), "allocation.json left_out"),
            exit_code=code,
            note=str(data.get("note", ""))[:500],
            standby_ready=data.get("standby_ready") is True,
        )


@dataclass(frozen=True)
class Decision:
    """The controller's word on one launch."""

    launch: int
    action: str  # relaunch (the only one: a job-level restart cancels the job instead)
    leave_out: tuple[str, ...] = ()
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "launch": self.launch,
            "action": self.action,
            "leave_out": list(self.leave_out),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Decision:
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ContractError("decision: expected a JSON object of version 1")
        action = data.get("action")
        if action not in ACTIONS:
            raise ContractError(f"decision: action {action!r} is not one of {ACTIONS}")
        return cls(
            launch=_int(data.get("launch"), "decision launch"),
            action=action,
            leave_out=tuple(_nodes(data.get("leave_out", []), "decision leave_out")),
            reason=str(data.get("reason", ""))[:500],
        )


def read_owned_json(path: Path, owner_uid: int | None = None) -> Any | None:
    """The JSON in `path` when it is there, a small regular file (never through a symlink) and
    written by `owner_uid` (default: this process's user, the run's owner on both sides).
    None when it is not there yet; ContractError when it is there but cannot be trusted."""
    try:
        data, info = read_untrusted(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except UntrustedFileError as exc:
        raise ContractError(str(exc)) from None
    owner = os.getuid() if owner_uid is None else owner_uid
    if info.st_uid != owner:
        raise ContractError(f"{path}: written by uid {info.st_uid}, not the run's owner (uid {owner})")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise ContractError(f"{path}: not JSON ({exc})") from None


def read_allocation(path: Path) -> Allocation | None:
    data = read_owned_json(path)
    return None if data is None else Allocation.from_dict(data)


def read_decision(path: Path) -> Decision | None:
    data = read_owned_json(path)
    return None if data is None else Decision.from_dict(data)


def write_allocation(path: Path, allocation: Allocation) -> None:
    atomic_write_json(path, allocation.to_dict(), mode=0o644)


def write_owner_json(path: Path, data: Any) -> None:
    """Atomic, in a folder only the owner writes: a reader never sees half a file or a planted one."""
    path.parent.mkdir(mode=0o755, exist_ok=True)
    atomic_write_json(path, data, mode=0o644)


def write_decision(path: Path, decision: Decision) -> None:
    write_owner_json(path, decision.to_dict())
