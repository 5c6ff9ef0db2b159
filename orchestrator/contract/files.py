"""How a record crosses the run directory: written so that a reader never sees half of it, and,
when another user could have written it, read so that it can neither block nor blow up the reader.

Writers: `atomic_write_text`/`atomic_write_json` (temp file, fsync, rename, fsync the folder) and
`append_jsonl` (one O_APPEND write per line).
Readers of the run's own trusted files: `read_json`, `read_jsonl`.
Readers of files another user could have written or planted (control/, anything in a
group-writable folder): `read_untrusted` and `read_untrusted_json`, the one bounded reader. It
never follows a symlink, never blocks on a FIFO or device, accepts only a regular file of bounded
size, and parses JSON only up to a bounded nesting depth. Every way it can refuse is one error
type, `UntrustedFileError`, which callers handle once (quarantine, an event, go on).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from .values import is_int


class ContractError(ValueError):
    """A record of the contract is malformed or not the owner's; the message says which and why."""


class ContractVersionError(ContractError):
    """A record written by a newer version of the contract than this code reads."""

    def __init__(self, what: str, found: object, known: int):
        super().__init__(
            f"{what} is version {found!r}; this runctl reads version {known} and older. Upgrade "
            "runctl (and the trainer) so that both sides of the run directory speak the same version"
        )


def check_version(data: dict[str, Any], what: str, known: int) -> int:
    """The record's version (1 when absent: written before versions existed); a newer one than
    `known` is a ContractVersionError, never a KeyError further down."""
    version = data.get("version", 1)
    if not is_int(version) or version < 1:
        raise ContractError(f"{what}: version {version!r} is not a positive integer")
    if version > known:
        raise ContractVersionError(what, version, known)
    return version


# -- writing ----------------------------------------------------------------------------------
def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write `text` to `path` so that a reader sees the old file or the new one, never half.

    Temp file in the same directory (same filesystem), fsync, rename, then fsync the directory
    so that the rename itself survives a node crash on GPFS/ext4.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates 0600; the other side (and other operators) must be able to read it.
        os.chmod(tmp, mode if mode is not None else 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any, mode: int | None = None) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=mode)


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON object as one line. A single write() of a line under PIPE_BUF-ish sizes
    with O_APPEND is not interleaved with other appenders on a local or POSIX filesystem."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading the run's own files ----------------------------------------------------------------
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line that is a JSON object; a torn last line (a writer died mid-write) and
    anything that is not an object are skipped."""
    records: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = loads_bounded(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    records.append(record)
    except FileNotFoundError:
        pass
    return records


def read_json(path: Path) -> Any | None:
    """Read a file written by atomic_write_json; None if it is not there (yet)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return loads_bounded(handle.read())
    except FileNotFoundError:
        return None


# -- reading what another user may have written -----------------------------------------------------
MAX_JSON_DEPTH = 32  # our records nest 4 deep; Python's parser recurses (and raises) near 1,000


