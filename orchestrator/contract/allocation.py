"""The job launcher's record and the controller's decisions: how a job restarts its trainer
inside its own allocation (on spare nodes) without going back to the queue.

    jobs/<job_id>/allocation.json          written by the launcher (atomic), read by the controller
    jobs/<job_id>/decisions/launch-K.json  written by the controller, read by the launcher
    jobs/<job_id>/launch-K.srun.stderr     srun's stderr of launch K (contract.job_end parses it)

Every job script execs the launcher (orchestrator/slurm/launcher); a job without spares is the
degenerate case: one launch, never a decision. Both sides read the other's file as untrusted
input (a run directory is shared): a regular file with one link, bounded, written by the run's
owner, with every field checked here.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .codes import LauncherState
from .files import ContractError, atomic_write_json, check_version, read_owned_json
from .job_end import LaunchEnd
from .values import is_int

ALLOCATION_VERSION = 1
ACTIONS = ("relaunch",)
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,127}")
MAX_BYTES = 256 * 1024  # 1,000 nodes with a reason each


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
    if not is_int(value) or value < minimum:
        raise ContractError(f"{what}: expected an integer >= {minimum}, got {value!r}")
    return value


@dataclass
class Allocation:
    """The launcher's record: what it has, what it runs, what it waits for."""

    job_id: str
    state: LauncherState
    launch: int  # the current (or last) launch: 0, 1, ...
    nodes: list[str]  # the current launch's nodes, in rank order
    spares: list[str]  # healthy nodes not in use, in the order they will be taken
    unhealthy: dict[str, str] = field(default_factory=dict)  # failed the health check: reason
    left_out: dict[str, str] = field(default_factory=dict)  # left out by a decision: reason
    ended: LaunchEnd | None = None  # how the current launch ended, once it did
    note: str = ""  # why the launcher ended, when it did
    standby_ready: bool = False  # the next launch's warm standby has imported everything
    # The job has spares: after a failed launch the launcher waits for the controller's decision.
    # Without (spare_nodes: 0) it runs one launch and ends with its code: the degenerate case.
    waits_for_decisions: bool = False
    version: int = ALLOCATION_VERSION

    def __post_init__(self) -> None:
        self.state = LauncherState(self.state)  # a writer may pass the value ("running")

    @property
    def waiting(self) -> bool:
        return self.state is LauncherState.WAITING_DECISION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        data["ended"] = self.ended.to_dict() if self.ended is not None else None
        return data

    @property
    def exit_code(self) -> int | None:
        return self.ended.exit_code if self.ended is not None else None

    @classmethod
    def from_dict(cls, data: Any) -> Allocation:
        if not isinstance(data, dict):
            raise ContractError("allocation.json: expected a JSON object")
        check_version(data, "allocation.json", ALLOCATION_VERSION)
        try:
            state = LauncherState(data.get("state"))
        except ValueError:
            raise ContractError(
                f"allocation.json: state {data.get('state')!r} is not one of {[s.value for s in LauncherState]}"
            ) from None
        ended = data.get("ended")
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
            ended=None if ended is None else LaunchEnd.from_dict(ended),
            note=str(data.get("note", ""))[:500],
            standby_ready=data.get("standby_ready") is True,
            waits_for_decisions=data.get("waits_for_decisions") is True,
        )


@dataclass(frozen=True)
class Decision:
    """The controller's word on one launch: relaunch, leaving out `leave_out` (maybe none). A
    job-level restart is not a decision: the controller cancels the job instead."""

    launch: int
    action: str
    leave_out: tuple[str, ...] = ()
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": ALLOCATION_VERSION,
            "launch": self.launch,
            "action": self.action,
            "leave_out": list(self.leave_out),
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Decision:
        if not isinstance(data, dict):
            raise ContractError("decision: expected a JSON object")
        check_version(data, "decision", ALLOCATION_VERSION)
        action = data.get("action")
        if action not in ACTIONS:
            raise ContractError(f"decision: action {action!r} is not one of {ACTIONS}")
        return cls(
            launch=_int(data.get("launch"), "decision launch"),
            action=action,
            leave_out=tuple(_nodes(data.get("leave_out", []), "decision leave_out")),
            reason=str(data.get("reason", ""))[:500],
        )


def read_allocation(path: Path) -> Allocation | None:
    data = read_owned_json(path, max_bytes=MAX_BYTES)
    return None if data is None else Allocation.from_dict(data)


def read_decision(path: Path) -> Decision | None:
    data = read_owned_json(path, max_bytes=MAX_BYTES)
    return None if data is None else Decision.from_dict(data)


def write_allocation(path: Path, allocation: Allocation) -> None:
    atomic_write_json(path, allocation.to_dict(), mode=0o644)


def write_decision(path: Path, decision: Decision) -> None:
    """In decisions/, a folder only the owner writes: a reader never sees half a file or a planted one."""
    path.parent.mkdir(mode=0o755, exist_ok=True)
    atomic_write_json(path, decision.to_dict(), mode=0o644)


@dataclass(frozen=True)
class StandbyGo:
    """The launcher's go to a warm standby (trainer.standby): become launch `launch` on `nodes`."""

    launch: int
    nodes: tuple[str, ...]
    tasks_per_node: int
    master_addr: str
    master_port: int

    def to_dict(self) -> dict[str, Any]:
        return {"version": ALLOCATION_VERSION, **asdict(self), "nodes": list(self.nodes)}

    @classmethod
    def from_dict(cls, data: Any) -> StandbyGo:
        if not isinstance(data, dict):
            raise ContractError("go file: expected a JSON object")
        check_version(data, "go file", ALLOCATION_VERSION)
        address = data.get("master_addr")
        if not isinstance(address, str) or not re.fullmatch(r"[0-9A-Za-z.:\-]{1,255}", address):
            raise ContractError(f"go file: master_addr {str(address)[:60]!r} is not an address")
        return cls(
            launch=_int(data.get("launch"), "go file launch"),
            nodes=tuple(_nodes(data.get("nodes"), "go file nodes")),
            tasks_per_node=_int(data.get("tasks_per_node"), "go file tasks_per_node", minimum=1),
            master_addr=address,
            master_port=_int(data.get("master_port"), "go file master_port", minimum=1),
        )


def read_standby_go(path: Path) -> StandbyGo | None:
    data = read_owned_json(path, max_bytes=MAX_BYTES)
    return None if data is None else StandbyGo.from_dict(data)


def write_standby_go(path: Path, go: StandbyGo) -> None:
    atomic_write_json(path, go.to_dict(), mode=0o644)
