"""A real SLURM cluster of N emulated nodes on this machine, from Debian's slurm-wlm 22.05.

One `munged`, one `slurmctld` and one `slurmd -N nodeNN` per node, all on localhost (each slurmd on
its own port), fake GPUs (empty files named in gres.conf, so that `--gres=gpu:G` schedules). All
config, state, logs and pids live under one directory (default /tmp/runctl-cluster, env
RUNCTL_CLUSTER_DIR): point any SLURM tool at it with `SLURM_CONF=<dir>/slurm.conf`.

    cluster = LocalCluster()                   # or LocalCluster(Path("/some/dir"))
    cluster.up(ClusterSpec(nodes=4, gpus_per_node=1))   # idempotent; waits until all nodes are idle
    cluster.env()                              # {"SLURM_CONF": ".../slurm.conf"}
    cluster.status()                           # dict, see `status`
    cluster.down()                             # stops only the pids that `up` started

Why each setting (checked on Debian 12, slurm-wlm 22.05.8, in a container without systemd):
- NodeHostname=localhost NodeAddr=127.0.0.1 and one Port per node: many slurmd on one host.
- ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no cgroups needed.
- SlurmdParameters=config_overrides: each node may claim more CPUs/memory than the machine has.
- SelectType=select/cons_tres with CR_Core: cores are scheduled, memory is not (no --mem needed).
- munged on its own socket and key under the cluster dir (AuthInfo=socket=...): no clash with a
  system munged, nothing written to /etc.
- Absolute paths everywhere: the daemons chdir to /.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.contract import atomic_write_json, atomic_write_text, read_json
from orchestrator.errors import RunctlError

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
SBIN_DIRS = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]


class ClusterError(RunctlError):
    """The local cluster could not be brought up or queried; the message says what to look at."""


def default_cluster_dir() -> Path:
    return Path(os.environ.get("RUNCTL_CLUSTER_DIR", "/tmp/runctl-cluster"))


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 4
    gpus_per_node: int = 8
    cpus_per_node: int = 8
    memory_mb: int = 4000
    ctld_port: int = 16817
    slurmd_base_port: int = 17001  # node k (1-based) listens on base + k - 1
    partition: str = "debug"

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 999:
            raise ClusterError(f"--nodes must be between 1 and 999, got {self.nodes}")
        if not 0 <= self.gpus_per_node <= 64:
            raise ClusterError(f"--gpus-per-node must be between 0 and 64, got {self.gpus_per_node}")

    def node_names(self) -> list[str]:
        width = max(2, len(str(self.nodes)))
        return [f"node{k:0{width}d}" for k in range(1, self.nodes + 1)]


def find_binary(name: str) -> str | None:
    """`shutil.which`, plus the sbin folders that a non-login PATH may lack."""
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN_DIRS:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def install_packages() -> None:
    """apt-get install the SLURM daemons and munge if any binary is missing (root only)."""
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "munged") if find_binary(b) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(
            f"SLURM binaries missing ({', '.join(missing)}) and not root: run as root, or "
            f"`sudo apt-get install {' '.join(PACKAGES)}`"
        )
    if find_binary("apt-get") is None:
        raise ClusterError(
            f"SLURM binaries missing ({', '.join(missing)}) and no apt-get: install {PACKAGES}"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ClusterError(
                f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)\n"


def _pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class LocalCluster:
    """The cluster that lives under `directory`. Methods are safe to call from several processes
    in sequence (not concurrently: `up` and `down` are not locked against each other)."""

    def __init__(self, directory: Path | str | None = None):
        self.given_dir = Path(directory or default_cluster_dir())
        self.dir = self.given_dir.resolve()

    # Paths -------------------------------------------------------------------------------------
    @property
    def slurm_conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.dir / "gres.conf"

    @property
    def record_path(self) -> Path:
        return self.dir / "cluster.json"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket.2"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    def env(self) -> dict[str, str]:
        """Variables that point SLURM's own tools (sinfo, sbatch, srun) at this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def slurm_env(self) -> dict[str, str]:
        env = dict(os.environ, **self.env())
        extra = ":".join(d for d in SBIN_DIRS if d not in env.get("PATH", "").split(":"))
        if extra:
            env["PATH"] = env.get("PATH", "") + ":" + extra
        return env

    # Config ------------------------------------------------------------------------------------
    def render_slurm_conf(self, spec: ClusterSpec) -> str:
        d = self.dir
        lines = [
            "# Written by `runctl cluster up`: a local SLURM cluster of emulated nodes. Do not edit:",
            "# `runctl cluster down && runctl cluster up` rewrites it.",
            "ClusterName=runctl",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={spec.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/run/slurmctld.pid",
            f"SlurmdPidFile={d}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/backfill",
            # Start dependent jobs (singleton chains) soon after their predecessor ends.
            "SchedulerParameters=batch_sched_delay=1,sched_min_interval=100000,bf_interval=5",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=120",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=600",  # finished jobs stay visible to squeue this long (no accounting here)
            # Room for a real site's queue: the benchmark of bench/slurm_foreign_jobs.py holds
            # 10,000 other jobs beside ours (SLURM's default, 10,000, would refuse ours).
            "MaxJobCount=30000",
            # Job ids (and so MASTER_PORT = 10000 + id % 20000) differ between local clusters that
            # run at the same time on one machine (e.g. tests and the demo).
            f"FirstJobId={1 + (spec.ctld_port % 20) * 1000}",
            "Waittime=0",
            "MessageTimeout=30",
        ]
        for k, name in enumerate(spec.node_names(), start=1):
            gres = f" Gres=gpu:{spec.gpus_per_node}" if spec.gpus_per_node else ""
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={spec.slurmd_base_port + k - 1} "
                f"CPUs={spec.cpus_per_node} RealMemory={spec.memory_mb}{gres} State=UNKNOWN"
            )
        lines.append(
            f"PartitionName={spec.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
        )
        return "\n".join(lines) + "\n"

    def render_gres_conf(self, spec: ClusterSpec) -> str:
        lines = ["AutoDetect=off"]
        if spec.gpus_per_node:
            for name in spec.node_names():
                lines.append(
                    f"NodeName={name} Name=gpu File={self.dir}/gres/{name}/gpu[0-{spec.gpus_per_node - 1}]"
                )
        return "\n".join(lines) + "\n"

    def _claim_dir(self) -> None:
        """The cluster dir must be ours: the default is a predictable name in /tmp, where another
        user could have made it first (or a symlink by that name) to feed our daemons their
        slurm.conf and munge key. Made 0700 when absent; refused when not ours."""
        try:
            self.given_dir.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        for path in {self.given_dir, self.dir}:
            info = os.lstat(path)
            bad = (
                "is a symbolic link"
                if stat.S_ISLNK(info.st_mode) and path == self.given_dir and info.st_uid != os.geteuid()
                else "is not a directory"
                if not stat.S_ISDIR(os.stat(path).st_mode)
                else f"belongs to uid {info.st_uid}"
                if info.st_uid != os.geteuid()
                else "is writable by other users"
                if info.st_mode & 0o022
                else None
            )
            if bad:
                raise ClusterError(
                    f"{path} {bad}, so it is not a safe place for this cluster's config, munge key and "
                    f"daemons: pass --dir (or RUNCTL_CLUSTER_DIR) with a directory of your own, e.g. "
                    f"$HOME/runctl-cluster, or remove {path} if it is a leftover"
                )

    def _write_files(self, spec: ClusterSpec) -> None:
        for sub in ("state", "spool", "run", "log", "munge", "gres"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o700)
        for name in spec.node_names():
            (self.dir / "spool" / name).mkdir(exist_ok=True)
            gres_dir = self.dir / "gres" / name
            gres_dir.mkdir(exist_ok=True)
            for g in range(spec.gpus_per_node):
                (gres_dir / f"gpu{g}").touch()
        key = self.dir / "munge" / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(1024))
        atomic_write_text(self.slurm_conf, self.render_slurm_conf(spec), mode=0o644)
        atomic_write_text(self.gres_conf, self.render_gres_conf(spec), mode=0o644)

    # Processes ---------------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> int:
        log = open(self.log_dir / f"{name}.stdout", "ab")  # noqa: SIM115 - handed to the child
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.slurm_env(), cwd="/", start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        return proc.pid

    def _record(self) -> dict[str, Any]:
        return read_json(self.record_path) or {}

    def _alive_pids(self, record: dict[str, Any]) -> dict[str, bool]:
        """Which recorded daemons still run: the pid exists AND its command line names our
        cluster dir (so a recycled pid is never mistaken for ours)."""
        return {name: str(self.dir) in _pid_cmdline(pid) for name, pid in record.get("pids", {}).items()}

    def status_spec(self) -> ClusterSpec | None:
        """The spec the cluster was last brought up with (None: never)."""
        spec = self._record().get("spec")
        return ClusterSpec(**spec) if spec else None

    def run_slurm(self, args: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, env=self.slurm_env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def node_states(self) -> dict[str, str]:
        """node name -> SLURM state (idle, alloc, down*, ...); {} when slurmctld does not answer."""
        try:
            proc = self.run_slurm(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=15)
        except (subprocess.TimeoutExpired, FileNotFoundError):
            return {}
        if proc.returncode != 0:
            return {}
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    # Public API --------------------------------------------------------------------------------
    def up(
        self,
        spec: ClusterSpec | None = None,
        timeout: float = 120.0,
        install: bool = True,
        own_mounts: tuple[str, ...] = (),
    ) -> dict[str, Any]:
        """Bring the cluster up (idempotent) and wait until every node is idle.

        Already up with the same spec: returns at once. Up with another spec: ClusterError (run
        `down` first). Some daemons dead: the survivors are stopped and all restarted.
        `own_mounts` names nodes whose slurmd starts in a mount namespace of its own (`unshare
        --mount`): a filesystem mounted there later (`nsenter --mount=/proc/PID/ns/mnt`) is seen
        by that node's job steps only, as a node-local storage fault is on a real cluster.
        """
        spec = spec or ClusterSpec()
        self._claim_dir()
        record = self._record()
        if record.get("pids"):
            alive = self._alive_pids(record)
            if all(alive.values()):
                if record.get("spec") != asdict(spec):
                    raise ClusterError(
                        f"the cluster in {self.dir} is already up with {record.get('spec')}; "
                        f"`runctl cluster down --dir {self.dir}` first to change it to {asdict(spec)}"
                    )
                self._wait_idle(spec, timeout)
                return self.status()
            self.down()
        busy = self._busy_ports(spec)
        if busy:
            raise ClusterError(
                f"port(s) {busy[:5]} on 127.0.0.1 are in use (another local cluster?): stop it with "
                f"`runctl cluster down --dir <its dir>`, or choose other ports (--ctld-port, --slurmd-base-port)"
            )
        if install:
            install_packages()
        self._write_files(spec)
        started = time.time()
        pids: dict[str, int] = {}
        munge = self.dir / "munge"
        pids["munged"] = self._start("munged", [
            find_binary("munged") or "munged", "--foreground", "--force",
            f"--socket={self.munge_socket}", f"--key-file={munge}/munge.key",
            f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed",
            f"--log-file={self.log_dir}/munged.log",
        ])  # fmt: skip
        self._wait_for(lambda: self.munge_socket.exists(), 15, "munged did not create its socket", "munged")
        pids["slurmctld"] = self._start(
            "slurmctld",
            [find_binary("slurmctld") or "slurmctld", "-D", "-c", "-i", "-f", str(self.slurm_conf)],
        )
        atomic_write_json(self.record_path, {"spec": asdict(spec), "pids": pids, "started_at": started})
        self._wait_for(
            lambda: self.run_slurm(["scontrol", "ping"]).returncode == 0,
            30,
            "slurmctld does not answer `scontrol ping`",
            "slurmctld",
        )
        slurmd = find_binary("slurmd") or "slurmd"
        for name in spec.node_names():
            own = [find_binary("unshare") or "unshare", "--mount", "--propagation", "private", "--"]
            pids[f"slurmd-{name}"] = self._start(
                f"slurmd-{name}",
                [*(own if name in own_mounts else []), slurmd, "-D", "-N", name, "-f", str(self.slurm_conf)],
            )
        atomic_write_json(self.record_path, {"spec": asdict(spec), "pids": pids, "started_at": started})
        self._wait_idle(spec, timeout)
        record = self._record()
        record["up_seconds"] = round(time.time() - started, 2)
        atomic_write_json(self.record_path, record)
        return self.status()

    def _busy_ports(self, spec: ClusterSpec) -> list[int]:
        """The cluster's ports that something on this machine's network already holds."""
        ports = [spec.ctld_port, *range(spec.slurmd_base_port, spec.slurmd_base_port + spec.nodes)]
        return [p for p in ports if port_busy(p)]

    def _wait_for(self, predicate: Any, timeout: float, what: str, log_name: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise ClusterError(
            f"{what} after {timeout:.0f} s. Last lines of {self.log_dir}/{log_name}.log and .stdout:\n"
            f"{_tail(self.log_dir / f'{log_name}.log')}{_tail(self.log_dir / f'{log_name}.stdout')}"
        )

    def _wait_idle(self, spec: ClusterSpec, timeout: float) -> None:
        deadline = time.time() + timeout
        states: dict[str, str] = {}
        while time.time() < deadline:
            states = self.node_states()
            # "idle*" (not responding), "down", "inval", "unk" are not ready; busy nodes are.
            if len(states) == spec.nodes and all(s in {"idle", "alloc", "mix"} for s in states.values()):
                return
            time.sleep(0.5)
        bad = [
            n for n in spec.node_names() if not states.get(n, "").startswith(("idle", "alloc", "mix"))
        ] or spec.node_names()
        logs = "".join(
            f"--- {self.log_dir}/slurmd-{n}.log\n{_tail(self.log_dir / f'slurmd-{n}.log', 8)}"
            for n in bad[:3]
        )
        raise ClusterError(
            f"{len(bad)} of {spec.nodes} nodes not idle after {timeout:.0f} s (states: "
            f"{dict(list(states.items())[:8]) or 'sinfo does not answer'}).\n"
            f"--- {self.log_dir}/slurmctld.log\n{_tail(self.log_dir / 'slurmctld.log', 8)}{logs}"
        )

    def down(self, timeout: float = 20.0) -> list[str]:
        """Cancel the cluster's jobs, then stop (TERM, then KILL) only the daemons `up` started,
        by pid, after checking each pid still belongs to this cluster. Returns their names."""
        record = self._record()
        pids: dict[str, int] = record.get("pids", {})
        alive = self._alive_pids(record)
        if alive.get("slurmctld"):
            try:
                jobs = self.run_slurm(["squeue", "-h", "-o", "%i"], timeout=10).stdout.split()
                if jobs:
                    self.run_slurm(["scancel", *jobs], timeout=10)
                    time.sleep(1.0)
            except subprocess.TimeoutExpired:
                pass
        # slurmd before slurmctld before munged: each still has its dependencies while it stops.
        order = sorted(pids, key=lambda n: (n == "munged", n == "slurmctld"))
        stopped = []
        for name in order:
            if alive.get(name):
                try:
                    os.kill(pids[name], signal.SIGTERM)
                    stopped.append(name)
                except ProcessLookupError:
                    pass
        deadline = time.time() + timeout
        for name in stopped:
            while str(self.dir) in _pid_cmdline(pids[name]) and time.time() < deadline:
                _reap(pids[name])
                time.sleep(0.1)
            if str(self.dir) in _pid_cmdline(pids[name]):
                try:
                    os.kill(pids[name], signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _reap(pids[name])
        if record:
            record["pids"] = {}
            record["stopped_at"] = time.time()
            atomic_write_json(self.record_path, record)
        return stopped

    def status(self) -> dict[str, Any]:
        """{"dir", "slurm_conf", "up", "spec", "daemons": {name: {"pid", "alive"}}, "nodes": {name: state},
        "up_seconds"}; `up` is true when every recorded daemon runs and slurmctld answers."""
        record = self._record()
        alive = self._alive_pids(record)
        nodes = self.node_states() if alive.get("slurmctld") else {}
        return {
            "dir": str(self.dir),
            "slurm_conf": str(self.slurm_conf),
            "up": bool(alive) and all(alive.values()) and bool(nodes),
            "spec": record.get("spec"),
            "daemons": {
                n: {"pid": p, "alive": alive.get(n, False)} for n, p in record.get("pids", {}).items()
            },
            "nodes": nodes,
            "up_seconds": record.get("up_seconds"),
        }


def port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _reap(pid: int) -> None:
    """Collect a child that exited (when `up` and `down` run in the same process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
