"""Local rank 0 sweeps the node-local folders (/dev/shm/runctl-<uid>/...) of this user's earlier
jobs that a SIGKILLed local rank 0 left: old ones only, folders only, never through a link."""

from __future__ import annotations

import os
import time

from orchestrator.contract.client.node_beats import NodeLocalBeats


def test_sweep_removes_only_this_users_stale_job_folders_and_follows_no_link(tmp_path):
    shm = tmp_path / "shm"  # stands in for /dev/shm
    shm.mkdir()
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("not ours to delete")
    mine = NodeLocalBeats("12", 0, 0, "node01", root=shm).open()
    parent = mine.path.parent
    day_ago = time.time() - 24 * 3600
    for name in ("9-0-0-node01", "10-1-2-node01"):  # left by SIGKILLed gatherers a day ago
        (parent / name).mkdir()
        (parent / name / "rank-00001.json").write_text("{}")
        os.utime(parent / name, (day_ago, day_ago))
    (parent / "11-0-0-node02").mkdir()  # another job on this node, live (changed just now)
    (parent / "8-0-0-node01").symlink_to(outside)  # a link named like a folder
    os.utime(parent / "8-0-0-node01", (day_ago, day_ago), follow_symlinks=False)
    (parent / "7-0-0-node01").write_text("a file, not a folder")
    os.utime(parent / "7-0-0-node01", (day_ago, day_ago))
    os.utime(mine.path, (day_ago, day_ago))  # its own folder, however old, stays

    removed = mine.sweep()

    assert sorted(removed) == ["10-1-2-node01", "9-0-0-node01"]
    assert sorted(os.listdir(parent)) == ["11-0-0-node02", "12-0-0-node01", "7-0-0-node01", "8-0-0-node01"]
    assert (outside / "keep.txt").read_text() == "not ours to delete"
    assert mine.sweep(older_than=3600.0, now=time.time() + 2 * 3600) == ["11-0-0-node02"]  # 2 h later
    mine.remove()
