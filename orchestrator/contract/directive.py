"""The rollback directive: the controller's order to the trainer to go back, skip data, cut the LR.

    accepted/rollback            written by the owner's controller only (accepted/ is owner-only)
    control/rollback             an operator's request for one (`RollbackAsk` in its body; untrusted)
    checkpoints/step_N/trainer_state.json   what a checkpoint's run had applied (written by rank 0)

A `Rollback` says: resume from the newest checkpoint that verifies with step <= `to_step` (not
`latest`), never train on the samples of `skip_samples` (half-open [start, end) ranges of the
GLOBAL sample order, i.e. positions of the data index, the unit of `consumed_samples`), and
multiply the learning rate by `lr_scale` for `lr_scale_steps` steps after that checkpoint. Its
`id` is a unique token: the trainer records the ids it applied in every later checkpoint's state,
so a directive left in place is applied once, whatever restarts follow (orchestrator/contract/client/rollback.py).

The files are read as untrusted input (a run directory is shared): never through a symlink,
never blocking, a regular file of bounded size written by the run's owner, every field checked
with an error that names it. Stdlib only: the controller (login node) writes the directive and
reads checkpoint states; the trainer reads both.
"""

from __future__ import annotations

import math
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import UntrustedFileError, atomic_write_json, read_untrusted_json
from .paths import CHECKPOINT_STATE_NAME, RunPaths

VERSION = 1
MAX_BYTES = 256 * 1024
MAX_SKIP_RANGES = 1000
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
MAX_TEXT = 500


class DirectiveError(ValueError):
    """A directive or checkpoint state is malformed or not the owner's; the message says which
    field and what to do."""


def new_directive_id() -> str:
    """A unique token for Rollback.id: 16 hex digits of randomness."""
    return "rb-" + secrets.token_hex(8)


