"""Real Unix users and a run directory owned by one of them, for the attack corpus.

Users (made with useradd/groupadd, removed afterwards; needs root):
    owner     owns the run and runs the controller (a plain user, not root)
    oncall    member of the operators' group
    listed    in operators.users but not in the group
    outsider  any other local user
Other users cannot exec this venv's interpreter (it lives under /root, mode 0700), so code runs
as a user in a forked child that drops to that user's uid/gid/groups (`as_user`, or `start_as`
for children that run side by side): the kernel then enforces every permission exactly as for
that user's own shell. Everything a child needs must be imported before the fork.

`shared_run(team_dir=True)` puts the run in a setgid folder of the operators' group (a project
directory, 2775 owner:team) and builds it under the owner's umask 002 (Debian's and Ubuntu's
default for users with a private group): what the owner's code then creates without setting
modes itself is group-writable by the whole team.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - codecs the children need (they cannot read the stdlib): sockets
import encodings.unicode_escape  # noqa: F401 - and jinja2's templates
import grp
import io
import os
import pickle
import pwd
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "controller"))
from fakes import make_config  # noqa: E402

import orchestrator.cli.kill_cmd  # noqa: E402,F401 - imported before any fork
import orchestrator.cli.submit_cmd  # noqa: E402,F401
import orchestrator.cli.watch_cmd  # noqa: E402,F401
import orchestrator.controller.requests  # noqa: E402,F401
import orchestrator.operate.runs  # noqa: E402,F401
import orchestrator.views.dashboard  # noqa: E402,F401
from orchestrator.cli.main import build_parser, main  # noqa: E402
from orchestrator.contract import RunPaths  # noqa: E402
from orchestrator.contract.operators import prepare_permissions  # noqa: E402
from orchestrator.operate.runs import prepare_run_dir  # noqa: E402
from orchestrator.plan.config import dump_config  # noqa: E402

build_parser()  # imports every command module now, as root


@dataclass
class Team:
    group: str
    owner: str
    oncall: str
    listed: str
    outsider: str


def uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


@dataclass
class Child:
    """A forked child running a function as a user (see start_as)."""

    user: str
    pid: int
    read_fd: int
    done: bool = False  # collected (its result read, or killed)

    def result(self, timeout: float = 20.0) -> tuple[Any, str]:
        """(fn's return value or the exception it raised, its output). A child that does not
        answer within `timeout` is killed and reported (a blocked open)."""
        chunks = []
        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.read_fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.kill()
                raise AssertionError(f"as_user({self.user}): no answer within {timeout} s (blocked?)")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self.read_fd)
        os.waitpid(self.pid, 0)
        self.done = True
        return pickle.loads(b"".join(chunks))

    def kill(self) -> None:
        if self.done:
            return
        self.done = True
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        os.close(self.read_fd)


def start_as(user: str, fn: Callable[[], Any], umask: int | None = None, env: dict | None = None) -> Child:
    """Start fn() as `user` in a forked child (with `umask` and `env` added when given)."""
    entry = pwd.getpwnam(user)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        out = io.StringIO()
        try:
            os.setgroups(os.getgrouplist(user, entry.pw_gid))
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.environ.update(HOME="/tmp", USER=user, LOGNAME=user, **(env or {}))
            if umask is not None:
                os.umask(umask)
            with redirect_stdout(out), redirect_stderr(out):
                result: Any = fn()
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            result = exc
            out.write(traceback.format_exc())
        try:
            payload = pickle.dumps((result, out.getvalue()))
        except Exception:  # noqa: BLE001
            payload = pickle.dumps((repr(result), out.getvalue()))
        os.write(write_fd, payload)
        os._exit(0)
    os.close(write_fd)
    return Child(user, pid, read_fd)


def as_user(
    user: str, fn: Callable[[], Any], timeout: float = 20.0, umask: int | None = None, env: dict | None = None
) -> tuple[Any, str]:
    """fn() as `user` in a forked child: (its return value or the exception it raised, its output)."""
    return start_as(user, fn, umask, env).result(timeout)


def runctl_as(user: str, argv: list[str], env: dict | None = None) -> tuple[int, str]:
    """`runctl ARGV` (orchestrator.cli.main.main) as `user`: (exit code, output)."""
    result, out = as_user(user, lambda: main(argv), env=env)
    if isinstance(result, BaseException):
        return 99, f"crashed: {result!r}\n{out}"
    return result, out


@pytest.fixture(scope="session")
def team():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        if os.environ.get("CI"):
            pytest.fail("the security tests need root and useradd in CI")
        pytest.skip("needs root and useradd to create the users of the attack corpus")
    tag = secrets.token_hex(3)
    t = Team(f"ops{tag}", f"own{tag}", f"oncall{tag}", f"listed{tag}", f"outsider{tag}")
    subprocess.run(["groupadd", t.group], check=True)
    subprocess.run(["useradd", "-M", "-U", "-G", t.group, t.owner], check=True)
    subprocess.run(["useradd", "-M", "-U", "-G", t.group, t.oncall], check=True)
    for user in (t.listed, t.outsider):
        subprocess.run(["useradd", "-M", "-U", user], check=True)
    try:
        yield t
    finally:
        for user in (t.owner, t.oncall, t.listed, t.outsider):
            subprocess.run(["userdel", user], check=False, capture_output=True)
        for group in (t.group, t.owner, t.oncall, t.listed, t.outsider):
            subprocess.run(["groupdel", group], check=False, capture_output=True)


@pytest.fixture
def shared_run(team):
    """Factory: a run directory owned by team.owner, prepared by the owner as the controller would."""
    made: list[Path] = []

    def build(
        group: str | None = "default", users: list[str] | None = None, team_dir: bool = False, **overrides
    ) -> RunPaths:
        base = Path(tempfile.mkdtemp(prefix="rc-sec-", dir="/tmp"))
        if team_dir:  # a project directory of the team: setgid, group-writable
            os.chown(base, uid(team.owner), grp.getgrnam(team.group).gr_gid)
            os.chmod(base, 0o2775)
        else:  # the owner's own folder, like a home directory
            os.chmod(base, 0o755)
            os.chown(base, uid(team.owner), -1)
        made.append(base)
        root = base / "run"
        cfg = make_config(
            operators={"group": team.group if group == "default" else group, "users": users or [team.listed]},
            **overrides,
        )

        def setup() -> list[str]:
            if team_dir:  # as `runctl submit` makes it
                prepare_run_dir(cfg, root)
                return []
            root.mkdir()
            for sub in ("jobs", "heartbeats", "checkpoints"):
                (root / sub).mkdir()
            (root / "run.yaml").write_text(dump_config(cfg))
            return prepare_permissions(RunPaths.of(root), cfg.operators)

        warnings, out = as_user(team.owner, setup, umask=0o002 if team_dir else None)
        assert not isinstance(warnings, BaseException), out
        return RunPaths.of(root)

    yield build
    for base in made:
        shutil.rmtree(base, ignore_errors=True)


def operators_of(paths: RunPaths):
    from orchestrator.operate.runs import load_run_config  # noqa: PLC0415

    return load_run_config(paths.root).operators
