"""A local cluster whose SLURM comes from another Debian release (trixie's 24.11), run from the
shared root of `trixie_root.py` in namespaces of its own, beside the host's 22.05.

Only SLURM (munged, slurmctld, slurmd and the client commands)
runs from that root. Our code stays on the host: the controller calls the cluster's commands
through wrappers in `<dir>/bin` that enter the namespaces (`nsenter`), so `SlurmScheduler` talks
to 24.11 unchanged, given `slurm_env()`. The jobs' own processes (the trainer) run inside, with
the host's Python, repository and temporary folder bound at their own paths (`shared_paths`).

    cluster = IsolatedCluster(Path("/tmp/c2411"))
    cluster.up(ClusterSpec(nodes=4, gpus_per_node=2, ...))   # builds the root first if needed
    SlurmScheduler(env=cluster.slurm_env())
    cluster.signal_in_cluster(pid, signal.SIGKILL)   # pids inside are those of its PID namespace
    cluster.down()                                   # the namespaces end: every daemon and job dies
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import orchestrator
from orchestrator.contract import atomic_write_json, atomic_write_text

from .local_cluster import ClusterError, ClusterSpec, LocalCluster, _pid_cmdline, _tail
from .ns_init import INSIDE_MARK, READY_FILE
from .trixie_root import TrixieRoot

CLIENT_COMMANDS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sacct", "sacctmgr", "sinfo", "salloc")
REPO_ROOT = Path(orchestrator.__file__).resolve().parent.parent


def shared_paths(cluster_dir: Path) -> list[str]:
    """Host paths bound into the namespace: the cluster dir, /tmp (run dirs of tests and demo),
    the repository, the home folder (caches) and the Python install our venv points at."""
    paths = [str(cluster_dir), "/tmp", str(REPO_ROOT), os.path.expanduser("~")]
    base = Path(sys.base_prefix).resolve()
    if base == Path("/usr"):  # a distribution Python: its interpreter and standard library only
        paths += [str(Path(sys.executable).resolve()), sysconfig.get_paths()["stdlib"]]
    else:
        paths.append(str(base))
    paths.append(sys.prefix)  # the venv, wherever it lives
    kept: list[str] = []
    for path in sorted({str(Path(p).resolve()) for p in paths}, key=len):
        if path != "/" and not any(path == k or path.startswith(k + "/") for k in kept):
            kept.append(path)
    return kept


class IsolatedCluster(LocalCluster):
    def __init__(self, directory: Path | str | None = None, root: TrixieRoot | None = None):
        super().__init__(directory)
        self.root = root or TrixieRoot()

    # Paths -------------------------------------------------------------------------------------
    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def init_pid_file(self) -> Path:
        return self.dir / "ns-init.pid"

    def env(self) -> dict[str, str]:
        """SLURM_CONF, and PATH with the wrappers first (they run 24.11's commands)."""
        return {**super().env(), "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"}

    # Namespaces --------------------------------------------------------------------------------
    def _init_pid(self) -> int | None:
        """Host pid of the namespaces' PID 1, when it still runs (checked by its command line)."""
        try:
            pid = int(self.init_pid_file.read_text())
        except (OSError, ValueError):
            return None
        return (
            pid
            if "orchestrator.slurm.ns_init" in _pid_cmdline(pid) and str(self.dir) in _pid_cmdline(pid)
            else None
        )

    def _enter(self) -> list[str]:
        """nsenter into the namespaces and the root; the folder is then / (a --wd path would be
        opened on the host's side of the chroot, where getcwd fails inside)."""
        pid = self._init_pid()
        if pid is None:
            raise ClusterError(f"the namespaces of the cluster in {self.dir} are gone: `up` again")
        return ["nsenter", f"--target={pid}", "--net", "--mount", "--pid", "--root", "--wdns=/"]

    def _start_namespaces(self) -> None:
        ready = self.dir / READY_FILE
        ready.unlink(missing_ok=True)
        log = open(self.log_dir / "ns-init.stdout", "ab")  # noqa: SIM115 - handed to the child
        try:
            holder = subprocess.Popen(
                ["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child",
                 sys.executable, "-m", "orchestrator.slurm.ns_init",
                 str(self.root.dir), str(self.dir), *shared_paths(self.dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        deadline = time.time() + 30
        while time.time() < deadline and not ready.exists():
            if holder.poll() is not None:
                break
            time.sleep(0.1)
        children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
        init = children.read_text().split() if children.exists() else []
        if not ready.exists() or not init:
            raise ClusterError(
                f"the namespaces for the 24.11 cluster did not come up (unshare exit {holder.poll()}); "
                f"{self.log_dir}/ns-init.stdout says:\n{_tail(self.log_dir / 'ns-init.stdout')}"
            )
        atomic_write_text(self.init_pid_file, init[0] + "\n")
        self._write_wrappers()

    def _write_wrappers(self) -> None:
        self.bin_dir.mkdir(exist_ok=True)
        pid = int(self.init_pid_file.read_text())
        for name in CLIENT_COMMANDS:
            # Run from the caller's folder where the namespace has it (the shared paths), else /.
            script = (
                "#!/bin/sh\n"
                f"# {name} of the 24.11 cluster in {self.dir}, run inside its namespaces.\n"
                f'[ -e {INSIDE_MARK} ] && exec /usr/bin/{name} "$@"  # a job inside calls it: already there\n'
                f"exec nsenter --target={pid} --net --mount --pid --root --wdns=/ -- "
                f'/bin/sh -c \'cd "$0" 2>/dev/null || cd /; exec "$@"\' "$PWD" /usr/bin/{name} "$@"\n'
            )
            atomic_write_text(self.bin_dir / name, script, mode=0o755)

    def signal_in_cluster(self, pid: int, sig: signal.Signals) -> None:
        """Send `sig` to `pid` as the cluster's PID namespace numbers it (a trainer's own getpid)."""
        proc = subprocess.run(
            [*self._enter(), "/bin/kill", f"-{int(sig)}", str(pid)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise ProcessLookupError(f"no process {pid} in the cluster's namespace: {proc.stderr.strip()}")

    def _busy_ports(self, spec: ClusterSpec) -> list[int]:
        return []  # a network namespace of its own: the host's ports do not matter

    # Daemons -----------------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> int:
        return super()._start(name, [*self._enter(), "--", f"/usr/sbin/{Path(argv[0]).name}", *argv[1:]])

    # Public API --------------------------------------------------------------------------------
    def up(
        self, spec: ClusterSpec | None = None, timeout: float = 120.0, install: bool = True
    ) -> dict[str, Any]:
        spec = spec or ClusterSpec()
        self._claim_dir()
        if install:
            self.root.ensure()
        if not self.root.ready():
            raise ClusterError(
                f"the 24.11 root in {self.root.dir} is not built: run `python -m orchestrator.slurm.trixie_root`"
            )
        record = self._record()
        if record.get("pids") and self._init_pid() and all(self._alive_pids(record).values()):
            return super().up(spec, timeout, install=False)
        self.down()
        for sub in ("log", "run"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._write_files(spec)
        self._start_namespaces()
        return super().up(spec, timeout, install=False)

    def down(self, timeout: float = 20.0) -> list[str]:
        stopped = super().down(timeout) if self._init_pid() else []
        pid = self._init_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)  # PID 1 of the namespace: everything in it dies
            deadline = time.time() + timeout
            while _pid_cmdline(pid) and time.time() < deadline:
                time.sleep(0.1)
        holder_dead = self._init_pid() is None
        if not holder_dead:
            raise ClusterError(f"the namespaces of {self.dir} did not end")
        record = self._record()
        if record:
            record["pids"] = {}
            atomic_write_json(self.record_path, record)
        return stopped
