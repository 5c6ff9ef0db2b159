"""From the process environment to an initialised torch.distributed, the same way on every launcher.

Three ways a trainer process is started, in the order they are recognised:

1. `srun python -m trainer RUN_DIR` inside an sbatch job: SLURM_PROCID / SLURM_NTASKS /
   SLURM_LOCALID / SLURM_NNODES / SLURM_JOB_ID give the layout; the sbatch script exports
   MASTER_ADDR (the first node, resolvable) and MASTER_PORT.
2. torchrun or any launcher that sets RANK / WORLD_SIZE / LOCAL_RANK (+ MASTER_ADDR/PORT).
3. Nothing: one process, rank 0 of 1, on 127.0.0.1 with a free port.

The backend is gloo on CPU (`DS_ACCELERATOR=cpu`, or no CUDA) and NCCL on GPU. DeepSpeed's
`init_distributed` reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*; we set them from whichever source
was found so that DeepSpeed and torch agree.
"""

from __future__ import annotations

import datetime
import os
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
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
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


def use_gpu(accelerator: str) -> bool:
    """The config's cluster.accelerator, overridden by DS_ACCELERATOR=cpu (tests, CPU demo)."""
    if os.environ.get("DS_ACCELERATOR") == "cpu" or accelerator == "cpu":
        return False
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "the config says cluster.accelerator: cuda but torch sees no GPU: run on a GPU node, or set "
            "DS_ACCELERATOR=cpu and cluster.accelerator: cpu for a CPU run"
        )
    return True


def init_distributed(dist: DistEnv, accelerator: str, timeout_minutes: float = 30.0) -> str:
    """Initialise torch.distributed through DeepSpeed; returns the backend name."""
    gpu = use_gpu(accelerator)
    if not gpu:
        os.environ["DS_ACCELERATOR"] = "cpu"  # before deepspeed is imported anywhere
    for name, value in (
        ("RANK", dist.rank),
        ("WORLD_SIZE", dist.world_size),
        ("LOCAL_RANK", dist.local_rank),
        ("MASTER_ADDR", dist.master_addr),
        ("MASTER_PORT", dist.master_port),
    ):
        os.environ[name] = str(value)
    import deepspeed
    import torch

    backend = "nccl" if gpu else "gloo"
    if gpu:
        torch.cuda.set_device(dist.local_rank)
    elif os.environ.get("TRAINER_DS_SHM_OP") != "1":
        skip_deepspeed_shm_op()
    if dist.world_size == 1:
        # One process needs no rendezvous: an in-memory store instead of a TCP port, so that single
        # -process runs (tests, benchmarks) never race other processes for MASTER_PORT.
        torch.distributed.init_process_group(
            backend, store=torch.distributed.HashStore(), rank=0, world_size=1,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    deepspeed.init_distributed(  # wraps an existing process group, or creates it from MASTER_ADDR/PORT
        dist_backend=backend,
        auto_mpi_discovery=False,
        verbose=False,
        timeout=datetime.timedelta(minutes=timeout_minutes),
        rank=dist.rank,
        world_size=dist.world_size,
    )
    return backend


def skip_deepspeed_shm_op() -> None:
    """On CPU, DeepSpeed JIT-compiles its shared-memory all-reduce op (`deepspeed_shm_comm`, ~50-75 s
    on 2 cores, cached in $TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions/py3X_cpu) and
    sets up /dev/shm segments for it. Only `inference_all_reduce` uses it, which training never
    calls: training collectives go through torch.distributed (gloo). Skipping it saves the compile
    on every fresh CI machine and leaves no build cache behind. TRAINER_DS_SHM_OP=1 keeps it."""
    import importlib
    import sys

    importlib.import_module("deepspeed.comm.torch")
    # sys.modules, not `import deepspeed.comm.torch as m`: in the deepspeed.comm package namespace the
    # attribute `torch` is the torch package itself, so the import statement would hand us torch.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


def shutdown_distributed() -> None:
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()
