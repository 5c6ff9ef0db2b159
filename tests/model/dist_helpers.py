"""Run a function on N real gloo processes (torch.multiprocessing), for the distributed tests."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_gloo(world: int, fn: Callable, *args) -> None:
    """fn(rank, world, *args) on `world` processes with a gloo group; raises if any process fails.
    `fn` must be a module-level function (it is pickled into the spawned processes)."""
    mp.spawn(_entry, args=(world, free_port(), fn, args), nprocs=world, join=True)
