"""Operator requests, from the file an operator drops in control/ to the one the trainer obeys.

    control/<name>     dropped by any operator (group-writable, untrusted): its owner (st_uid) is
                       who asked, its body only says why, and for nodes-clear which nodes
                       (`RequestBody`)
    accepted/<name>    written by the owner's controller after authenticating it (`OperatorRequest`);
                       the trainer acts on these only, never on control/

One shape along the way: the CLI writes a `RequestBody`, the controller's intake turns it into an
`OperatorRequest` (who from st_uid, never from the JSON), publishes that to accepted/, and the
trainer reads the same type back. A rollback request's body also carries what is asked
(`contract.directive.RollbackAsk`); what the trainer obeys is the directive the controller makes
of it (accepted/rollback), never the request.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .allocation import NODE_NAME
from .directive import DirectiveError, RollbackAsk
from .files import ContractError, UntrustedFileError, atomic_write_json, check_version, read_untrusted_json
from .paths import KILL_REQUEST, NODES_CLEAR_REQUEST, RESUME_REQUEST, ROLLBACK_REQUEST, RunPaths

REQUEST_VERSION = 1
REQUEST_NAMES = (KILL_REQUEST, RESUME_REQUEST, NODES_CLEAR_REQUEST, ROLLBACK_REQUEST)
MAX_REQUEST_BYTES = 4096
MAX_NODES_PER_REQUEST = 256  # what fits in MAX_REQUEST_BYTES anyway
NO_REASON = "(none given)"


def bad_node_names(nodes: Any) -> list[str]:
    """The entries of `nodes` that are not single SLURM node names (all of it when not a list)."""
    if not isinstance(nodes, list):
        return [str(nodes)[:60]]
    return [str(n)[:60] for n in nodes if not (isinstance(n, str) and NODE_NAME.fullmatch(n))]


@dataclass(frozen=True)
class RequestBody:
    """What an operator's file in control/ may say. Anything unexpected in it still means the
    request (`touch control/kill` is a kill), with no reason. A nodes-clear names its nodes
    (`nodes`, single SLURM node names) or `all`; one that names neither, or a name that is not a
    node's, is refused by the controller (`nodes_problem`)."""

    reason: str = NO_REASON
    now: bool = False  # kill --now: cancel at once, no checkpoint
    nodes: tuple[str, ...] = ()  # nodes-clear: the nodes to take off the exclude list
    all_nodes: bool = False  # nodes-clear --all
    bad_nodes: tuple[str, ...] = ()  # what it named that is not a node name (nodes is then empty)
    rollback: Any = None  # a rollback request: what is asked, as written (checked by `rollback_ask`)

    @property
    def nodes_problem(self) -> str:
        """Why a nodes-clear with this body cannot be carried out ("" when it can)."""
        if self.bad_nodes:
            return f"not SLURM node names: {list(self.bad_nodes[:5])}"
        if len(self.nodes) > MAX_NODES_PER_REQUEST:
            return f"{len(self.nodes)} nodes, more than {MAX_NODES_PER_REQUEST} in one request"
        if not self.nodes and not self.all_nodes:
            return "no nodes named"
        return ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": REQUEST_VERSION, "reason": self.reason, "now": self.now}
        if self.nodes or self.all_nodes:
            data.update(nodes=list(self.nodes), all=self.all_nodes)
        if self.rollback is not None:
            data["rollback"] = (
                self.rollback.to_dict() if isinstance(self.rollback, RollbackAsk) else self.rollback
            )
        return data

    @classmethod
    def parse(cls, data: Any) -> RequestBody:
        if not isinstance(data, dict):
            return cls()
        reason = data.get("reason")
        nodes = data.get("nodes", [])
        bad = bad_node_names(nodes)
        return cls(
            reason=reason if isinstance(reason, str) and reason.strip() else NO_REASON,
            now=data.get("now") is True,
            nodes=() if bad else tuple(nodes),
            all_nodes=data.get("all") is True,
            bad_nodes=tuple(bad),
            rollback=data.get("rollback"),
        )

    def rollback_ask(self) -> RollbackAsk:
        """What a rollback request asks for; DirectiveError (naming the field) when it is not one."""
        if self.rollback is None:
            raise DirectiveError('rollback request: no "rollback" object (to_step, skip_samples, ...) in it')
        return (
            self.rollback if isinstance(self.rollback, RollbackAsk) else RollbackAsk.from_dict(self.rollback)
        )


@dataclass(frozen=True)
class OperatorRequest:
    """An authenticated request: `user`/`uid` from the file's owner, `reason` sanitised and capped."""

    name: str  # kill, resume, nodes-clear or rollback
    user: str
    uid: int
    reason: str
    now: bool
    time: float  # the request file's mtime
    nodes: tuple[str, ...] = ()  # nodes-clear: which nodes (none with all_nodes)
    all_nodes: bool = False
    rollback: RollbackAsk | None = None  # what a rollback request asks for, checked
    version: int = REQUEST_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["rollback"] = None if self.rollback is None else self.rollback.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Any) -> OperatorRequest:
        if not isinstance(data, dict):
            raise ContractError("request: expected a JSON object")
        check_version(data, "request", REQUEST_VERSION)
        values = {}
        for name, kind in (
            ("name", str),
            ("user", str),
            ("uid", int),
            ("reason", str),
            ("now", bool),
            ("time", (int, float)),
        ):
            value = data.get(name)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ContractError(f"request: field {name!r} has a bad value {str(value)[:40]!r}")
            values[name] = value
        if bad_node_names(data.get("nodes", [])):
            raise ContractError("request: field 'nodes' is not a list of SLURM node names")
        if data.get("rollback") is not None:
            try:
                values["rollback"] = RollbackAsk.from_dict(data["rollback"])
            except DirectiveError as exc:
                raise ContractError(f"request: field 'rollback': {exc}") from None
        return cls(**values, nodes=tuple(data.get("nodes", [])), all_nodes=data.get("all_nodes") is True)


def publish_request(paths: RunPaths, request: OperatorRequest) -> None:
    """accepted/<name> for the trainer: written by the owner only, atomically, readable by all."""
    paths.accepted.mkdir(mode=0o755, exist_ok=True)
    atomic_write_json(paths.accepted_request(request.name), request.to_dict(), mode=0o644)


def withdraw_request(paths: RunPaths, name: str) -> None:
    paths.accepted_request(name).unlink(missing_ok=True)


def read_accepted(paths: RunPaths, name: str, owner_uid: int | None = None) -> OperatorRequest | None:
    """accepted/<name> when it is there and the owner's; None when it is not there. Anything else
    there (planted, malformed) still means the request, attributed to nobody: accepted/ is the
    owner's folder, so a file in it was put there by the owner's side."""
    path: Path = paths.accepted_request(name)
    try:
        data, _ = read_untrusted_json(
            path, MAX_REQUEST_BYTES, owner_uid=os.getuid() if owner_uid is None else owner_uid
        )
        return OperatorRequest.from_dict(data)
    except FileNotFoundError:
        return None
    except (UntrustedFileError, ContractError):
        return OperatorRequest(
            name=name, user="?", uid=-1, reason="(unreadable request)", now=False, time=0.0
        )
