"""A rank's heartbeat: what it is doing and whether it moves. Written by the trainer
(orchestrator/contract/client/beat.py), read by the controller, the dashboard and the exporter through
`read_heartbeats` only.

Two clocks in one record: `beat_time` and `seq` move on a background thread (liveness);
`progress_count` (the finest units of work done: a micro-batch forward or backward, a reduce, a
chunk of a save; contract.Mark), `step`, `phase` and `phase_started` move only when the rank
works (progress). A rank stuck in a collective keeps beating but stops progressing: a hang.
`mark_gaps` holds, per phase, the longest gap the rank saw between two of its own marks: the
controller learns its timeouts from it. Node clocks are never compared with the login node's:
the controller judges by change, and the gaps are durations on the node's monotonic clock.

    heartbeats/node-<host>.json   one file per node (NodeBeat): every rank of the node
    heartbeats/rank-NNNNN.json    a rank alone on its node (before version 3: every rank)

A node's local rank 0 writes its node file, gathering its peers' beats from node-local files
(orchestrator/contract/client/beat.py): 48 files for BLOOM's 384 ranks, 2,048 for 16,384 GPUs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from .codes import Mark, Phase
from .files import (
    ContractError,
    ContractVersionError,
    atomic_write_text,
    check_version,
    deferred_collection,
    loads_bounded,
    read_upto,
)
from .paths import rank_file_name
from .values import is_int, is_number

HEARTBEAT_VERSION = 3  # 3: node files and fine progress; 2: a file per rank; 1: an `extra` dict
HEARTBEAT_MAX_BYTES = 1 << 16  # a beat is ~700 bytes; anything bigger is not one
NODE_BEAT_MAX_BYTES = 1 << 20  # 64 ranks a node at most, with room
NODE_FILE = re.compile(r"node-([A-Za-z0-9][A-Za-z0-9_.\-]{0,127})\.json")


def _durations(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= 16
        and all(isinstance(k, str) and is_number(x) for k, x in value.items())
    )


def _seconds(value: dict) -> dict[str, float]:
    return {k: float(x) for k, x in value.items()}


def _optional(check):
    return lambda value: value is None or check(value)


def _at_least(low: int):
    return lambda value: is_int(value) and value >= low


def _text(limit: int | None = None):
    return lambda value: isinstance(value, str) and (limit is None or len(value) <= limit)


def _checked(check, convert=None, **default) -> Any:
    """A Heartbeat field with how a record's value is judged (`check`: False loses the value, or
    the beat when the field has no default) and turned into the field's (`convert`). Every field
    is declared with one: from_dict reads only what a check admits (_checks_of)."""
    return field(metadata={"check": check, "convert": convert}, **default)


@dataclass(slots=True)
class Heartbeat:
    rank: int = _checked(_at_least(0))
    world_size: int = _checked(_at_least(1))
    host: str = _checked(_text(256))  # SLURM's node name (SLURMD_NODENAME), else the hostname
    job_id: str = _checked(
        lambda v: isinstance(v, (str, int)) and not isinstance(v, bool) and len(str(v)) <= 64, str
    )
    pid: int = _checked(is_int)
    step: int = _checked(_at_least(0))
    phase: Phase = _checked(_text(), Phase.parse)
    beat_time: float = _checked(is_number)  # node clock: for people, never compared with the login node's
    progress_time: float = _checked(is_number)
    phase_started: float = _checked(is_number)
    # Which incarnation of the job wrote this beat: SLURM keeps the job id across a requeue, so
    # SLURM_RESTART_COUNT and the process start time tell a requeued job's beats from the old ones;
    # `launch` (RUNCTL_LAUNCH) tells a relaunch on a spare inside the job from the last launch.
    restart_count: int = _checked(_at_least(0), default=0)
    process_started: float = _checked(is_number, default=0.0)
    launch: int = _checked(_at_least(0), default=0)
    # Bumped on every write: liveness is whether a beat *changed*.
    seq: int = _checked(is_int, default=0)
    # Fine progress: marks done by this process (contract.Mark), the last one's kind, and per
    # phase the longest gap between two of its own marks (not counting waits for peers).
    progress_count: int = _checked(_at_least(0), default=0)
    progress_unit: str = _checked(_text(32), default="")
    mark_gaps: dict[str, float] = _checked(_durations, _seconds, default_factory=dict)
    # What the loop reports. step_seconds: the duration of the steps since the last progress, per
    # step, when nothing else (a save, an eval) happened in between (the step timeout is learned
    # from it and from nothing else). durations: the longest completed init/checkpoint/eval.
    step_seconds: float | None = _checked(_optional(is_number), default=None)
    durations: dict[str, float] = _checked(_durations, _seconds, default_factory=dict)
    # compute_seconds: this rank's compute time of step `compute_step`, waits for peers excluded;
    # compute_group: ranks doing the same work (pipeline stage and TP rank): straggler detection.
    compute_seconds: float | None = _checked(_optional(is_number), default=None)
    compute_step: int | None = _checked(_optional(is_int), default=None)
    compute_group: str = _checked(_text(64), default="")
    loss: float | None = _checked(_optional(is_number), default=None)
    consumed_samples: int | None = _checked(_optional(is_int), default=None)
    # Set once after a resume: the step it resumed from and how long the load took.
    resumed_from: int | None = _checked(_optional(is_int), default=None)
    checkpoint_load_seconds: float | None = _checked(_optional(is_number), default=None)
    # Set once after a resume too: the seconds of each part of this process's start (the first
    # step excluded), the bytes the load read by where they came from (local, peer, shared) and
    # each checkpoint copy that failed its check and was dropped (trainer/restore_order.py).
    start_phases: dict[str, float] = _checked(_durations, _seconds, default_factory=dict)
    restore_bytes: dict[str, float] = _checked(_durations, _seconds, default_factory=dict)
    dropped_copies: list[str] = _checked(
        lambda v: (
            isinstance(v, list) and len(v) <= 64 and all(isinstance(x, str) and len(x) <= 512 for x in v)
        ),
        default_factory=list,
    )
    # The id of the rollback directive (accepted/rollback) this incarnation applied at its start.
    rollback_applied: str | None = _checked(_optional(_text(128)), default=None)
    # Set while exiting: the trainer's own exit code (when SLURM's is not known).
    exit_code: int | None = _checked(_optional(is_int), default=None)
    exit_reason: str = _checked(_text(), default="")
    # Judged by check_version before any field, never read as a field.
    version: int = _checked(None, default=HEARTBEAT_VERSION)

    def __post_init__(self) -> None:
        self.phase = Phase(self.phase)  # a writer may pass the value ("step")
        self.job_id = str(self.job_id)

    def to_dict(self) -> dict[str, Any]:
        # Shallow (asdict deep-copies: 4x slower): every field is a JSON value but `durations`,
        # copied here, and `phase`, an enum written as its value.
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["phase"] = self.phase.value
        data["durations"] = dict(self.durations)
        data["mark_gaps"] = dict(self.mark_gaps)
        data["start_phases"] = dict(self.start_phases)
        data["restore_bytes"] = dict(self.restore_bytes)
        data["dropped_copies"] = list(self.dropped_copies)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @property
    def incarnation(self) -> tuple[int, int]:
        return (self.restart_count, self.launch)

    @property
    def waiting(self) -> bool:
        """Its last mark entered a wait for its peers: it is not the one holding them up."""
        return self.progress_unit == Mark.WAIT.value

    @classmethod
    def from_dict(cls, data: Any) -> Heartbeat:
        """Validated: a field of the wrong type is a ContractError naming it; a newer version is a
        ContractVersionError. Version 1 beats (the loop's numbers in `extra`) are read too."""
        if not isinstance(data, dict):
            raise ContractError("heartbeat: expected a JSON object")
        version = check_version(data, "heartbeat", HEARTBEAT_VERSION)
        if version == 1 and isinstance(data.get("extra"), dict):
            data = {**data["extra"], **{k: v for k, v in data.items() if k != "extra"}}
        values: dict[str, Any] = {}
        for name, value in data.items():
            check = _CHECKS.get(name)
            if check is None:  # not a field (or `version`, checked above)
                continue
            if check(value):
                convert = _CONVERT.get(name)
                values[name] = convert(value) if convert else value
            elif name in REQUIRED_FIELDS:
                raise ContractError(f"heartbeat: field {name!r} has a bad value {str(value)[:80]!r}")
            # else: a bad report (a NaN step time) loses that number, never the beat: a dropped
            # beat would make a live rank look missing.
        if len(values.keys() & REQUIRED_FIELDS) != len(REQUIRED_FIELDS):
            missing = sorted(REQUIRED_FIELDS - values.keys())
            raise ContractError(f"heartbeat: field {missing[0]!r} is missing")
        return cls(**values)


_FIELD_NAMES = tuple(spec.name for spec in fields(Heartbeat))


def _shallow_copier():
    """copy.copy for a Heartbeat (the reader copies every rank entry that changed, 8,192 a pass at
    16,384 ranks). A Heartbeat has slots, no __dict__ (272 bytes against 1,640 with its dict: over
    16,384 dict-based beats, liveness took 35 ms a pass and assess 21 ms, against 17 and 15 with
    slots), so the copy sets each slot. The code is generated from the fields' own names, as
    dataclasses generates __init__: side by side under the same load, 0.4-1.0 us a copy against
    1.6-1.7 us for Heartbeat(*attrgetter(fields)(beat)) and 2.0-2.9 us for a loop of setattr, and a
    reader pass over 16,384 ranks (half changed) 299 ms (min) against 338 and 359 ms."""
    body = "".join(f"    copy.{name} = beat.{name}\n" for name in _FIELD_NAMES)
    namespace = {"new": object.__new__, "Heartbeat": Heartbeat}
    exec(f"def shallow_copy(beat):\n    copy = new(Heartbeat)\n{body}    return copy\n", namespace)  # noqa: S102
    return namespace["shallow_copy"]


_shallow_copy = _shallow_copier()


def _checks_of(cls) -> tuple[dict[str, Any], dict[str, Any], frozenset[str]]:
    """(checks, converters, required fields) from the record's own declarations. A field declared
    without a check is refused here, at import: from_dict would otherwise drop it silently."""
    unchecked = [spec.name for spec in fields(cls) if "check" not in spec.metadata]
    if unchecked:
        raise TypeError(
            f"{cls.__name__} field(s) {', '.join(unchecked)} declared without a check: "
            "declare each with _checked(check, convert)"
        )
    checks = {spec.name: spec.metadata["check"] for spec in fields(cls) if spec.metadata["check"] is not None}
    convert = {
        spec.name: spec.metadata["convert"] for spec in fields(cls) if spec.metadata["convert"] is not None
    }
    required = frozenset(
        spec.name for spec in fields(cls) if spec.default is MISSING and spec.default_factory is MISSING
    )
    return checks, convert, required


_CHECKS, _CONVERT, REQUIRED_FIELDS = _checks_of(Heartbeat)


# -- node files -----------------------------------------------------------------------------------
# What every rank of a node shares is written once, at the node's level; a rank's entry holds the
# rest, without fields at their default: a node file of 8 ranks is ~3 KB.
_NODE_LEVEL = ("host", "job_id", "world_size", "restart_count", "launch", "version")
_DEFAULTS = {spec.name: spec.default for spec in fields(Heartbeat) if spec.default is not MISSING}
_ENTRY_DEFAULTS = tuple(
    (name, _DEFAULTS.get(name, MISSING)) for name in _FIELD_NAMES if name not in _NODE_LEVEL
)


@dataclass
class NodeBeat:
    """One node's heartbeat file: every rank of the node, gathered by its local rank 0. The node
    file's own `seq` moves with each write (a dead gatherer stops it: every rank of the node then
    looks dead); each rank's `seq` moves with that rank's own beats (a dead peer stops only its own)."""

    host: str
    job_id: str
    world_size: int
    restart_count: int
    launch: int
    ranks: list[Heartbeat]
    version: int = HEARTBEAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "host": self.host,
            "job_id": self.job_id,
            "world_size": self.world_size,
            "restart_count": self.restart_count,
            "launch": self.launch,
            "ranks": [_node_entry(beat) for beat in self.ranks],
        }

    def to_json(self) -> str:
        # orjson: a node's leader writes this every beat, the simulation 48 of them a pass
        # (json.dumps was a fifth of a simulated month's CPU time).
        return orjson.dumps(self.to_dict(), option=orjson.OPT_SORT_KEYS).decode()


