"""`python -m orchestrator.slurm.launcher.node_ranks --ranks-per-node G -- COMMAND...`: one srun task per
node runs a command that starts the node's ranks itself (`cluster.command_per: node`, e.g.
torchrun). srun gives each task its node's number; torchrun reads its options from PET_<NAME>
variables when they are not on its command line, so this shim sets them and runs the command:

    PET_NNODES         the launch's nodes (SLURM_NNODES of the step)
    PET_NODE_RANK      this node's number in the launch (SLURM_NODEID)
    PET_NPROC_PER_NODE ranks per node (--ranks-per-node: the config's gpus_per_node)
    PET_MASTER_ADDR/PORT  the launch's first node and port (the launcher's MASTER_ADDR/PORT)

A value the command gives on its own command line wins (torchrun's rule). The ranks torchrun
starts get RANK/WORLD_SIZE/LOCAL_RANK, and the client reads those.

torchrun exits 1 whatever code a worker exited with, which would turn a rank's KILLED (17) or
TIME_BUDGET (18) into a failure, restarted. So the shim waits for the command (signals sent to
it are passed on) and, when it failed, exits with the code the node's ranks left in their last
beats, when they agree on one of the contract's purposeful codes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def node_environment(env: dict[str, str], ranks_per_node: int) -> dict[str, str]:
    out = dict(env)
    for name, source in (("PET_NNODES", "SLURM_NNODES"), ("PET_NODE_RANK", "SLURM_NODEID"),
                         ("PET_MASTER_ADDR", "MASTER_ADDR"), ("PET_MASTER_PORT", "MASTER_PORT")):  # fmt: skip
        if source in env:
            out.setdefault(name, env[source])
    out.setdefault("PET_NPROC_PER_NODE", str(ranks_per_node))
    return out


def ranks_exit_code(code: int, env: dict[str, str]) -> int:
    """`code`, or the purposeful exit code every rank of this node and launch that recorded one
    agrees on (their beats: contract.Heartbeat.exit_code)."""
    from orchestrator.contract import PURPOSEFUL_EXITS, ContractError, HeartbeatReader, RunPaths
    from orchestrator.contract.client.supervision import RUN_DIR_VARIABLE

    if code == 0 or not env.get(RUN_DIR_VARIABLE):
        return code
    try:
        beats = HeartbeatReader(RunPaths.of(env[RUN_DIR_VARIABLE]).heartbeats).read()
    except (ContractError, OSError):
        return code
    host = env.get("SLURMD_NODENAME") or os.uname().nodename
    launch = int(env.get("RUNCTL_LAUNCH", "0") or 0)
    codes = {
        b.exit_code
        for b in beats
        if b.host == host
        and b.job_id == env.get("SLURM_JOB_ID")
        and b.launch == launch
        and b.exit_code is not None
    }
    return codes.pop() if len(codes) == 1 and codes <= set(PURPOSEFUL_EXITS) else code


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] != "--ranks-per-node" or argv[2] != "--" or not argv[1].isdigit():
        print(
            "usage: python -m orchestrator.slurm.launcher.node_ranks --ranks-per-node G -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    env = node_environment(dict(os.environ), int(argv[1]))
    try:
        child = subprocess.Popen(argv[3:], env=env)
    except OSError as exc:
        print(f"node_ranks: cannot run {argv[3]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    for number in FORWARDED:
        signal.signal(number, lambda received, _frame: child.send_signal(received))
    code = child.wait()
    return ranks_exit_code(
        128 - code if code < 0 else code, env
    )  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
