"""Which rank this process is, from the environment of whichever launcher started it.

Three ways a rank is started, in the order they are recognised:

1. srun inside an sbatch job: SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NNODES /
   SLURM_JOB_ID give the layout; the job's launcher exports MASTER_ADDR (the first node,
   resolvable) and MASTER_PORT.
2. torchrun or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK (+ MASTER_ADDR/PORT).
   torchrun's workers also inherit SLURM_PROCID from the srun task that started torchrun, so
   torchrun's variables win when TORCHELASTIC_RUN_ID says torchrun started this process.
3. Nothing: one process, rank 0 of 1, on 127.0.0.1 with a free port.

Stdlib only: the client of any training loop reads it before torch is imported.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    job_id: str
    source: str  # "slurm" | "torchrun" | "single"
    local_world_size: int = 1  # ranks on this node: one heartbeat file per node when > 1

    @property
    def host(self) -> str:
        return socket.gethostname()


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise RuntimeError(f"environment variable {name}={value!r} is not an integer") from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm_tasks_on_this_node(env: Mapping[str, str], world: int, nnodes: int) -> int:
    """Tasks of this step on this node, from SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE),
    e.g. "4(x2),3" = 4, 4, 3 on nodes 0, 1, 2, indexed by SLURM_NODEID; without them an even share."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    counts: list[int] = []
    for part in filter(None, spec.split(",")):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            counts = []
            break
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    node = env.get("SLURM_NODEID", "")
    if counts and node.isdigit() and int(node) < len(counts):
        return counts[int(node)]
    return max(1, -(-world // max(1, nnodes)))


def dist_env_from(env: Mapping[str, str]) -> DistEnv:
    """Read the rank layout from SLURM's variables, torchrun's, or none (a single process)."""
    job_id = env.get("SLURM_JOB_ID", env.get("TRAINER_JOB_ID", "local"))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "TORCHELASTIC_RUN_ID" not in env:
        world = _int(env, "SLURM_NTASKS")
        nnodes = _int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else 1
        if world > 1 and ("MASTER_ADDR" not in env or "MASTER_PORT" not in env):
            raise RuntimeError(
                f"SLURM job with {world} tasks but MASTER_ADDR/MASTER_PORT are not set: the sbatch script "
                "must export them (the first node's resolvable address and a free port)"
            )
        return DistEnv(
            rank=_int(env, "SLURM_PROCID"),
            world_size=world,
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            nnodes=nnodes,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT") or free_port()),
            job_id=job_id,
            source="slurm",
            local_world_size=slurm_tasks_on_this_node(env, world, nnodes),
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            nnodes=_int(env, "GROUP_WORLD_SIZE") if "GROUP_WORLD_SIZE" in env else 1,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT") or free_port()),
            job_id=job_id,
            source="torchrun",
            local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1,
        )
    return DistEnv(0, 1, 0, 1, "127.0.0.1", int(env.get("MASTER_PORT") or free_port()), job_id, "single")