def _node_entry(beat: Heartbeat) -> dict[str, Any]:
    """A rank's entry in its node's file: the node's fields left out, and every field still at its
    default (an empty dict included), as a reader fills them back in."""
    entry = {}
    for name, default in _ENTRY_DEFAULTS:
        value = getattr(beat, name)
        if value == default or value == {}:
            continue
        if name == "phase":
            value = value.value
        elif type(value) is dict:
            value = dict(value)
        entry[name] = value
    return entry


def heartbeat_path(directory: Path, rank: int) -> Path:
    """A rank alone on its node writes its own file (version 2 and before: every rank did)."""
    return Path(directory) / rank_file_name(rank)


def node_beat_path(directory: Path, host: str) -> Path:
    name = f"node-{host}.json"
    if not NODE_FILE.fullmatch(name):
        raise ContractError(f"host {host[:80]!r} cannot name a heartbeat file (letters, digits, . _ - only)")
    return Path(directory) / name


def _write(path: Path, text: str, durable: bool) -> None:
    """Atomically (a reader sees the old file or the new one). `durable=False` skips the fsyncs:
    for the simulation's run directory on tmpfs, where they cost nothing but the calls."""
    if durable:
        atomic_write_text(path, text)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_heartbeat(directory: Path, beat: Heartbeat, durable: bool = True) -> None:
    """The file of a rank alone on its node."""
    _write(heartbeat_path(directory, beat.rank), beat.to_json() + "\n", durable)


