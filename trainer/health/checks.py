"""The node-local checks: directories writable, free memory, a site's own command.

Each check is a function that returns a `Check` and never raises for what it finds on the node:
a broken directory or a failing command is a result, not an exception. `node_fault=False` marks a
failure that says nothing about this node (the all-reduce that nobody could attribute): it is
recorded, but does not make the node unhealthy.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract.textsafe import cap, for_terminal

PROBE_BYTES = 4096
MAX_DETAIL_CHARS = 400
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    node_fault: bool = True  # a failure that blames this node (False: recorded, not held against it)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "ok": self.ok, "detail": one_line(self.detail)}
        if not self.ok and not self.node_fault:
            data["blames_node"] = False
        return data

    @property
    def fails_node(self) -> bool:
        return not self.ok and self.node_fault


def one_line(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """Bounded, one printable line: details end up on on-call terminals and in events."""
    return cap(for_terminal(text.strip()), limit)


# -- directories ----------------------------------------------------------------------------------
def open_dir_nofollow(path: Path, trusted: Path, create: bool) -> int:
    """An fd of directory `path`, reached from `trusted` (followed: the launcher or the site gave
    it) one component at a time with O_NOFOLLOW, so that no symlink planted under `trusted` (the
    shared run directory) is followed. With `create`, missing components are made (0o755), as the
    trainer would make them."""
    flags = os.O_RDONLY | os.O_DIRECTORY
    fd = os.open(trusted, flags)
    try:
        for part in path.relative_to(trusted).parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(part, fd):
                    raise OSError(
                        errno.ELOOP, f"{part} is a symbolic link, not followed (the run directory is shared)"
                    ) from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def probe_dir(name: str, path: Path, trusted: Path, node: str, fail: bool = False) -> Check:
    """Create, write, fsync and remove a small file in `path`: the directory is writable and the
    filesystem answers. `fail` is the test fault `health_dir` (trainer.faults)."""
    started = time.monotonic()
    probe = f".health-probe-{node}-{os.getpid()}"
    try:
        if fail:
            raise OSError(errno.EROFS, "Read-only file system (TEST FAULT health_dir)")
        dir_fd = open_dir_nofollow(path, trusted, create=True)
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
            try:
                os.write(fd, b"\0" * PROBE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(probe, dir_fd=dir_fd)
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        why = exc.strerror or str(exc)
        return Check(
            name, False, f"{path} is not writable ({why}): fix the mount or permissions on this node"
        )
    seconds = time.monotonic() - started
    return Check(
        name, True, f"{path}: created, fsynced and removed a {PROBE_BYTES}-byte file in {seconds:.3f} s"
    )


def scratch_dir(env: Mapping[str, str]) -> Path:
    """The node-local scratch: $TMPDIR (SLURM sites often point it at a per-job local disk), else
    the system temp dir. Compile caches (torch extensions, Triton) and temp files go there."""
    return Path(env.get("TMPDIR") or tempfile.gettempdir())


# -- memory ---------------------------------------------------------------------------------------
def mem_available_gib(meminfo_text: str) -> float | None:
    """MemAvailable of /proc/meminfo in GiB; None when the kernel does not report it."""
    for line in meminfo_text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                scale = 1024 if len(fields) > 1 and fields[1].lower() == "kb" else 1
                return int(fields[0]) * scale / 2**30
    return None


def check_memory(min_gib: float, meminfo: Path = MEMINFO, fail: bool = False) -> Check:
    """MemAvailable >= min_gib. `fail` is the test fault `health_memory`: it reads as 0 GiB."""
    try:
        available = mem_available_gib(meminfo.read_text(encoding="ascii", errors="replace"))
    except OSError as exc:
        return Check("free_memory", False, f"cannot read {meminfo}: {exc.strerror}")
    if available is None:
        return Check("free_memory", True, f"{meminfo} has no MemAvailable (kernel < 3.14): not checked")
    if fail:
        available = 0.0
    if available < min_gib:
        return Check(
            "free_memory",
            False,
            f"MemAvailable {available:.1f} GiB < health_check.min_free_memory_gib {min_gib:g} GiB: "
            "find what holds the memory on this node (a leftover process?) or drain it",
        )
    return Check("free_memory", True, f"MemAvailable {available:.1f} GiB >= {min_gib:g} GiB")


# -- a site's own command -------------------------------------------------------------------------
TAIL_BYTES = 4096
TAIL_CHARS = 300


def _tail(handle: Any) -> str:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - TAIL_BYTES))
    text = handle.read().decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-3:])
    return (
        tail if len(tail) <= TAIL_CHARS else "..." + tail[-(TAIL_CHARS - 3) :]
    )  # keep the end: the last words say why


def run_site_command(argv: Sequence[str], timeout: float, env: Mapping[str, str]) -> Check:
    """health_check.command: argv (no shell), exit 0 = healthy. Its output goes to temp files, not
    pipes (a chatty command cannot fill memory); the reason is the tail of its stderr (else of its
    stdout), one printable line, bounded."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env),
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return Check("site_command", False, f"{argv[0]} did not finish within {timeout:.0f} s (killed)")
        except OSError as exc:
            return Check(
                "site_command",
                False,
                f"cannot run {argv[0]}: {exc.strerror}: install it on this node or fix health_check.command",
            )
        seconds = time.monotonic() - started
        if proc.returncode == 0:
            return Check("site_command", True, f"{argv[0]} exited 0 in {seconds:.1f} s")
        said = _tail(err) or _tail(out) or "(no output)"
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        return Check("site_command", False, f"{argv[0]} failed ({how}): {said}")
