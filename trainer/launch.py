"""From the process environment to an initialised torch.distributed, the same way on every launcher.

Which rank this is (srun, torchrun or a single process) is the client's
(orchestrator.contract.client.ranks), as for any training loop.

The backend is gloo on CPU (`DS_ACCELERATOR=cpu`, or no CUDA) and NCCL on GPU. DeepSpeed's
`init_distributed` reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*; we set them from whichever source
was found so that DeepSpeed and torch agree.
"""

from __future__ import annotations

import datetime
import os

from orchestrator.contract.client.ranks import DistEnv, dist_env_from, free_port  # noqa: F401 - the trainer's names


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
