"""The exclude list and its lock, attacked by an operator of the team.

- Hole 5: the list was control/excluded-nodes.json, 0660: an operator rewrote it in place (the
  file kept the owner's st_uid), unseen and unaudited, and every later job excluded what they
  wrote. Now only the owner's processes write it; operators clear nodes by an authenticated,
  audited request (`runctl nodes --clear`), which the controller carries out.
- Hole 6: its lock was group-readable in control/: an operator's flock made every restart raise
  ExcludeLockTimeout. Now the lock lives in the owner-only .private/, and a lock held too long (by
  one of the owner's own processes) is an event while the restart still goes out.
Real users (attack_env.py), the real controller on the mocked SLURM (owner_controller.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from attack_env import as_user, runctl_as, start_as, uid
from owner_controller import submit_as_owner, touch, wait_for

from orchestrator.contract import Allocation, LaunchEnd, LauncherState, RunPaths, write_allocation
from orchestrator.contract.exclude import add_excluded, excluded_nodes
from orchestrator.contract.operators import read_audit


def exclude_as_controller(team, paths: RunPaths, nodes: list[str]) -> None:
    done, out = as_user(team.owner, lambda: add_excluded(paths, nodes, "dead_rank in job 7", "controller"), umask=0o002)
    assert not isinstance(done, BaseException), out


def test_only_the_owner_writes_the_exclude_list_and_operators_clear_nodes_by_request(
    team, shared_run, owner_controller
):
    paths = shared_run(team_dir=True)
    exclude_as_controller(team, paths, ["node02", "node07"])
    rewrite = json.dumps({"nodes": {"node01": {}, "node03": {}, "node04": {}}})
    attempts = {
        "in place": lambda: paths.exclude_list.open("r+").write(rewrite),
        "by rename": lambda: (
            (paths.control / "x").write_text(rewrite),
            os.rename(paths.control / "x", paths.exclude_list),
        ),
    }
    for how, attempt in attempts.items():
        result, _ = as_user(team.oncall, attempt, umask=0o002)
        assert isinstance(result, PermissionError), f"{team.oncall} could rewrite the exclude list {how}"
    rc, out = runctl_as(team.oncall, ["nodes", str(paths.root)])
    assert rc == 0 and "node02" in out and "node07" in out, out

    rc, out = runctl_as(team.oncall, ["nodes", str(paths.root), "--clear", "node02", "--reason", "GPU swapped"])
    assert rc == 0 and "requested" in out, out
    assert excluded_nodes(paths) == ["node02", "node07"], "nothing changes before the controller acts"
    controller = owner_controller(team, paths)
    controller.tick()
    assert excluded_nodes(paths) == ["node07"]
    # A request written by hand that names something that is not a node is refused, not guessed at.
    bad = {"reason": "x", "nodes": ["node07; touch /tmp/pwned", "node07"]}
    as_user(team.oncall, lambda: paths.control_request("nodes-clear").write_text(json.dumps(bad)), umask=0o002)
    controller.tick()
    results, events = controller.stop()
    assert [r.error for r in results] == [None, None], results
    assert excluded_nodes(paths) == ["node07"]

    audit = [(r.user, r.uid, r.action, r.allowed, r.details.get("nodes")) for r in read_audit(paths)]
    assert audit == [
        (team.oncall, uid(team.oncall), "nodes --clear", True, ["node02"]),
        (team.oncall, uid(team.oncall), "nodes --clear", False, ["node07; touch /tmp/pwned"]),
    ], audit
    cleared = [e for e in events if e["event"] == "nodes_cleared"]
    assert [(e["by"], e["removed"], e["excluded"]) for e in cleared] == [(team.oncall, ["node02"], ["node07"])]
    refused = [e for e in events if e["event"] == "request_refused"]
    assert refused and "not SLURM node names" in refused[0]["why"], events
    assert not paths.control_request("nodes-clear").exists(), "carried out or quarantined, never left to act again"


def lock_files(paths: RunPaths) -> list[Path]:
    """Wherever the code keeps the exclude list's lock (found as root, so that the attack follows
    the code rather than a path the test assumes)."""
    return [
        Path(folder) / name
        for folder, _, names in os.walk(paths.root)
        for name in names
        if name.endswith("excluded-nodes.json.lock") or name.endswith("excluded-nodes.lock")
    ]


def hold(path: Path, flags: Path):
    """In a child: open and flock `path`, say so, and keep it until `flags/release` appears."""

    def run():
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        touch(flags / f"holding-{path.name}")
        wait_for(flags / "release", 60)
        return "held"

    return run


def test_no_operator_can_hold_the_exclude_lock(team, shared_run):
    """Hole 6, the attack: an operator's flock on the lock (group-readable in control/)."""
    paths = shared_run(team_dir=True)
    exclude_as_controller(team, paths, ["node07"])  # the lock exists from now on
    locks = lock_files(paths)
    assert locks, "the exclude list's lock was not found"

    def take(lock: Path) -> str:
        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held as long as the operator likes
        os.close(fd)
        return "locked"

    for lock in locks:
        held, _ = as_user(team.oncall, lambda lock=lock: take(lock))
        assert isinstance(held, PermissionError), f"{team.oncall} could lock {lock}"
    listing, _ = as_user(team.oncall, lambda: os.listdir(paths.private))
    assert isinstance(listing, PermissionError), f"{team.oncall} could list {paths.private}"


def test_a_lock_held_too_long_is_an_event_and_the_relaunch_still_goes_out(team, shared_run, owner_controller):
    """Hole 6, the consequence: ExcludeLockTimeout escaped `apply`, so the restart after it never
    went out. Here one of the owner's own processes is stuck holding the lock (the only one that
    can open it now): the exclusion fails, is said, and the failed launch is relaunched anyway."""
    paths = shared_run(team_dir=True, cluster={"spare_nodes": 1})
    exclude_as_controller(team, paths, ["node09"])
    job_id = submit_as_owner(team, paths)
    waiting = Allocation(
        job_id, LauncherState.WAITING_DECISION, 0, ["node01", "node02", "node03", "node04"], ["node05"],
        ended=LaunchEnd.from_srun(0, 1, "srun: error: node02: task 1: Killed\n"), waits_for_decisions=True,
    )  # fmt: skip
    as_user(team.owner, lambda: write_allocation(paths.allocation(job_id), waiting))
    flags = paths.root.parent
    holders = [start_as(team.owner, hold(lock, flags)) for lock in lock_files(paths)]
    try:
        for lock in lock_files(paths):
            wait_for(flags / f"holding-{lock.name}", 10)
        controller = owner_controller(team, paths, lock_timeout=0.3)
        began = time.monotonic()
        controller.tick()
        print(f"pass with the lock held: {time.monotonic() - began:.2f} s")
        results, events = controller.stop()
    finally:
        touch(flags / "release")
        for holder in holders:
            holder.result()
    assert [r.error for r in results] == [None], results
    kinds = [e["event"] for e in events]
    failed = [e for e in events if e["event"] == "exclude_failed"]
    assert failed and failed[0]["nodes"] == ["node02"] and "held for more than" in failed[0]["error"], kinds
    restart = [e for e in events if e["event"] == "restart"]
    assert restart and restart[0]["in_allocation"] is True, kinds
    assert excluded_nodes(paths) == ["node09"], "the list as it was"
