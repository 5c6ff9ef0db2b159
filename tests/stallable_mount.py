"""A passthrough FUSE mount that a test can stall: storage that stops answering, on demand.

    with StallableMount(directory, namespace_pid=slurmd_pid) as mount:
        mount.stall()     # SIGSTOP the daemon: every write, stat and lookup under `directory`, in
                          # that mount namespace only, blocks in D (wchan request_wait_answer, or
                          # filename_create behind it), as on a hung hard NFS mount
        mount.resume()    # SIGCONT: the blocked calls return, nothing is lost

The mount covers `directory` itself and passes through to the same directory underneath: the
daemon opens it before mounting over it and works through that descriptor, so the paths are the
same everywhere, and whoever is outside the namespace (the controller, the other nodes) sees the
real directory, never blocked. Run inside the mount namespace of one node's slurmd (`nsenter
--mount`), it covers exactly that node's job steps, the controller's probe step included.

Raw /dev/fuse protocol (7.31), no libfuse: one request at a time, paths kept per node id, every
entry and attribute valid for 0 s (the other nodes change the files underneath: a cached size
would be a short read). Operations: INIT, LOOKUP, FORGET, GETATTR, SETATTR, OPEN/CREATE, READ,
WRITE, FLUSH, RELEASE, FSYNC, RENAME, UNLINK, MKDIR, RMDIR, OPENDIR/READDIR/RELEASEDIR, STATFS,
SYMLINK, READLINK; ENOSYS for the rest (the kernel then falls back: RENAME2 to RENAME, ACCESS
allowed, xattrs unsupported), INTERRUPT included, on purpose (`refuse_interrupts`: waits in D, not
S). Root only (mount(2) of type fuse), files owned by root.

Run as a program it is the daemon: `python stallable_mount.py DIRECTORY` (prints `mounted` when
the mount is up; SIGTERM unmounts).
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

IN_HEADER = struct.Struct("<IIQQIIII")  # len, opcode, unique, nodeid, uid, gid, pid, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error (-errno), unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr, 88 bytes
ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid, generation, entry/attr valid (s, ns), then ATTR
ATTR_OUT = struct.Struct("<QII")  # attr valid s, ns, dummy; then ATTR
OPEN_OUT = struct.Struct("<QII")  # fh, open_flags, padding
READ_IN = struct.Struct("<QQIIQII")  # fh, offset, size, read_flags, lock_owner, flags, padding
WRITE_IN = struct.Struct("<QQIIQII")  # the same layout; the data follows
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
INIT_OUT = struct.Struct("<IIIIHHIIHHI7I")

LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKDIR, UNLINK, RMDIR, RENAME, OPEN, READ, WRITE, STATFS, RELEASE = 9, 10, 11, 12, 14, 15, 16, 17, 18
FSYNC, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, CREATE = 20, 25, 26, 27, 28, 29, 35
DESTROY, BATCH_FORGET = 38, 42
NO_REPLY = {FORGET, BATCH_FORGET}

FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE, FATTR_ATIME, FATTR_MTIME, FATTR_FH = 1, 2, 4, 8, 16, 32, 64
FATTR_ATIME_NOW, FATTR_MTIME_NOW = 128, 256
GETATTR_FH = 1
BIG_WRITES = 1 << 5  # writes of up to MAX_WRITE in one request, not a page each (older kernels)
MAX_WRITE = 128 << 10
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


def _attr(st: os.stat_result) -> bytes:
    return ATTR.pack(
        st.st_ino, st.st_size, st.st_blocks, int(st.st_atime), int(st.st_mtime), int(st.st_ctime),
        st.st_atime_ns % 10**9, st.st_mtime_ns % 10**9, st.st_ctime_ns % 10**9,
        st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_rdev, st.st_blksize, 0,
    )  # fmt: skip


def _names(data: bytes, count: int) -> list[str]:
    return [os.fsdecode(n) for n in data.split(b"\0")[:count]]


class Passthrough:
    """The daemon: answers the kernel's requests from `base`, a descriptor of the covered folder."""

    def __init__(self, base: int, fuse: int):
        self.base, self.fuse = base, fuse
        self.paths: dict[int, str] = {1: "."}  # node id -> path relative to base
        self.ids: dict[str, int] = {".": 1}
        self.dirs: dict[int, list[tuple[str, int]]] = {}  # opendir handle -> (name, d_type)
        self.next_id = 2

    # Node ids ---------------------------------------------------------------------------------
    def _child(self, parent: int, name: str) -> str:
        if "/" in name or name in ("", ".", ".."):
            raise OSError(errno.EINVAL, name)
        base = self.paths[parent]
        return name if base == "." else f"{base}/{name}"

    def _stat(self, path: str) -> os.stat_result:
        return os.fstat(self.base) if path == "." else os.stat(path, dir_fd=self.base, follow_symlinks=False)

    def _entry(self, path: str) -> bytes:
        st = self._stat(path)
        node = self.ids.get(path)
        if node is None:
            node, self.next_id = self.next_id, self.next_id + 1
            self.paths[node], self.ids[path] = path, node
        return ENTRY_OUT.pack(node, 0, 0, 0, 0, 0) + _attr(st)

    def _forget_path(self, path: str) -> None:
        node = self.ids.pop(path, None)
        if node is not None:
            self.paths.pop(node, None)

    def _moved(self, old: str, new: str) -> None:
        self._forget_path(new)
        for path in [p for p in self.ids if p == old or p.startswith(old + "/")]:
            node = self.ids.pop(path)
            moved = new + path[len(old) :]
            self.paths[node], self.ids[moved] = moved, node

    # Requests ---------------------------------------------------------------------------------
    def serve(self) -> None:
        while (request := self._read()) is not None:
            self._handle(request)

    def refuse_interrupts(self, directory: str) -> None:
        """Make the kernel wait for our answers killably (D), as for a hard NFS mount, instead of
        interruptibly (S) first: it does once the daemon has answered one INTERRUPT with ENOSYS.
        So a child stats the mount, is killed while we hold its request, and we refuse the
        INTERRUPT that follows, then answer it."""
        self._handle(self._read())  # INIT
        child = os.fork()
        if child == 0:
            try:
                os.stat(directory)
            finally:
                os._exit(0)
        held = self._read()
        os.kill(child, signal.SIGKILL)
        self._handle(self._read())  # the INTERRUPT of the held request: ENOSYS
        self._handle(held)
        os.waitpid(child, 0)

    def _read(self) -> bytes | None:
        while True:
            try:
                return os.read(self.fuse, MAX_WRITE + 64 * 1024)
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # the request was interrupted before we read it
                    continue
                if exc.errno == errno.ENODEV:  # unmounted
                    return None
                raise

    def _handle(self, request: bytes | None) -> None:
        assert request is not None, "unmounted while starting"
        size, opcode, unique, node, _uid, _gid, _pid, _ = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size : size]
        try:
            reply = self.answer(opcode, node, body)
            error = 0
        except OSError as exc:
            reply, error = b"", -(exc.errno or errno.EIO)
        except KeyError:  # a node id whose path was removed
            reply, error = b"", -errno.ENOENT
        except Exception as exc:  # noqa: BLE001 - a bug here must not end the mount
            print(f"stallable_mount: opcode {opcode}: {exc!r}", file=sys.stderr, flush=True)
            reply, error = b"", -errno.EIO
        if opcode in NO_REPLY:
            return
        try:
            os.write(self.fuse, OUT_HEADER.pack(OUT_HEADER.size + len(reply), error, unique) + reply)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the caller was interrupted meanwhile
                raise

    def answer(self, opcode: int, node: int, body: bytes) -> bytes:  # noqa: C901, PLR0911, PLR0912
        if opcode == INIT:
            major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
            return INIT_OUT.pack(
                7, min(minor, 31), readahead, BIG_WRITES, 16, 12, MAX_WRITE, 1, 0, 0, 0, *([0] * 7)
            )
        if opcode in (FORGET, BATCH_FORGET):
            return b""  # ids are kept for the mount's life: a test's few hundred files
        if opcode == LOOKUP:
            return self._entry(self._child(node, _names(body, 1)[0]))
        if opcode == GETATTR:
            flags, _, fh = struct.unpack_from("<IIQ", body)
            st = os.fstat(fh) if flags & GETATTR_FH else self._stat(self.paths[node])
            return ATTR_OUT.pack(0, 0, 0) + _attr(st)
        if opcode == SETATTR:
            return self._setattr(self.paths[node], SETATTR_IN.unpack_from(body))
        if opcode in (OPEN, OPENDIR):
            flags = struct.unpack_from("<I", body)[0] & ~(os.O_CREAT | os.O_EXCL | os.O_NOCTTY)
            if opcode == OPENDIR:
                return OPEN_OUT.pack(self._list(self.paths[node]), 0, 0)
            return OPEN_OUT.pack(os.open(self.paths[node], flags, dir_fd=self.base), 0, 0)
        if opcode == CREATE:
            flags, mode, _umask, _ = struct.unpack_from("<IIII", body)
            path = self._child(node, _names(body[16:], 1)[0])
            fd = os.open(path, flags | os.O_CREAT, mode & 0o7777, dir_fd=self.base)
            return self._entry(path) + OPEN_OUT.pack(fd, 0, 0)
        if opcode == READ:
            fh, offset, size, *_ = READ_IN.unpack_from(body)
            return os.pread(fh, size, offset)
        if opcode == WRITE:
            fh, offset, size, *_ = WRITE_IN.unpack_from(body)
            written = os.pwrite(fh, body[WRITE_IN.size : WRITE_IN.size + size], offset)
            return struct.pack("<II", written, 0)
        if opcode == FLUSH:
            return b""
        if opcode == FSYNC:
            os.fsync(struct.unpack_from("<Q", body)[0])
            return b""
        if opcode == RELEASE:
            os.close(struct.unpack_from("<Q", body)[0])
            return b""
        if opcode == RELEASEDIR:
            self.dirs.pop(struct.unpack_from("<Q", body)[0], None)
            return b""
        if opcode == READDIR:
            fh, offset, size, *_ = READ_IN.unpack_from(body)
            return self._dirents(fh, offset, size)
        if opcode == MKDIR:
            mode, _umask = struct.unpack_from("<II", body)
            path = self._child(node, _names(body[8:], 1)[0])
            os.mkdir(path, mode & 0o7777, dir_fd=self.base)
            return self._entry(path)
        if opcode in (UNLINK, RMDIR):
            path = self._child(node, _names(body, 1)[0])
            (os.rmdir if opcode == RMDIR else os.unlink)(path, dir_fd=self.base)
            self._forget_path(path)
            return b""
        if opcode == RENAME:
            new_parent = struct.unpack_from("<Q", body)[0]
            old_name, new_name = _names(body[8:], 2)
            old, new = self._child(node, old_name), self._child(new_parent, new_name)
            os.rename(old, new, src_dir_fd=self.base, dst_dir_fd=self.base)
            self._moved(old, new)
            return b""
        if opcode == SYMLINK:
            name, target = _names(body, 2)
            path = self._child(node, name)
            os.symlink(target, path, dir_fd=self.base)
            return self._entry(path)
        if opcode == READLINK:
            return os.fsencode(os.readlink(self.paths[node], dir_fd=self.base))
        if opcode == STATFS:
            v = os.fstatvfs(self.base)
            return struct.pack("<QQQQQIIII6I", v.f_blocks, v.f_bfree, v.f_bavail, v.f_files, v.f_ffree,
                               v.f_bsize, v.f_namemax, v.f_frsize, 0, *([0] * 6))  # fmt: skip
        if opcode == DESTROY:
            return b""
        raise OSError(errno.ENOSYS, f"opcode {opcode}")

    def _setattr(self, path: str, fields: tuple[int, ...]) -> bytes:
        valid, _, fh, size, _owner, atime, mtime, _ctime, atime_ns, mtime_ns, _, mode, _, uid, gid, _ = fields
        target: int | str = fh if valid & FATTR_FH else path
        at = {"dir_fd": self.base, "follow_symlinks": False} if isinstance(target, str) else {}
        if valid & FATTR_MODE:
            os.chmod(target, stat.S_IMODE(mode), **({"dir_fd": self.base} if at else {}))
        if valid & (FATTR_UID | FATTR_GID):
            os.chown(target, uid if valid & FATTR_UID else -1, gid if valid & FATTR_GID else -1, **at)
        if valid & FATTR_SIZE:
            if isinstance(target, int):
                os.ftruncate(target, size)
            else:
                fd = os.open(path, os.O_WRONLY, dir_fd=self.base)
                try:
                    os.ftruncate(fd, size)
                finally:
                    os.close(fd)
        if valid & (FATTR_ATIME | FATTR_MTIME | FATTR_ATIME_NOW | FATTR_MTIME_NOW):
            st, now = (os.fstat(target) if isinstance(target, int) else self._stat(path)), time.time_ns()
            times = (
                now if valid & FATTR_ATIME_NOW else atime * 10**9 + atime_ns if valid & FATTR_ATIME else st.st_atime_ns,
                now if valid & FATTR_MTIME_NOW else mtime * 10**9 + mtime_ns if valid & FATTR_MTIME else st.st_mtime_ns,
            )  # fmt: skip
            os.utime(target, ns=times, **at)
        st = os.fstat(target) if isinstance(target, int) else self._stat(path)
        return ATTR_OUT.pack(0, 0, 0) + _attr(st)

    def _list(self, path: str) -> int:
        # The root through `base` itself: a path walk from it could cross into our own mount.
        fd = self.base if path == "." else os.open(path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.base)
        try:
            with os.scandir(fd) as entries:  # scandir works on a dup and rewinds it
                listed = [(e.name, (e.stat(follow_symlinks=False).st_mode >> 12) & 0xF) for e in entries]
        finally:
            if fd != self.base:
                os.close(fd)
        handle = self.next_id
        self.next_id += 1
        self.dirs[handle] = [(".", 4), ("..", 4), *sorted(listed)]
        return handle

    def _dirents(self, handle: int, offset: int, size: int) -> bytes:
        out = b""
        for index, (name, kind) in enumerate(self.dirs.get(handle, [])[offset:], start=offset + 1):
            raw = os.fsencode(name)
            entry = struct.pack("<QQII", 1_000_000 + index, index, len(raw), kind) + raw
            entry += b"\0" * (-len(entry) % 8)
            if len(out) + len(entry) > size:
                break
            out += entry
        return out


