"""A Debian 13 (trixie) root with its Slurm 24.11, built once per machine.

The second local cluster (`isolated.py`) runs its daemons from this root, in their own network,
mount and PID namespaces, so a Debian 12 host can run 24.11 beside its own 22.05. The root is
shared by every cluster on the machine and never written after it is built: each cluster's
config, state and database live in its own directory, bound into the namespace.

    root = TrixieRoot()          # /var/cache/runctl/slurm-trixie (env RUNCTL_TRIXIE_ROOT)
    root.ensure()                # idempotent: debootstrap + apt-get the first time (~3 min), then instant
    root.ready()                 # built with this recipe?

Building takes a lock (a second process waits for the first), builds in a temporary folder and
renames it into place, so a killed build leaves nothing that looks ready.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from orchestrator.slurm.local_cluster import ClusterError, find_binary

SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = (
    "slurmctld", "slurmd", "slurm-client", "munge",  # the cluster
    "python3",  # the shared libraries the host's Python (bound in) loads: libssl, libffi, ...
)  # fmt: skip
# Any change to what is installed gives a new stamp, so an old root is rebuilt, not trusted.
RECIPE = f"{SUITE} {MIRROR} {' '.join(sorted(PACKAGES))} v1"
STAMP_NAME = ".runctl-root-ready"
# apt's maintainer scripts must not start the daemons inside the build (no init there).
POLICY_RC = "#!/bin/sh\nexit 101\n"


def default_root_dir() -> Path:
    return Path(os.environ.get("RUNCTL_TRIXIE_ROOT", "/var/cache/runctl/slurm-trixie"))


def recipe_stamp() -> str:
    return hashlib.sha256(RECIPE.encode()).hexdigest()[:16]


class TrixieRoot:
    def __init__(self, directory: Path | str | None = None):
        self.dir = Path(directory or default_root_dir())

    @property
    def stamp(self) -> Path:
        return self.dir / STAMP_NAME

    @property
    def build_log(self) -> Path:
        return self.dir.parent / f"{self.dir.name}.build.log"

    def ready(self) -> bool:
        try:
            return self.stamp.read_text().strip() == recipe_stamp()
        except OSError:
            return False

    def ensure(self) -> float:
        """Build the root unless it is ready; returns the seconds spent (0.0 when it was ready).
        Raises ClusterError naming the failed step and the log to read."""
        if self.ready():
            return 0.0
        if os.geteuid() != 0:
            raise ClusterError(f"building the {SUITE} root in {self.dir} needs root (debootstrap, chroot)")
        if find_binary("debootstrap") is None:
            _apt_install_host(["debootstrap"])
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.dir.parent / f"{self.dir.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process building: wait for it
            if self.ready():
                return 0.0
            started = time.time()
            self._build()
            return time.time() - started

    def _build(self) -> None:
        work = self.dir.parent / f"{self.dir.name}.building"
        shutil.rmtree(work, ignore_errors=True)
        if self.dir.exists():
            shutil.rmtree(self.dir)  # an older recipe
        with open(self.build_log, "w") as log:
            _step(["debootstrap", "--variant=minbase", SUITE, str(work), MIRROR], log, "debootstrap")
            policy = work / "usr/sbin/policy-rc.d"
            policy.write_text(POLICY_RC)
            policy.chmod(0o755)
            shutil.copy2("/etc/resolv.conf", work / "etc/resolv.conf")
            env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
            # In a mount namespace of its own, so /proc is unmounted when apt is done.
            inside = f"mount -t proc proc {work}/proc && exec chroot {work} "
            _step(
                ["unshare", "--mount", "--fork", "sh", "-c", inside + "apt-get update -qq"],
                log,
                "apt-get update",
                env,
            )
            _step(
                ["unshare", "--mount", "--fork", "sh", "-c",
                 inside + "apt-get install -y -qq --no-install-recommends " + " ".join(PACKAGES)],
                log, "apt-get install", env,
            )  # fmt: skip
            _step(["chroot", str(work), "apt-get", "clean"], log, "apt-get clean", env)
        (work / STAMP_NAME).write_text(recipe_stamp() + "\n")
        work.rename(self.dir)


def _step(argv: list[str], log, what: str, env: dict[str, str] | None = None) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    started = time.time()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    log.write(f"# {what}: exit {proc.returncode} after {time.time() - started:.1f} s\n")
    if proc.returncode != 0:
        raise ClusterError(
            f"building the {SUITE} root: {what} failed (exit {proc.returncode}); read {log.name}. "
            f"A network that cannot reach {MIRROR} is the usual cause"
        )


def _apt_install_host(packages: list[str]) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ClusterError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr[-1000:]}")


if __name__ == "__main__":
    seconds = TrixieRoot().ensure()
    print(f"{default_root_dir()}: ready ({seconds:.1f} s spent building)")
