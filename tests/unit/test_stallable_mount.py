"""The storage-stall drill's FUSE mount (tests/stallable_mount.py) on its own, in a mount namespace
of its own: it passes the run dir's file operations through to the real folder, a write under it
blocks in D while the daemon is stopped, and lands when it is resumed; outside the namespace the
folder is never blocked. The controller's probe script (controller/probe.py) finds each sign of
the stall alone: the blocked writer in D where the folder answers, the stat unanswered inside.
Root and /dev/fuse only (skipped otherwise, with the reason)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.controller import probe
from tests.stallable_mount import StallableMount, usable

PASSTHROUGH = """
import os, sys
d = sys.argv[1]
os.makedirs(f"{d}/heartbeats/sub")
with open(f"{d}/heartbeats/.tmp", "wb") as f:
    f.write(b"x" * 300_000); f.flush(); os.fsync(f.fileno())
os.rename(f"{d}/heartbeats/.tmp", f"{d}/heartbeats/rank-00001.json")
with open(f"{d}/heartbeats/rank-00001.json", "ab") as f:
    f.write(b"end")
os.truncate(f"{d}/heartbeats/rank-00001.json", 10)
os.symlink("rank-00001.json", f"{d}/heartbeats/link")
os.rmdir(f"{d}/heartbeats/sub")
print(sorted(os.listdir(f"{d}/heartbeats")), open(f"{d}/heartbeats/link").read(), os.statvfs(d).f_bsize > 0)
"""


# The write is made by a second thread while the main one waits for it (sleeping, S): as a rank's
# checkpoint writer or beat thread, whose storage stall the probe must see though the main thread
# does not show it.
WRITER = "import threading, sys; w = threading.Thread(target=lambda: open(sys.argv[1], 'w').write('x')); w.start(); w.join()"


def waits_on_fuse(pid: int) -> bool:
    """A thread of it in D on a FUSE request, not for a moment's D of the interpreter reading its
    own files."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        state = (task / "stat").read_text().rpartition(") ")[2][:1]
        if state == "D" and (task / "wchan").read_text() == "request_wait_answer":
            return True
    return False


@pytest.fixture
def namespace():
    """A process in a mount namespace of its own (as the drill's node02 slurmd)."""
    reason = usable()
    if reason:
        pytest.skip(reason)
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "120"])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            assert time.monotonic() < deadline, "unshare --mount never made its namespace"
            time.sleep(0.01)
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_passes_through_blocks_in_d_while_stalled_the_probe_says_stall_and_the_write_lands(
    namespace, tmp_path
):
    def inside(*argv: str) -> subprocess.Popen[str]:
        enter = ["nsenter", f"--mount=/proc/{namespace}/ns/mnt", "--", sys.executable]
        return subprocess.Popen([*enter, *argv], stdout=subprocess.PIPE, text=True)

    with StallableMount(tmp_path, namespace) as mount:
        ops = inside("-c", PASSTHROUGH, str(tmp_path))
        assert ops.communicate(timeout=30)[0].strip() == "['link', 'rank-00001.json'] xxxxxxxxxx True"
        assert (tmp_path / "heartbeats" / "rank-00001.json").read_bytes() == b"x" * 10, "not the real folder"

        mount.stall()
        writer = inside("-c", WRITER, str(tmp_path / "late"))
        deadline = time.monotonic() + 10
        while not waits_on_fuse(writer.pid):
            assert time.monotonic() < deadline and writer.poll() is None, "the write never blocked in D"
            time.sleep(0.05)
        proc = Path(f"/proc/{writer.pid}")
        print(f"blocked: {(proc / 'stat').read_text()[:40]} wchan={(proc / 'wchan').read_text()}")
        assert os.listdir(tmp_path) == ["heartbeats"], "outside the namespace, the folder answers"
        # The controller's probe script, on this machine (the folder answers here) and inside the
        # namespace (it does not): each of its two signs of a storage stall, alone.
        script = probe.script({1: writer.pid}, str(tmp_path), fs_seconds=0.5)
        here = probe.parse("here", subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout)  # fmt: skip
        assert (here.ranks, here.fs_answers) == ({1: probe.ProcState.DISK}, True), here
        assert here.waits == {1: "request_wait_answer"}, "the thread in D, and where it waits"
        main_thread = (proc / "stat").read_text().rpartition(") ")[2][:1]
        assert main_thread == "S", f"the main thread sleeps ({main_thread}): only its writer thread is in D"
        assert probe.verdict(here)[0] is probe.Verdict.STALL, "a rank in D, its filesystem answering"
        gone = probe.script({}, str(tmp_path), fs_seconds=0.5)
        inside = probe.parse("inside", subprocess.run(["nsenter", f"--mount=/proc/{namespace}/ns/mnt", "--", "sh", "-c", gone],
                                                      capture_output=True, text=True).stdout)  # fmt: skip
        assert (inside.ranks, inside.fs_answers) == ({}, False), inside
        assert probe.verdict(inside)[0] is probe.Verdict.STALL, "no rank known, its filesystem silent"
        mount.resume()
        assert writer.wait(10) == 0
        assert (tmp_path / "late").read_text() == "x"
