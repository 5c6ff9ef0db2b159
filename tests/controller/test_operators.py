"""Who may kill a run: operator rules, the audit trail, control/ permissions, and the real thing
with other Unix users (created here; needs root, skipped otherwise).

Other users cannot exec this venv's interpreter (it lives under /root, mode 0700), so the CLI
runs in a forked child that drops to the user's uid/gid/groups before calling `runctl`'s main():
the kernel then enforces every file permission exactly as for that user's own shell.
"""

from __future__ import annotations

import io
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from fakes import make_config

import orchestrator.cli.kill_cmd  # noqa: F401 - imported before fork (see module docstring)
import orchestrator.cli.watch_cmd  # noqa: F401
import orchestrator.operate.runs  # noqa: F401
from orchestrator.cli.main import build_parser, main
from orchestrator.contract import RunPaths
from orchestrator.contract.operators import (
    User,
    operator_basis,
    prepare_permissions,
    read_audit,
    world_writable,
)
from orchestrator.controller.requests import read_requests
from orchestrator.plan.config import dump_config

build_parser()  # imports every command module now, as root


def make_run(operators: dict) -> RunPaths:
    root = Path(tempfile.mkdtemp(prefix="rc-ops-", dir="/tmp"))
    os.chmod(root, 0o755)
    cfg = make_config(operators=operators)
    (root / "run.yaml").write_text(dump_config(cfg))
    paths = RunPaths.of(root)
    warnings = prepare_permissions(paths, cfg.operators)
    assert warnings == [] or cfg.operators.group is None, warnings  # without a group: owner-only control/
    return paths


def run_as(user: str, argv: list[str]) -> tuple[int, str]:
    """runctl's main(argv) as `user`, in a forked child with that user's credentials."""
    entry = pwd.getpwnam(user)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 99
        out = io.StringIO()
        try:
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.environ.update(HOME="/tmp", USER=user, LOGNAME=user)
            with redirect_stdout(out), redirect_stderr(out):
                code = main(argv)
        except BaseException as exc:  # report anything to the parent
            out.write(f"child crashed: {type(exc).__name__}: {exc}")
        os.write(write_fd, out.getvalue().encode())
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


@pytest.fixture
def unix_users():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to create operator users")
    tag = secrets.token_hex(3)
    group, oncall, outsider = f"ops{tag}", f"oncall{tag}", f"outsider{tag}"
    subprocess.run(["groupadd", group], check=True)
    subprocess.run(["useradd", "-M", "-N", "-G", group, oncall], check=True)
    subprocess.run(["useradd", "-M", "-N", outsider], check=True)
    try:
        yield group, oncall, outsider
    finally:
        for user in (oncall, outsider):
            subprocess.run(["userdel", user], check=False)
        subprocess.run(["groupdel", group], check=False)


def test_operator_rules():
    paths = make_run({"group": None, "users": ["alice"]})
    ops = make_config(operators={"group": "root", "users": ["alice"]}).operators
    me = User.current()
    assert operator_basis(ops, paths, me) == "owner of the run"
    assert operator_basis(ops, paths, User("alice", 1234, frozenset())) == "listed in operators.users"
    assert operator_basis(ops, paths, User("bob", 1235, frozenset({"root"}))) == "member of group root"
    assert operator_basis(ops, paths, User("mallory", 1236, frozenset({"users"}))) is None
    shutil.rmtree(paths.root)


def test_control_dir_permissions_and_audit_by_owner():
    """The owner's `runctl kill` is a request like any other: the controller's intake audits it.
    Attacks with other Unix users: tests/security/ (this file's real-user test moved there)."""
    paths = make_run({"group": "root", "users": []})
    mode = paths.control.stat().st_mode
    assert mode & stat.S_ISGID and mode & stat.S_IWGRP and not mode & stat.S_IWOTH
    assert world_writable(paths) == []
    rc = main(["kill", str(paths.root), "--reason", "owner test"])
    assert rc == 0 and paths.control_request("kill").exists()
    assert read_audit(paths) == [], "the CLI does not audit a request; the controller does"
    intake = read_requests(paths, make_config(operators={"group": "root", "users": []}).operators)
    assert intake.requests["kill"].reason == "owner test"
    line = read_audit(paths)[-1]
    assert line.action == "kill" and line.allowed is True and line.reason == "owner test"
    assert line.user and line.time and line.basis
    shutil.rmtree(paths.root)