# -- field checks ------------------------------------------------------------------------------
def _int(data: dict[str, Any], key: str, what: str, minimum: int = 0) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise DirectiveError(f"{what}.{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _float(data: dict[str, Any], key: str, what: str) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DirectiveError(f"{what}.{key}: expected a finite number, got {value!r}")
    return float(value)


def _text(data: dict[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or len(value) > MAX_TEXT or any(ch in value for ch in "\x00\r\n"):
        raise DirectiveError(
            f"{what}.{key}: expected one line of text of at most {MAX_TEXT} characters, "
            f"got {str(value)[:80]!r}"
        )
    return value


def _version(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise DirectiveError(f"{what}: expected a JSON object, got {type(data).__name__}")
    version = data.get("version")
    if version != VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        hint = (
            "written by a newer controller or trainer: upgrade this side"
            if newer
            else "not a version this code ever wrote"
        )
        raise DirectiveError(f"{what}.version: {version!r}, this code reads version {VERSION} ({hint})")
    return data


def check_skip_ranges(value: Any, what: str) -> tuple[tuple[int, int], ...]:
    """[[start, end), ...] of sample positions: integers, 0 <= start < end, sorted, disjoint
    (adjacent ranges are allowed and stay as given), at most MAX_SKIP_RANGES of them."""
    if not isinstance(value, (list, tuple)) or len(value) > MAX_SKIP_RANGES:
        raise DirectiveError(
            f"{what}: expected a list of at most {MAX_SKIP_RANGES} [start, end) pairs, "
            f"got {str(value)[:80]!r}"
        )
    ranges: list[tuple[int, int]] = []
    for index, item in enumerate(value):
        ok = (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        )
        if not ok or not 0 <= item[0] < item[1]:
            raise DirectiveError(
                f"{what}[{index}]: expected [start, end) with 0 <= start < end (sample "
                f"positions), got {str(item)[:80]!r}"
            )
        if ranges and item[0] < ranges[-1][1]:
            raise DirectiveError(
                f"{what}[{index}] = {list(item)} overlaps or precedes {list(ranges[-1])}: "
                "give the ranges sorted and disjoint"
            )
        ranges.append((int(item[0]), int(item[1])))
    return tuple(ranges)


# -- the directive -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Rollback:
    id: str
    to_step: int  # resume from the newest verified checkpoint with step <= to_step
    skip_samples: tuple[tuple[int, int], ...]  # [start, end) positions of the global sample order
    lr_scale: float = 1.0  # multiplies the scheduled LR; 1.0 = no change
    lr_scale_steps: int = 0  # for this many steps after the checkpoint resumed from
    reason: str = ""
    requested_by: str = ""  # the controller's policy, or the operator's user name
    requested_at: float = 0.0  # epoch seconds, the controller's clock
    version: int = field(default=VERSION)

    def __post_init__(self) -> None:
        # One set of checks whichever way a directive is made; normalises skip_samples to tuples.
        raw = {key: getattr(self, key) for key in self.__dataclass_fields__}
        for key, value in _rollback_fields(raw).items():
            object.__setattr__(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "id": self.id,
            "to_step": self.to_step,
            "skip_samples": [list(r) for r in self.skip_samples],
            "lr_scale": self.lr_scale,
            "lr_scale_steps": self.lr_scale_steps,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "requested_at": self.requested_at,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Rollback:
        return cls(**_rollback_fields(data))


def _rollback_fields(data: Any) -> dict[str, Any]:
    what = "rollback"
    data = _version(data, what)
    unknown = sorted(set(data) - {"version", *Rollback.__dataclass_fields__})
    if unknown:
        raise DirectiveError(f"{what}: unknown field(s) {unknown} in a version-{VERSION} directive")
    ident = data.get("id")
    if not isinstance(ident, str) or not ID_PATTERN.fullmatch(ident):
        raise DirectiveError(
            f"{what}.id: expected a token of letters, digits, '_.-' (at most 64), got {str(ident)[:80]!r}"
        )
    lr_scale = _float(data, "lr_scale", what)
    if not 0.0 < lr_scale <= 1.0:
        raise DirectiveError(f"{what}.lr_scale: {lr_scale} is outside (0, 1]: it cuts the LR (1.0 = no cut)")
    lr_scale_steps = _int(data, "lr_scale_steps", what)
    if lr_scale != 1.0 and lr_scale_steps == 0:
        raise DirectiveError(
            f"{what}.lr_scale_steps: 0 with lr_scale {lr_scale}: give the number of steps "
            "the cut lasts, or lr_scale 1.0"
        )
    requested_at = _float(data, "requested_at", what)
    if requested_at < 0:
        raise DirectiveError(f"{what}.requested_at: {requested_at} is not an epoch time")
    return {
        "id": ident,
        "to_step": _int(data, "to_step", what),
        "skip_samples": check_skip_ranges(data.get("skip_samples"), f"{what}.skip_samples"),
        "lr_scale": lr_scale,
        "lr_scale_steps": lr_scale_steps,
        "reason": _text(data, "reason", what),
        "requested_by": _text(data, "requested_by", what),
        "requested_at": requested_at,
        "version": VERSION,
    }


@dataclass(frozen=True)
class RollbackAsk:
    """What an operator asks for in control/rollback (`runctl rollback`): a directive without its
    id, author and time, which the controller adds (the author from the request file's owner,
    never from its content). Checked as a directive is, with errors that name the field."""

    to_step: int
    skip_samples: tuple[tuple[int, int], ...]
    lr_scale: float = 1.0
    lr_scale_steps: int = 0

    def __post_init__(self) -> None:
        checked = self.directive("ask", "", "", 0.0)
        object.__setattr__(self, "skip_samples", checked.skip_samples)
        object.__setattr__(self, "lr_scale", checked.lr_scale)

    def to_dict(self) -> dict[str, Any]:
        return {
            "to_step": self.to_step,
            "skip_samples": [list(r) for r in self.skip_samples],
            "lr_scale": self.lr_scale,
            "lr_scale_steps": self.lr_scale_steps,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RollbackAsk:
        if not isinstance(data, dict):
            raise DirectiveError(f"rollback request: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise DirectiveError(f"rollback request: unknown field(s) {unknown}")
        checked = _rollback_fields(
            {
                "version": VERSION,
                "id": "ask",
                "reason": "",
                "requested_by": "",
                "requested_at": 0.0,
                "lr_scale": 1.0,
                "lr_scale_steps": 0,
                **data,
            }
        )
        return cls(**{name: checked[name] for name in cls.__dataclass_fields__})

    def directive(self, directive_id: str, reason: str, requested_by: str, requested_at: float) -> Rollback:
        return Rollback(
            id=directive_id,
            to_step=self.to_step,
            skip_samples=self.skip_samples,
            lr_scale=self.lr_scale,
            lr_scale_steps=self.lr_scale_steps,
            reason=reason,
            requested_by=requested_by,
            requested_at=requested_at,
        )


# -- reading and writing -----------------------------------------------------------------------
def read_owner_json(path: Path, what: str, owner_uid: int | None = None) -> Any | None:
    """The JSON in `path`: None when absent; DirectiveError when it is there but is a symlink, not
    a regular file, bigger than MAX_BYTES, not written by `owner_uid` (default: this process's
    user, the run's owner on both sides), a hard link, or not JSON of bounded nesting (the
    contract's one bounded reader)."""
    owner = os.getuid() if owner_uid is None else owner_uid
    try:
        data, _ = read_untrusted_json(path, MAX_BYTES, owner_uid=owner)
    except FileNotFoundError:
        return None
    except UntrustedFileError as exc:
        raise DirectiveError(
            f"{what}: {exc}; only the run owner's processes write these files: remove it"
        ) from None
    return data


def read_rollback(paths: RunPaths, owner_uid: int | None = None) -> Rollback | None:
    data = read_owner_json(paths.rollback_directive, "accepted/rollback", owner_uid)
    return None if data is None else Rollback.from_dict(data)


def write_rollback(paths: RunPaths, directive: Rollback) -> Path:
    """The controller's side: atomically, 0644, in the owner-only accepted/."""
    paths.accepted.mkdir(mode=0o755, exist_ok=True)
    path = paths.rollback_directive
    atomic_write_json(path, directive.to_dict(), mode=0o644)
    return path


# -- what a checkpoint's run had applied -------------------------------------------------------
@dataclass(frozen=True)
class CheckpointState:
    """checkpoints/step_N/trainer_state.json: the trainer's counters at the save and the rollback
    bookkeeping that every later checkpoint carries on (orchestrator/contract/client/rollback.py)."""

    step: int
    consumed_samples: int  # the data position (skipped samples included)
    lr_samples: int  # samples of applied steps: drives the LR
    skipped_total: int  # steps skipped for a non-finite gradient
    global_batch: int
    applied_directives: tuple[str, ...] = ()
    skip_samples: tuple[tuple[int, int], ...] = ()
    lr_scale: float = 1.0
    lr_scale_last_step: int = 0  # steps up to this one run at lr_scale (0: none)
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "step": self.step,
            "consumed_samples": self.consumed_samples,
            "lr_samples": self.lr_samples,
            "skipped_total": self.skipped_total,
            "global_batch": self.global_batch,
            "applied_directives": list(self.applied_directives),
            "skip_samples": [list(r) for r in self.skip_samples],
            "lr_scale": self.lr_scale,
            "lr_scale_last_step": self.lr_scale_last_step,
        }

    @classmethod
    def from_dict(cls, data: Any) -> CheckpointState:
        what = CHECKPOINT_STATE_NAME
        data = _version(data, what)
        applied = data.get("applied_directives")
        if not isinstance(applied, list) or not all(
            isinstance(i, str) and ID_PATTERN.fullmatch(i) for i in applied
        ):
            raise DirectiveError(
                f"{what}.applied_directives: expected a list of directive ids, got {str(applied)[:80]!r}"
            )
        lr_scale = _float(data, "lr_scale", what)
        if not 0.0 < lr_scale <= 1.0:
            raise DirectiveError(f"{what}.lr_scale: {lr_scale} is outside (0, 1]")
        return cls(
            step=_int(data, "step", what),
            consumed_samples=_int(data, "consumed_samples", what),
            lr_samples=_int(data, "lr_samples", what),
            skipped_total=_int(data, "skipped_total", what),
            global_batch=_int(data, "global_batch", what),
            applied_directives=tuple(applied),
            skip_samples=check_skip_ranges(data.get("skip_samples"), f"{what}.skip_samples"),
            lr_scale=lr_scale,
            lr_scale_last_step=_int(data, "lr_scale_last_step", what),
        )


def read_checkpoint_state(ckpt_dir: Path, owner_uid: int | None = None) -> CheckpointState | None:
    """None for a checkpoint saved before trainer_state.json existed."""
    data = read_owner_json(
        Path(ckpt_dir) / CHECKPOINT_STATE_NAME, f"{Path(ckpt_dir).name}/{CHECKPOINT_STATE_NAME}", owner_uid
    )
    return None if data is None else CheckpointState.from_dict(data)