def write_node_beat(directory: Path, node: NodeBeat, durable: bool = True) -> None:
    _write(node_beat_path(directory, node.host), node.to_json() + "\n", durable)


class HeartbeatReader:
    """Every rank's last beat from heartbeats/, pass after pass. A file whose bytes did not change
    since the last read is not parsed again, and a rank entry that did not change is not validated
    again (the same Heartbeat object comes back; one that changed is checked field by field where
    it changed, `_updated`): at 16,384 ranks most of a pass's work would otherwise be re-checking
    what it checked a pass ago.

    A file caught mid-replace, torn, too big, not a regular file, or not a valid beat is skipped
    (beats are written atomically, so that only happens for a file being deleted, or for something
    that is not a beat); a bad rank entry in a node file loses that entry only. Never follows a
    symlink, never blocks. A beat of a newer contract version raises ContractVersionError: the
    trainer and runctl disagree, and guessing would turn every rank into a missing one."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        # Per file: its bytes, its beats, and what they were read from (the node's own fields,
        # and per rank its entry and its beat).
        self._files: dict[str, tuple[bytes, list[Heartbeat], _Memory]] = {}

    def read(self) -> list[Heartbeat]:
        return [beat for file_beats in self.read_files() for beat in file_beats]

    def read_files(self) -> list[list[Heartbeat]]:
        """The beats by file: one list per heartbeat file, its ranks sharing the job and the
        incarnation (a node file's own fields), and the same list object as the last pass's
        while the file's bytes did not change (Liveness.observe skips those)."""
        with deferred_collection():  # the controller defers it over its whole pass
            return self._read()

    def _read(self) -> list[list[Heartbeat]]:
        beats: list[list[Heartbeat]] = []
        files: dict[str, tuple[bytes, list[Heartbeat], _Memory]] = {}
        # os.open with dir_fd and one os.read: about twice as fast as open()/scandir for 16k files.
        try:
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return beats
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            for name in os.listdir(dir_fd):
                if name.startswith("node-"):
                    found = NODE_FILE.fullmatch(name)
                    if found is None:
                        continue
                    limit = NODE_BEAT_MAX_BYTES
                elif name.startswith("rank-") and name.endswith(".json"):
                    found, limit = None, HEARTBEAT_MAX_BYTES
                else:
                    continue
                try:
                    fd = os.open(name, flags, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    raw = read_upto(fd, limit)
                except OSError:
                    continue
                finally:
                    os.close(fd)
                cached = self._files.get(name)
                if cached is not None and cached[0] == raw:
                    # Byte for byte what it held at the last pass (a node beats every
                    # heartbeat_seconds, the controller reads every poll_seconds): no parsing.
                    files[name] = cached
                    beats.append(cached[1])
                    continue
                try:
                    data = loads_bounded(raw)
                    if found is not None:
                        entries, shared = _node_entries(data, found.group(1))
                    else:
                        entries, shared = [data], ()
                    file_beats, memory = _entries(entries, shared, cached[2] if cached is not None else None)
                except ContractVersionError:
                    raise
                except ValueError:  # ContractError is a ValueError
                    continue
                files[name] = (raw, file_beats, memory)
                beats.append(file_beats)
        finally:
            os.close(dir_fd)
        self._files = files
        return beats


# Per rank: the keys of the entry its beat was read from (None: an entry the fast path does not
# take, see _RANK_FILE_KEYS), and the beat.
_Memory = tuple[tuple, dict[int, tuple[tuple | None, Heartbeat]]]


def _node_entries(data: Any, host: str) -> tuple[list, tuple]:
    """A node file's rank entries and the node's own fields (_NODE_LEVEL, in that order)."""
    if not isinstance(data, dict):
        raise ContractError("node heartbeat: expected a JSON object")
    check_version(data, "heartbeat", HEARTBEAT_VERSION)
    entries = data.get("ranks")
    if data.get("host") != host or not isinstance(entries, list) or len(entries) > 64:
        raise ContractError(f"node heartbeat of {host}: not this node's, or no list of ranks")
    get = data.get
    return entries, (
        get("host"),
        get("job_id"),
        get("world_size"),
        get("restart_count"),
        get("launch"),
        get("version"),
    )


def _entries(entries: list, shared: tuple, before: _Memory | None) -> tuple[list[Heartbeat], _Memory]:
    """The beats of a file's entries (a rank file: one entry, no shared fields). An entry whose
    values equal its last beat's gives that Heartbeat back; one that changed is checked where it
    changed (`_updated`), when the node's own fields and the entry's keys did not change. A bad
    entry in a node file loses that entry only; a rank file's one entry raises.

    The entries themselves are not kept: compared with the beat they gave, they need not be, and
    at 16,384 ranks keeping 16,384 parsed records doubled what every pass walks through memory
    (a pass read its 2,048 files in 107-112 ms keeping them, 91-106 ms without)."""
    known = before[1] if before is not None and before[0] == shared else {}
    node_fields = dict(zip(_NODE_LEVEL, shared, strict=True)) if shared else {}  # the node's own win
    plain = _NODE_ENTRY_KEYS if shared else _RANK_FILE_KEYS
    beats: list[Heartbeat] = []
    memory: dict[int, tuple[tuple | None, Heartbeat]] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            if not shared:
                raise ContractError("heartbeat: expected a JSON object")
            continue
        rank = entry.get("rank")
        cached = known.get(rank) if type(rank) is int else None
        keys = tuple(entry)
        try:
            beat = None
            if cached is not None and cached[0] == keys:
                beat = _updated(cached[1], entry)
            if beat is not None:
                memory[rank] = (keys, beat)
            else:
                beat = Heartbeat.from_dict({**entry, **node_fields} if shared else entry)
                memory[beat.rank] = (keys if plain.issuperset(keys) else None, beat)
        except ContractVersionError:
            raise
        except (ValueError, TypeError):
            if not shared:
                raise
            continue
        beats.append(beat)
    return beats, (shared, memory)


# The keys of an entry that `_updated` may compare with its beat's fields: a node file's entry
# holds the rank's own fields (the node's are the node's: from_dict lets them win), a rank file
# its version too. An entry with any other key (a field of the node's, an older version's
# `extra`, a key this version does not know) is validated whole, every time it changes.
_RANK_FILE_KEYS = frozenset(_FIELD_NAMES)
_NODE_ENTRY_KEYS = _RANK_FILE_KEYS - {*_NODE_LEVEL}
# A field whose new value fails its check loses that value (from_dict's rule), back to its default.
_RESET = {
    spec.name: spec.default_factory if spec.default is MISSING else (lambda v=spec.default: v)
    for spec in fields(Heartbeat)
}


def _updated(beat: Heartbeat, new: dict) -> Heartbeat | None:
    """`beat` updated to the record `new`, which has the keys of the record `beat` was read from
    (plain ones: see _RANK_FILE_KEYS), by checking only the values that differ from the beat's (a
    beat moves seq, beat_time and its progress; the rest stays): the same result as
    Heartbeat.from_dict(new), ~5x cheaper, and `beat` itself when nothing differs. None when
    what differs is not a field's value (the version): validate it all then.

    A value equal to the beat's field is the field's value: the field holds it as from_dict
    converted it (a phase's name, a float for an int in durations), equal to what it was read
    from; a field reset for a bad value holds its default, and a bad value equal to the default
    resets it to the default again. One difference: a value that equals a field without being of
    its type (a JSON `true` or `5.0` where the field holds 1 or 5) keeps the field's value
    instead of being refused: a forged record cannot put a wrong type in a beat either way."""
    updated = None
    for name, value in new.items():
        if value == getattr(beat, name):
            continue
        check = _CHECKS.get(name)
        if check is None:  # the version
            return None
        if updated is None:
            updated = _shallow_copy(beat)
        if check(value):
            convert = _CONVERT.get(name)
            setattr(updated, name, convert(value) if convert else value)
        elif name in REQUIRED_FIELDS:
            raise ContractError(f"heartbeat: field {name!r} has a bad value {str(value)[:80]!r}")
        else:
            setattr(updated, name, _RESET[name]())
    return beat if updated is None else updated


def read_heartbeats(directory: Path) -> list[Heartbeat]:
    """Every rank's last beat (HeartbeatReader, without its memory between passes)."""
    return HeartbeatReader(directory).read()