class UntrustedFileError(Exception):
    """A file another user could have planted is not what it must be; `reason` says what."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth_exceeds(text: str, limit: int) -> bool:
    """True when brackets outside strings nest deeper than `limit`: string contents are dropped by
    one regex, then the brackets are counted (no recursion; C speed for a beat's 700 bytes).
    Fewer brackets in all than the limit cannot nest deeper: that check (two str.count) spares
    the regex for every ordinary record, 60x cheaper on a node's heartbeat file."""
    if text.count("{") + text.count("[") <= limit:
        return False
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        depth += 1 if match.group() in "[{" else -1
        if depth > limit:
            return True
    return False


@contextlib.contextmanager
def deferred_collection() -> Iterator[None]:
    """No cyclic garbage collection inside the block (the previous setting comes back after it).
    A supervision pass at 16,384 ranks makes ~80,000 container objects (beats and their parsed
    records) that live on until the next pass: with the collector on, they set off a full
    collection almost every pass, 80-110 ms of CPU finding nothing (beats hold no cycles); deferred
    to the end of the pass, the young generation is collected once, ~4 ms."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


# A full collection every this many passes (at BLOOM's 5 s polls: every 10 minutes).
FULL_COLLECTION_EVERY_PASSES = 120
_passes_since_full_collection = 0


@contextlib.contextmanager
def pass_collection() -> Iterator[None]:
    """deferred_collection for a whole supervision pass, whose survivors are then frozen
    (gc.freeze: out of every later automatic collection), and a full collection of everything,
    frozen or not, every FULL_COLLECTION_EVERY_PASSES passes.

    Why: the beats a pass keeps (~37,000 container objects at 16,384 ranks with half the nodes
    beating) hold no reference cycles and are freed by reference counting when the next pass
    replaces them; yet collecting the young generation after the pass traverses every one of
    them, 20-100 ms a pass at 16,384 ranks, to find nothing. Frozen, they cost nothing. What a
    pass leaves as cyclic garbage (should anything) waits for the next full collection."""
    global _passes_since_full_collection
    collecting = gc.isenabled()  # a caller that turned the collector off keeps it its own way
    try:
        with deferred_collection():
            yield
    finally:
        if collecting:
            _passes_since_full_collection += 1
            if _passes_since_full_collection >= FULL_COLLECTION_EVERY_PASSES:
                _passes_since_full_collection = 0
                full_collection()
            else:
                gc.freeze()


def full_collection() -> int:
    """Thaw what pass_collection froze and collect everything; the objects found unreachable."""
    gc.unfreeze()
    return gc.collect()


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads that raises ValueError (never RecursionError) for input nested deeper than
    `max_depth`, and for anything else that is not JSON."""
    # Bytes go to orjson as they are (a decode per node file was 3.5 ms of a 16,384-rank pass),
    # unless they hold brackets enough to need json_depth_exceeds's scan, which reads text (the
    # brackets are ASCII: counted in bytes or in text, they are as many).
    if isinstance(text, bytes) and text.count(b"{") + text.count(b"[") > max_depth:
        text = text.decode("utf-8", errors="replace")
    if isinstance(text, str) and json_depth_exceeds(text, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    try:
        # orjson parses a node's heartbeat file 4.7x faster (14 us against 67 us for 3 KB): 2,048
        # of them a pass at 16,384 ranks. It is strict where json is lenient (NaN, a lone
        # surrogate, integers past 64 bits, bytes that are not UTF-8): those fall through to
        # json, so the answer is json's.
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the depth scan stops this first
        raise ValueError("JSON nested too deeply") from None


# os.read(fd, n) allocates n bytes before it reads: asked for NODE_BEAT_MAX_BYTES (1 MiB), a pass
# over 2,048 node files spent 47 ms in it, against 12 ms asking for 64 KiB (a node file of 8 ranks
# is ~1.4 KB), and every manifest read allocated MAX_MANIFEST_BYTES.
READ_CHUNK = 1 << 16


def read_upto(fd: int, limit: int, first: int = READ_CHUNK) -> bytes:
    """At most `limit` bytes from `fd` (to its end), asking for `first` bytes first and for
    READ_CHUNK at a time after that."""
    chunk = max(1, min(limit, first))
    data = os.read(fd, chunk)
    if len(data) < chunk:
        return data
    parts, got = [data], len(data)
    while got < limit:
        more = os.read(fd, min(READ_CHUNK, limit - got))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _open_untrusted(path: Path, dir_fd: int | None) -> tuple[int, os.stat_result]:
    """An fd on a regular file, opened without following a symlink or blocking on a FIFO."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedFileError(path, "is a symbolic link") from None
        raise UntrustedFileError(path, f"cannot be opened: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UntrustedFileError(path, "is not a regular file")
    return fd, info


def read_untrusted(
    path: Path, max_bytes: int = 64 * 1024, *, dir_fd: int | None = None
) -> tuple[bytes, os.stat_result]:
    """Read a file someone else may control, safely: never follows a symlink (O_NOFOLLOW), never
    blocks on a FIFO or device (O_NONBLOCK), accepts only a regular file of at most `max_bytes`.
    Returns the bytes and the fstat of the opened file (its st_uid is who wrote it).
    Raises FileNotFoundError when it is gone, UntrustedFileError for anything else that is wrong."""
    path = Path(path)
    fd, info = _open_untrusted(path, dir_fd)
    try:
        if info.st_size > max_bytes:
            raise UntrustedFileError(path, f"is {info.st_size} bytes, more than the {max_bytes} allowed")
        try:
            data = read_upto(fd, max_bytes + 1, first=info.st_size + 1)  # one read unless it grew
        except OSError as exc:
            raise UntrustedFileError(path, f"cannot be read: {exc.strerror}") from None
        if len(data) > max_bytes:
            raise UntrustedFileError(path, f"grew past the {max_bytes} bytes allowed while being read")
        return data, info
    finally:
        os.close(fd)


def read_untrusted_tail(path: Path, tail_bytes: int) -> tuple[bytes, os.stat_result]:
    """The last `tail_bytes` of a file that may be long (a job's output), opened as
    `read_untrusted` opens; the first line may be cut. Same errors as `read_untrusted`."""
    path = Path(path)
    fd, info = _open_untrusted(path, None)
    try:
        try:
            os.lseek(fd, max(0, info.st_size - tail_bytes), os.SEEK_SET)
            return read_upto(fd, tail_bytes), info
        except OSError as exc:
            raise UntrustedFileError(path, f"cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)


def read_untrusted_json(
    path: Path, max_bytes: int = 64 * 1024, *, owner_uid: int | None = None, dir_fd: int | None = None
) -> tuple[Any, os.stat_result]:
    """`read_untrusted`, then JSON of bounded depth. With `owner_uid`, the file must also have been
    written by that user and have one link (a hard link to someone else's file is not theirs).
    FileNotFoundError when it is gone; UntrustedFileError for everything else."""
    data, info = read_untrusted(path, max_bytes, dir_fd=dir_fd)
    if owner_uid is not None:
        if info.st_uid != owner_uid:
            raise UntrustedFileError(
                path, f"written by uid {info.st_uid}, not the run's owner (uid {owner_uid})"
            )
        if info.st_nlink != 1:
            raise UntrustedFileError(path, f"has {info.st_nlink} hard links (a record is a file of its own)")
    try:
        return loads_bounded(data), info
    except ValueError as exc:
        raise UntrustedFileError(path, f"is not JSON we accept ({str(exc)[:120]})") from None


def read_owned_json(path: Path, owner_uid: int | None = None, max_bytes: int = 256 * 1024) -> Any | None:
    """The JSON in `path` when it is there, a small regular file (never through a symlink) with
    one link, written by `owner_uid` (default: this process's user, the run's owner on both
    sides). None when it is not there yet; ContractError when it is there but cannot be trusted."""
    owner = os.getuid() if owner_uid is None else owner_uid
    try:
        data, _ = read_untrusted_json(path, max_bytes, owner_uid=owner)
    except FileNotFoundError:
        return None
    except UntrustedFileError as exc:
        raise ContractError(str(exc)) from None
    return data


def write_exclusive(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Create `path` with O_CREAT|O_EXCL|O_NOFOLLOW (never through a planted file or link) and
    write `data`: for files that only ever get one writer, once."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
