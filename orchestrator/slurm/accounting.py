"""SLURM accounting for a local cluster: a MariaDB server and slurmdbd of its own, so that `sacct`
answers for the jobs squeue has forgotten, as on every production site.

    cluster = AccountedCluster(Path("/tmp/c"))     # a LocalCluster (the host's 22.05) with accounting
    cluster.up(spec)      # MariaDB (data in <dir>/mariadb), slurmdbd, then the cluster as usual
    cluster.down()        # the cluster, then slurmdbd and MariaDB

Everything is the cluster's own: the database files and socket live in its directory, MariaDB
listens on 127.0.0.1 only (port slurmctld's + 3) with name resolution off, and slurmdbd (port
slurmctld's + 2) logs in as a user that exists only in that database. Nothing in /etc or /run.

Which release: the host's (Debian 12: MariaDB 10.11, slurmdbd 22.05). Debian 13's slurmdbd 24.11.5
cannot use Debian 13's own MariaDB 11.8.9 client library: it stops at its first query with
`mysql_query failed: 5027 Number of columns in result (=1) set execeeds maxmimum allowed number of
columns (=0)` (checked here; the `mariadb` client runs the same query fine).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import atomic_write_json, atomic_write_text, read_json

from .local_cluster import ClusterError, ClusterSpec, LocalCluster, _pid_cmdline, _reap, find_binary

ACCOUNTING_PACKAGES = ["slurmdbd", "mariadb-server"]
DB_USER = "slurm"


def dbd_port(spec: ClusterSpec) -> int:
    return spec.ctld_port + 2


def database_port(spec: ClusterSpec) -> int:
    return spec.ctld_port + 3


class AccountedCluster(LocalCluster):
    """A LocalCluster whose slurmctld stores every job in a slurmdbd of its own."""

    @property
    def accounting_record(self) -> Path:
        return self.dir / "accounting.json"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.dir / "slurmdbd.conf"

    def render_slurm_conf(self, spec: ClusterSpec) -> str:
        return (
            super()
            .render_slurm_conf(spec)
            .replace(
                "AccountingStorageType=accounting_storage/none",
                f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
                f"AccountingStoragePort={dbd_port(spec)}\n"
                # The munge socket for talking to slurmdbd: AuthInfo covers slurmctld and slurmd only.
                f"AccountingStoragePass={self.munge_socket}",
            )
        )

    def render_slurmdbd_conf(self, spec: ClusterSpec) -> str:
        d = self.dir
        return "\n".join([
            "# Written by `runctl cluster up --accounting`: the cluster's own slurmdbd and MariaDB.",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost", f"DbdPort={dbd_port(spec)}", "SlurmUser=root",
            f"LogFile={d}/log/slurmdbd.log", f"PidFile={d}/run/slurmdbd.pid",
            "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
            f"StoragePort={database_port(spec)}", f"StorageUser={DB_USER}", "StorageLoc=slurm_acct", "",
        ])  # fmt: skip

    def up(
        self, spec: ClusterSpec | None = None, timeout: float = 120.0, install: bool = True
    ) -> dict[str, Any]:
        self._accounting_spec = spec or ClusterSpec()  # the ports, for _start_accounting
        return super().up(self._accounting_spec, timeout, install)

    def _start(self, name: str, argv: list[str]) -> int:
        if name == "slurmctld":
            try:
                self._start_accounting(self._accounting_spec)
            except BaseException:
                # `up` records its pids only once slurmctld runs: munged would outlive this failure.
                self._stop_unrecorded()
                raise  # slurmctld registers with slurmdbd as it starts
        return super()._start(name, argv)

    def _start_accounting(self, spec: ClusterSpec) -> None:
        _install_accounting()
        data = self.dir / "mariadb"
        if not (data / "mysql").exists():
            data.mkdir(exist_ok=True)
            proc = subprocess.run(
                ["mariadb-install-db", "--user=root", f"--datadir={data}", "--skip-test-db",
                 "--auth-root-authentication-method=socket", "--skip-name-resolve"],
                capture_output=True, text=True, check=False, cwd="/",
            )  # fmt: skip
            if proc.returncode != 0:
                raise ClusterError(
                    f"mariadb-install-db failed (exit {proc.returncode}): {proc.stdout[-800:]}{proc.stderr[-800:]}"
                )
        # slurmdbd's login: a user of this database only, from 127.0.0.1, with no password.
        init = self.dir / "mariadb-init.sql"
        atomic_write_text(
            init,
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1';\n"
            f"GRANT ALL ON slurm_acct.* TO '{DB_USER}'@'127.0.0.1';\n",
            mode=0o600,
        )
        pids = {
            "mariadbd": self._start_plain(
                "mariadbd",
                [
                    find_binary("mariadbd") or "mariadbd",
                    "--no-defaults",
                    "--user=root",
                    f"--datadir={data}",
                    f"--socket={self.dir}/run/mariadb.sock",
                    f"--pid-file={self.dir}/run/mariadbd.pid",
                    "--bind-address=127.0.0.1",
                    f"--port={database_port(spec)}",
                    "--skip-name-resolve",
                    f"--init-file={init}",
                    f"--log-error={self.log_dir}/mariadbd.log",
                    "--innodb-buffer-pool-size=16M",
                    "--performance-schema=off",
                ],
            )  # fmt: skip
        }
        atomic_write_json(self.accounting_record, {"pids": pids})
        self._wait_for(lambda: _port_open(database_port(spec)), 60, "MariaDB does not listen", "mariadbd")
        atomic_write_text(self.slurmdbd_conf, self.render_slurmdbd_conf(spec), mode=0o600)
        # slurmdbd has no config option: it reads slurmdbd.conf beside SLURM_CONF's slurm.conf.
        pids["slurmdbd"] = self._start_plain("slurmdbd", [find_binary("slurmdbd") or "slurmdbd", "-D"])
        atomic_write_json(self.accounting_record, {"pids": pids})
        self._wait_for(
            lambda: self.run_slurm(["sacctmgr", "-n", "list", "cluster"], timeout=15).returncode == 0,
            60, "slurmdbd does not answer `sacctmgr list cluster`", "slurmdbd",
        )  # fmt: skip
        proc = self.run_slurm(["sacctmgr", "-i", "add", "cluster", "runctl"], timeout=30)
        if proc.returncode != 0 and "already exists" not in (proc.stdout + proc.stderr).lower():
            raise ClusterError(f"`sacctmgr add cluster runctl` failed: {proc.stdout}{proc.stderr}")

    def _start_plain(self, name: str, argv: list[str]) -> int:
        return LocalCluster._start(self, name, argv)

    def _stop_unrecorded(self) -> None:
        """munged, MariaDB and slurmdbd of an `up` that failed before writing its record."""
        munged = self._pid_from_file(self.dir / "munge" / "munged.pid")
        pids = {**self._accounting_alive(), **({"munged": munged} if munged else {})}
        for pid in pids.values():
            if _ours(pid, self.dir):
                os.kill(pid, signal.SIGKILL)
                _reap(pid)
        atomic_write_json(self.accounting_record, {"pids": {}})

    @staticmethod
    def _pid_from_file(path: Path) -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _accounting_alive(self) -> dict[str, int]:
        pids: dict[str, int] = (read_json(self.accounting_record) or {}).get("pids", {})
        return {n: p for n, p in pids.items() if _ours(p, self.dir)}

    def down(self, timeout: float = 20.0) -> list[str]:
        stopped = super().down(timeout)
        alive = self._accounting_alive()
        for name in ("slurmdbd", "mariadbd"):  # slurmdbd first: it writes to MariaDB as it stops
            pid = alive.get(name)
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + timeout
            while _ours(pid, self.dir) and time.time() < deadline:
                _reap(pid)
                time.sleep(0.1)
            if _ours(pid, self.dir):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
            stopped.append(name)
        if alive:
            atomic_write_json(self.accounting_record, {"pids": {}})
        return stopped

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["accounting"] = sorted(self._accounting_alive())
        return status


def _ours(pid: int, directory: Path) -> bool:
    """The pid runs and belongs to this cluster: its command line or its SLURM_CONF names the dir
    (slurmdbd takes no config path, only SLURM_CONF)."""
    if str(directory) in _pid_cmdline(pid):
        return True
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"SLURM_CONF={directory}/slurm.conf".encode() in environ.split(b"\0")


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _install_accounting() -> None:
    missing = [b for b in ("slurmdbd", "mariadbd", "mariadb-install-db") if find_binary(b) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(
            f"accounting needs {missing}: `sudo apt-get install {' '.join(ACCOUNTING_PACKAGES)}`"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *ACCOUNTING_PACKAGES]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {_tail_text(proc.stderr)}")


def _tail_text(text: str) -> str:
    return text[-1500:]