def _mount(directory: str) -> Passthrough:
    libc = ctypes.CDLL(None, use_errno=True)
    base = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fuse = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={fuse},rootmode={stat.S_IFMT(os.fstat(base).st_mode):o},user_id=0,group_id=0"
    if libc.mount(
        b"stallable", os.fsencode(directory), b"fuse.stallable", MS_NOSUID | MS_NODEV, options.encode()
    ):
        code = ctypes.get_errno()
        raise OSError(code, f"mount(2) of a FUSE filesystem on {directory}: {os.strerror(code)}")
    return Passthrough(base, fuse)


def main(directory: str) -> None:
    os.chdir("/")  # never inside the mount we serve
    server = _mount(directory)
    server.refuse_interrupts(directory)

    def unmount(_signum: int, _frame: object) -> None:
        ctypes.CDLL(None).umount2(os.fsencode(directory), MNT_DETACH)
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, unmount)
    print("mounted", flush=True)
    server.serve()


class StallableMount:
    """The daemon over `directory`, in the mount namespace of `namespace_pid` (the host's: None)."""

    def __init__(self, directory: Path, namespace_pid: int | None = None):
        self.directory, self.namespace_pid = Path(directory), namespace_pid
        self.daemon: subprocess.Popen[str] | None = None

    def __enter__(self) -> StallableMount:
        enter = ["nsenter", f"--mount=/proc/{self.namespace_pid}/ns/mnt", "--"] if self.namespace_pid else []
        self.daemon = subprocess.Popen(
            [*enter, sys.executable, __file__, str(self.directory)], stdout=subprocess.PIPE, text=True
        )
        line = self.daemon.stdout.readline() if self.daemon.stdout else ""
        if line.strip() != "mounted":
            self.daemon.wait(10)
            raise RuntimeError(
                f"the FUSE daemon over {self.directory} did not mount (exit {self.daemon.returncode})"
            )
        return self

    def stall(self) -> None:
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGCONT)

    def __exit__(self, *_exc: object) -> None:
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.resume()
        self.daemon.terminate()
        try:
            self.daemon.wait(10)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(10)


def usable() -> str | None:
    """Why a FUSE mount cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "not root: mount(2) of a FUSE filesystem needs root"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is missing or not usable (a container without it?)"
    if shutil.which("nsenter") is None or shutil.which("unshare") is None:
        return "nsenter or unshare (util-linux) is missing"
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False).returncode != 0:
        return "`unshare --mount` fails (no CAP_SYS_ADMIN in this container?)"
    return None


if __name__ == "__main__":
    main(sys.argv[1])
