"""SLURM's view of the nodes of a job, asked of SLURM itself (inside a job: `scontrol`)."""

from __future__ import annotations

import socket
import subprocess


def slurm_hostnames(nodelist: str) -> list[str]:
    """SLURM's node names of a node list (`node[01-03]`), in order (`scontrol show hostnames`)."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout.split()


def node_address(node: str) -> str:
    """A node's IPv4 address as other nodes reach it: SLURM's NodeAddr (the node name need not
    resolve: on the local cluster node01 does not), resolved. Raises OSError when it does not
    resolve."""
    out = subprocess.run(
        ["scontrol", "show", "node", node], capture_output=True, text=True, timeout=30, check=False
    )
    addr = next((w.split("=", 1)[1] for w in out.stdout.split() if w.startswith("NodeAddr=")), node)
    return socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
