"""PID 1 of an isolated cluster's namespaces (started by `isolated.py` under `unshare`).

    unshare --net --mount --pid --fork --kill-child python -m orchestrator.slurm.ns_init \\
        ROOT CLUSTER_DIR SHARED_PATH...

It gives the namespaces what SLURM needs, then only reaps: every daemon, job step and client
command enters with `nsenter` (see `isolated.py`), and all of them die when this process dies.
- Network: loopback plus a veth pair routed nowhere (slurmctld resolves its own address and
  refuses a namespace with loopback alone).
- Files: an overlay of the shared root (never written) with a writable layer in memory;
  the host's /dev and /sys (slurmd reads cgroup files), a /proc of this PID namespace, and the
  shared host paths (the cluster dir, the repository, the Python the jobs run) at their own
  paths, so a path means the same inside and out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

READY_FILE = "ns-ready"
INSIDE_MARK = "/run/runctl-isolated-cluster"  # exists inside the namespace only (its own /run)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True)


def _bind(source: str, target: Path, recursive: bool = False) -> None:
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    _run("mount", "--rbind" if recursive else "--bind", source, str(target))


def setup(root: Path, cluster_dir: Path, shared: list[str]) -> Path:
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "link", "add", "rc0", "type", "veth", "peer", "name", "rc1")
    _run("ip", "addr", "add", "10.254.0.1/24", "dev", "rc0")
    _run("ip", "link", "set", "rc0", "up")
    _run("ip", "link", "set", "rc1", "up")
    # The writable layer on a tmpfs of this namespace: overlayfs takes tmpfs as its upper layer
    # wherever the cluster dir lives (an overlayfs /tmp, as in containers, would refuse).
    layer = cluster_dir / "root-layer"
    layer.mkdir(exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(layer))
    upper, work, merged = layer / "upper", layer / "work", layer / "merged"
    for folder in (upper, work, merged):
        folder.mkdir()
    _run(
        "mount",
        "-t",
        "overlay",
        "overlay",
        "-o",
        f"lowerdir={root},upperdir={upper},workdir={work}",
        str(merged),
    )
    _run("mount", "-t", "proc", "proc", str(merged / "proc"))
    _bind("/dev", merged / "dev", recursive=True)
    _bind("/sys", merged / "sys", recursive=True)
    _run("mount", "-t", "tmpfs", "tmpfs", str(merged / "run"))
    (merged / INSIDE_MARK.lstrip("/")).touch()
    for path in shared:  # not recursive: the overlay itself lives in the cluster dir
        _bind(path, merged / path.lstrip("/"))
    return merged


def main(argv: list[str]) -> int:
    root, cluster_dir, *shared = argv
    merged = setup(Path(root), Path(cluster_dir), shared)
    os.chroot(merged)
    os.chdir("/")
    (Path(cluster_dir) / READY_FILE).write_text("ready\n")
    # PID 1 gets no default signal actions: without these, TERM would be ignored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    while True:
        try:
            os.waitpid(-1, 0)  # reap every orphan (slurmstepd, job steps) re-parented to us
        except ChildProcessError:
            time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
