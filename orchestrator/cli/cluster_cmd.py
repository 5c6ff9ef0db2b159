"""`runctl cluster up|down|status|env`: the local SLURM cluster of emulated nodes."""

from __future__ import annotations

import argparse
import json
import shlex
import time

from orchestrator.errors import EXIT_FAILURE, EXIT_OK, UsageError
from orchestrator.slurm.hostlist import compress_hostlist


def register(subparsers: argparse._SubParsersAction) -> None:
    cluster = subparsers.add_parser(
        "cluster",
        help="a real SLURM cluster of emulated nodes on this machine (for the demo and tests)",
        description="Debian's slurmctld/slurmd/munge, one `slurmd -N nodeNN` per emulated node, fake GPUs. "
        "Config, state, logs and pids under one directory (--dir, default $RUNCTL_CLUSTER_DIR or "
        "/tmp/runctl-cluster). Point SLURM's tools at it with `eval $(runctl cluster env)`.",
    )
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--dir", help="cluster directory (default $RUNCTL_CLUSTER_DIR or /tmp/runctl-cluster)"
        )

    up = sub.add_parser(
        "up", help="start (idempotent) and wait until every node is idle; installs SLURM as root if missing"
    )
    common(up)
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--gpus-per-node", type=int, default=8)
    up.add_argument("--cpus-per-node", type=int, default=8)
    up.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for the nodes (default 180)"
    )
    up.add_argument("--ctld-port", type=int, default=16817, help="slurmctld's port (default 16817)")
    up.add_argument(
        "--slurmd-base-port", type=int, default=17001, help="node k listens on this + k - 1 (default 17001)"
    )
    up.add_argument("--no-install", action="store_true", help="never apt-get install")
    up.add_argument(
        "--accounting", action="store_true",
        help="slurmdbd and MariaDB of the cluster's own, so sacct answers for ended jobs (22.05 only)",
    )  # fmt: skip
    up.add_argument(
        "--slurm", choices=("22.05", "24.11"), default="22.05",
        help="the host's SLURM, or Debian 13's 24.11 from a root built once in /var/cache/runctl",
    )  # fmt: skip
    up.add_argument("--json", action="store_true")
    up.set_defaults(func=run_up)

    down = sub.add_parser("down", help="cancel its jobs and stop the daemons `up` started (by pid)")
    common(down)
    down.set_defaults(func=run_down)

    status = sub.add_parser("status", help="daemons, nodes and the slurm.conf path")
    common(status)
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=run_status)

    env = sub.add_parser("env", help="print `export SLURM_CONF=...` (use: eval $(runctl cluster env))")
    common(env)
    env.set_defaults(func=run_env)


def _cluster(args: argparse.Namespace):
    """The kind `up` asked for; for down/status/env, the kind the directory holds."""
    from orchestrator.slurm.accounting import AccountedCluster  # noqa: PLC0415 - lazy: +7 ms on every runctl start
    from orchestrator.slurm.isolated import IsolatedCluster  # noqa: PLC0415 - lazy: +9 ms on every runctl start
    from orchestrator.slurm.local_cluster import LocalCluster  # noqa: PLC0415 - lazy: +6 ms on every runctl start

    plain = LocalCluster(args.dir)
    release = getattr(args, "slurm", None)
    if release == "24.11" or (release is None and IsolatedCluster(args.dir).init_pid_file.exists()):
        if getattr(args, "accounting", False):
            raise UsageError(
                "--accounting runs on 22.05 only (24.11's slurmdbd fails on Debian 13's MariaDB)"
            )
        return IsolatedCluster(args.dir)
    if getattr(args, "accounting", False) or (release is None and (plain.dir / "accounting.json").exists()):
        return AccountedCluster(args.dir)
    return plain


def _print_status(status: dict) -> None:
    state = "up" if status["up"] else "down"
    print(f"local SLURM cluster in {status['dir']}: {state}")
    print(f"slurm.conf: {status['slurm_conf']}")
    if status["nodes"]:
        by_state: dict[str, list[str]] = {}
        for node, node_state in status["nodes"].items():
            by_state.setdefault(node_state, []).append(node)
        for node_state, nodes in sorted(by_state.items()):
            print(f"  {len(nodes):3d} {node_state:8s} {compress_hostlist(nodes)}")
    dead = [n for n, d in status["daemons"].items() if not d["alive"]]
    if dead:
        print(f"daemons not running: {', '.join(dead)} (logs in {status['dir']}/log/)")


def run_up(args: argparse.Namespace) -> int:
    from orchestrator.slurm.local_cluster import ClusterSpec  # noqa: PLC0415 - lazy: +6 ms on every runctl start

    cluster = _cluster(args)
    started = time.time()
    spec = ClusterSpec(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, cpus_per_node=args.cpus_per_node,
        ctld_port=args.ctld_port, slurmd_base_port=args.slurmd_base_port,
    )  # fmt: skip
    status = cluster.up(spec, timeout=args.timeout, install=not args.no_install)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        _print_status(status)
        print(f"ready in {time.time() - started:.1f} s. Use it: eval $(runctl cluster env{_dir_arg(args)})")
    return EXIT_OK


def _dir_arg(args: argparse.Namespace) -> str:
    return f" --dir {shlex.quote(args.dir)}" if args.dir else ""


def run_down(args: argparse.Namespace) -> int:
    stopped = _cluster(args).down()
    print(
        f"stopped {len(stopped)} daemon(s)"
        + (f": {', '.join(stopped)}" if stopped else " (none was running)")
    )
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    status = _cluster(args).status()
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        _print_status(status)
    return EXIT_OK if status["up"] else EXIT_FAILURE


def run_env(args: argparse.Namespace) -> int:
    for key, value in _cluster(args).env().items():
        print(f"export {key}={shlex.quote(value)}")
    return EXIT_OK
