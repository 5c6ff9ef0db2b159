"""`python -m trainer.standby --go FILE -- python -m trainer RUN_DIR`: a warm rank for the next launch.

Most of a trainer's start is importing torch, DeepSpeed and the model code (seconds per process,
more when 8 ranks of a node import at once). The job launcher (orchestrator/slurm/launcher)
therefore keeps the next launch warm: once a launch trains, it starts a standby srun step with G
tasks on every usable node of the allocation (the running launch's nodes and the spares, `--overlap`:
they only wait). Each standby task imports the trainer, prepares what of the start needs no
membership (trainer/prepared_start.py: the config, its stage's model, the data index), then
waits for the launcher's go file
(orchestrator.contract.allocation.StandbyGo), written only after the controller decided a relaunch. A task whose node is in `nodes` becomes rank
index(node) x G + SLURM_LOCALID of launch K (the SLURM_* layout variables are rewritten to the
launch's, so trainer.launch reads them as for any srun) and runs the trainer in this process; a
task whose node is not (left out, or a spare not needed) exits 0 (the step runs with srun
--wait=0, so an early exit does not end the others). The go file is read like any file of the run
directory: the owner's, regular, bounded.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

from orchestrator.contract import ContractError
from orchestrator.contract.allocation import StandbyGo, read_standby_go

POLL_SECONDS = 0.2
# Imported by DeepSpeed's engine set-up on first use (its optimizer check, MoE and pipeline parts).
LAZY_MODULES = (
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "deepspeed.runtime.pipe.engine",
    "deepspeed.moe.layer",
    "deepspeed.module_inject",
    "deepspeed.ops",
    "torch.profiler",
    "orchestrator.plan.config",
    "trainer.data",
    "trainer.model",
    "trainer.parallel",
    "trainer.local_save",  # a restore from node-local and buddy copies (checkpoint.local_dir)
    "trainer.restore_order",
)


def warm_up() -> None:
    """Import what a trainer process imports before its first step (the expensive part): the
    modules, and what DeepSpeed's engine and torch's optimizers import lazily on first use
    (torch._dynamo with sympy and networkx, DeepSpeed's optimizer checks: over 1,500 modules,
    more than half of a CPU rank's start), by using them once on a one-element parameter."""
    import importlib

    import deepspeed  # noqa: F401
    import torch
    import torch._dynamo  # noqa: F401 - what an optimizer's constructor pulls in

    import bloom_kernels  # noqa: F401
    import trainer.engine  # noqa: F401
    import trainer.loop  # noqa: F401

    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    for lazy in LAZY_MODULES:  # DeepSpeed's engine imports these on first use; versions differ
        try:
            importlib.import_module(lazy)
        except ImportError:
            pass


def ready_dir(go_file: Path) -> Path:
    """Where each standby task says it is warm (one empty file per task): RunPaths.standby_ready."""
    return go_file.with_name(go_file.name + ".ready")


def layout(go: StandbyGo, node: str, local_rank: int) -> dict[str, str] | None:
    """The SLURM layout variables of this task in launch `go.launch`; None when its node is not
    one of the launch's."""
    if local_rank >= go.tasks_per_node:
        raise ContractError(f"go file: tasks_per_node {go.tasks_per_node} does not fit local rank {local_rank}")
    if node not in go.nodes:
        return None
    index = go.nodes.index(node)
    per_node = go.tasks_per_node
    return {
        "SLURM_PROCID": str(index * per_node + local_rank),
        "SLURM_NTASKS": str(len(go.nodes) * per_node),
        "SLURM_NPROCS": str(len(go.nodes) * per_node),
        "SLURM_NNODES": str(len(go.nodes)),
        "SLURM_NODEID": str(index),
        "MASTER_ADDR": go.master_addr,
        "MASTER_PORT": str(go.master_port),
        "RUNCTL_LAUNCH": str(go.launch),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 6 or argv[0] != "--go" or argv[2] != "--" or argv[4:6] != ["-m", "trainer"] or len(argv) != 7:
        print("usage: python -m trainer.standby --go FILE -- PYTHON -m trainer RUN_DIR", file=sys.stderr)
        return 2
    go_file, run_dir = Path(argv[1]), argv[6]
    warm_up()
    # What the imports left on the heap is never garbage: out of the collector's sight, DeepSpeed's
    # forced collections while it builds the engine (six, each walking every object: 1.5 s of a
    # CPU rank's engine set-up here) see only what the start creates.
    gc.freeze()
    node, local_rank = os.environ.get("SLURMD_NODENAME", ""), int(os.environ.get("SLURM_LOCALID", "0"))
    from trainer.prepared_start import prepare

    prepared = prepare(run_dir, node, local_rank)
    if prepared is not None:
        print(f"[standby {node}/{local_rank}] prepared (s): {prepared.seconds}"
              f"{f', units of rank {prepared.rank}' if prepared.units else ''}", file=sys.stderr, flush=True)
    ready = ready_dir(go_file)
    ready.mkdir(exist_ok=True)
    (ready / f"{node}-{local_rank}").touch()  # the launcher counts these: the standby is warm
    while True:
        try:
            go = read_standby_go(go_file)
        except ContractError as exc:
            print(f"[standby {node}/{local_rank}] refusing the go file: {exc}", file=sys.stderr, flush=True)
            return 1  # never train on a file someone else wrote: this launch fails, and is decided again
        if go is not None:
            break
        time.sleep(POLL_SECONDS)
    try:
        variables = layout(go, node, local_rank)
    except ContractError as exc:
        print(f"[standby {node}/{local_rank}] {exc}", file=sys.stderr, flush=True)
        return 1
    if variables is None:
        return 0  # not needed in this launch
    os.environ.update(variables)
    from trainer.__main__ import main as trainer_main

    return trainer_main([run_dir], prepared)


if __name__ == "__main__":
    from orchestrator.contract.filemodes import owner_umask

    with owner_umask():  # first: the trainer it then runs in this process writes under it too
        code = main()
    # os._exit as in trainer.__main__: background threads must not turn the exit code into a hang.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
