"""Files the controller trusts, and who may write or
read them, checked by the kernel as each real user; and the StrictModes refusal."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import tempfile
from pathlib import Path

from attack_env import as_user, operators_of, uid
from fakes import make_config

from orchestrator.contract import RunPaths
from orchestrator.contract.operators import check_trust, prepare_permissions


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_modes_and_who_can_write_what(team, shared_run):
    paths = shared_run()

    def owner_files():  # what the controller and `runctl submit` write, under a careless umask
        os.umask(0o002)
        paths.state.write_text("{}")
        (paths.jobs / "7").mkdir()
        (paths.jobs / "7" / "job.sbatch").write_text("export WANDB_API_KEY=secret\n")
        os.chmod(paths.jobs / "7" / "job.sbatch", 0o775)
        return prepare_permissions(paths, operators_of(paths))

    warnings, out = as_user(team.owner, owner_files)
    assert warnings == [], out
    assert grp.getgrgid(os.stat(paths.root).st_gid).gr_name == team.group
    expected = {
        paths.root: 0o2750, paths.control: 0o2770, paths.config: 0o640, paths.state: 0o644,
        paths.events: 0o644, paths.audit: 0o644, paths.jobs / "7" / "job.sbatch": 0o750,
    }  # fmt: skip
    assert {p: mode_of(p) for p in expected} == expected

    # An operator may drop a request and read the run, and nothing else.
    attempts = {
        "state.json": lambda: paths.state.write_text('{"jobs": [{"job_id": "666"}]}'),
        "events": lambda: paths.events.open("a").write("{}\n"),
        "heartbeat": lambda: (paths.heartbeats / "rank-00000.json").write_text("{}"),
        "checkpoint": lambda: (paths.checkpoints / "step_0000009").mkdir(),
        "run.yaml": lambda: os.rename(paths.control / "x", paths.config),
        "jobs/": lambda: (paths.jobs / "8").mkdir(),
        "accepted/": lambda: (paths.accepted / "kill").write_text("{}"),
    }
    as_user(team.oncall, lambda: (paths.control / "x").write_text("cluster: {python: /tmp/evil}"))
    for what, attempt in attempts.items():
        result, _ = as_user(team.oncall, attempt)
        assert isinstance(result, PermissionError), f"an operator could write {what}"
    readable, _ = as_user(team.oncall, paths.config.read_text)
    assert "operators" in readable
    # Any other local user reads no secret and reaches nothing.
    for secret in (paths.config, paths.jobs / "7" / "job.sbatch", paths.state):
        result, _ = as_user(team.outsider, secret.read_text)
        assert isinstance(result, PermissionError), f"{secret} readable by every user"


def test_without_an_operators_group_control_is_owner_only(team, shared_run):
    """control/ must not silently make the owner's whole primary group operators."""
    paths = shared_run(group=None)
    os.chown(paths.control, -1, grp.getgrnam(team.group).gr_gid)  # as if the owner's primary group
    warnings, _ = as_user(team.owner, lambda: prepare_permissions(paths, operators_of(paths)))
    assert any("owner-only" in w for w in warnings), warnings
    assert mode_of(paths.control) & 0o077 == 0
    result, _ = as_user(team.oncall, lambda: paths.control_request("kill").write_text("{}"))
    assert isinstance(result, PermissionError)


def test_check_trust_refuses_group_writable_foreign_and_linked_files(team, shared_run):
    paths = shared_run()
    problems, out = as_user(team.owner, lambda: check_trust(paths, operators_of(paths)))
    assert problems == [], out

    def loosen():
        os.chmod(paths.events, 0o664)
        (paths.checkpoints / "step_0000001").mkdir()
        os.chmod(paths.root, 0o2770)

    as_user(team.owner, loosen)
    pickle_path = paths.checkpoints / "step_0000001" / "model.pt"
    pickle_path.write_bytes(b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
    os.chown(pickle_path, uid(team.oncall), -1)  # planted by an operator
    os.rename(paths.config, paths.root / "run.yaml.orig")
    os.symlink(paths.root / "run.yaml.orig", paths.config)

    problems, out = as_user(team.owner, lambda: check_trust(paths, operators_of(paths)))
    text = "\n".join(problems)
    assert f"{paths.events} is writable by group {team.group}: chmod g-w {paths.events}" in text, text
    assert f"{paths.root} is writable by group {team.group}: chmod g-w {paths.root}" in text
    assert f"{pickle_path} is owned by {team.oncall}" in text and "chown" in text
    assert f"{paths.config} is a symbolic link" in text
    assert len(problems) == 4, text


def test_user_private_group_write_is_not_a_problem(team):
    """umask 002 with user-private groups (Debian's default) gives nobody else write access."""
    base = Path(tempfile.mkdtemp(prefix="rc-sec-upg-", dir="/tmp"))
    os.chown(base, uid(team.owner), -1)
    paths = RunPaths.of(base / "run")
    operators = make_config().operators

    def build():
        os.umask(0o002)
        paths.root.mkdir()
        os.chmod(paths.root, 0o2770)
        (paths.checkpoints / "step_0000001").mkdir(parents=True)
        (paths.checkpoints / "step_0000001" / "model.pt").write_bytes(b"x")
        return check_trust(paths, operators)

    try:
        problems, out = as_user(team.owner, build)
        assert problems == [], out
    finally:
        shutil.rmtree(base)
