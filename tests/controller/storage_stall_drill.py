"""A node whose run-dir storage stops answering, on the real local cluster: the drill's fault and
what it records, one controller pass at a time (`on_pass`, called from the test's `drive`).

Once the watched rank trains (a step from 1 to `before_step` - 1), the FUSE daemon that serves the run directory to its
node (tests/stallable_mount.py, mounted in that node's slurmd mount namespace) is stopped: the
node's writes and stats block in D, its beats stop, the rest of the job waits for it in
collectives. After `seconds` it is resumed. Meanwhile each pass records the rank's threads found
in D (/proc/PID/task/*/stat, as the probe reads /proc/PID/stat) and `runctl status`'s storage-stall
warnings; after the resume, the rank's first beat past its stalled step in the same launch
(`back`) and the warnings then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.contract import Heartbeat, Phase, read_heartbeats
from orchestrator.views.dashboard import status_data


def threads_in_d(pid: int) -> list[str]:
    """`/proc/PID/task/TID/stat` (up to the state letter) and wchan of each thread of `pid` in D."""
    found = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            stat = (task / "stat").read_text()
            wchan = (task / "wchan").read_text()
        except OSError:
            continue
        head, _, tail = stat.rpartition(") ")
        if tail[:1] == "D":
            found.append(f"{head}) {tail[:1]} wchan={wchan}")
    return found


def stall_warnings(ctl) -> list[str]:
    return [w for w in status_data(ctl.paths.root, ctl.scheduler).warnings if "storage stall" in w]


@dataclass
class StorageStallDrill:
    mount: object  # tests/stallable_mount.StallableMount over the run dir, in `node`'s namespace
    job_id: str
    rank: int
    node: str
    seconds: float
    before_step: int  # the stall begins in a step before this one (the drill's next fault is there)
    started: float | None = None  # monotonic, at the daemon's SIGSTOP
    resumed: float | None = None
    stalled_beat: Heartbeat | None = None  # the rank's last beat before the stall
    in_d: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    back: Heartbeat | None = None
    back_time: float = 0.0  # the controller's wall clock (the events'), when `back` was seen
    warnings_back: list[str] = field(default_factory=list)

    @property
    def over(self) -> bool:
        return self.back is not None

    def _beat(self, ctl) -> Heartbeat | None:
        beats = read_heartbeats(ctl.paths.heartbeats)
        return next((b for b in beats if b.rank == self.rank and b.job_id == self.job_id), None)

    def on_pass(self, ctl) -> None:
        beat = self._beat(ctl)
        if beat is None or self.over:
            return
        if self.started is None:
            if beat.phase == Phase.STEP and 1 <= beat.step < self.before_step:
                assert beat.host == self.node, (
                    f"rank {self.rank} runs on {beat.host}, the stalled mount is {self.node}'s"
                )
                self.mount.stall()
                self.started, self.stalled_beat = time.monotonic(), beat
                print(
                    f"storage of {self.node} stopped at rank {self.rank}'s step {beat.step} (pid {beat.pid})"
                )
            return
        if self.resumed is None:
            for line in threads_in_d(self.stalled_beat.pid):
                if line not in self.in_d:
                    print(f"in D {time.monotonic() - self.started:.1f} s into the stall: {line}")
                    self.in_d.append(line)
            self.warnings += stall_warnings(ctl)
            if time.monotonic() - self.started >= self.seconds:
                self.mount.resume()
                self.resumed = time.monotonic()
                print(f"storage of {self.node} resumed after {self.resumed - self.started:.1f} s")
            return
        was = self.stalled_beat
        if beat.step > was.step and (beat.restart_count, beat.launch) == (was.restart_count, was.launch):
            self.back, self.back_time, self.warnings_back = beat, time.time(), stall_warnings(ctl)
            print(
                f"rank {self.rank} at step {beat.step} {time.monotonic() - self.resumed:.1f} s after the resume"
            )
