"""The part of a trainer's start that needs no membership, paid in the warm standby before the go.

A relaunch inside the allocation keeps the layout (tp, pp, dp) and, on the nodes that survived,
each node's slot: the launcher puts a spare in the place of the node it replaces
(orchestrator/slurm/launcher: replace_nodes). So while the standby waits (trainer/standby.py) it
can already do what does not need the new process group:
- the config: run.yaml read and validated (the trainer reads the file again at the go and keeps
  this one only when the bytes are the same);
- the model: the units of this task's pipeline stage built for the rank it holds in the running
  launch (the allocation record's nodes), in host memory (the device is the running launch's). Their weights are a function of the
  config, the layout and the TP rank only (every parameter has its own seeded generator), so they
  are the units the trainer would build after the go. A spare's slot is unknown until the go: it
  builds nothing, and any task whose rank or layout turns out different builds after the go;
- the data index: the sample indices of data_cache/ memory-mapped (launch 0 built them).
The rendezvous, DeepSpeed's engine (its process groups, the broadcast of the model) and the load
stay after the go: they need the new membership.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract import ContractError, RunPaths
from orchestrator.contract.allocation import read_allocation


@dataclass
class PreparedStart:
    config_bytes: bytes  # run.yaml as it was read: a changed file at the go discards all of this
    cfg: Any  # the validated RunConfig
    rank: int | None = None  # the rank the units were built for; None: nothing built
    layout: Any = None  # the ParallelLayout they were built for
    units: dict = field(default_factory=dict)  # unit index -> built nn.Module (trainer/model/pipeline.py)
    datasets: tuple | None = None  # (train, valid) over data_cache/, or None: mapped after the go
    seconds: dict[str, float] = field(default_factory=dict)  # what the standby pre-paid, part by part

    def config_for(self, config_path: Path):
        """The prepared config when run.yaml is still the file it was read from, else None."""
        try:
            return self.cfg if config_path.read_bytes() == self.config_bytes else None
        except OSError:
            return None

    def units_for(self, layout, rank: int) -> dict:
        """The built units when `rank` of `layout` holds the same stage and TP slice, else {} (the
        data-parallel replicas of a unit are built alike)."""
        if self.rank is None or not self.units or layout != self.layout:
            return {}
        mine, built = layout.coords_of(rank), layout.coords_of(self.rank)
        return self.units if (mine[0], mine[2]) == (built[0], built[2]) else {}


def running_slot(run_dir: str, cfg, node: str, local_rank: int) -> int | None:
    """The rank this task's node holds in the launch that runs now (the allocation record the
    launcher wrote), which a surviving node keeps; None for a spare or without a record."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id or not node:
        return None
    try:
        record = read_allocation(RunPaths.of(run_dir, cfg.checkpoint.dir).allocation(job_id))
    except (ContractError, OSError, ValueError) as exc:
        print(f"[standby {node}/{local_rank}] the model is built after the go: {exc}", file=sys.stderr, flush=True)
        return None
    if record is None or node not in record.nodes:
        return None
    world = cfg.parallel.tp * cfg.parallel.pp * cfg.dp
    if world % len(record.nodes):
        return None
    return record.nodes.index(node) * (world // len(record.nodes)) + local_rank


def prepare(run_dir: str, node: str, local_rank: int) -> PreparedStart | None:
    """Config, this slot's units and the data index; None when the config cannot be read (the
    trainer then reports it after the go, as on a cold start). Anything else that fails here is
    left for after the go."""
    from orchestrator.plan.config import ConfigError, load_config

    started = time.time()
    paths = RunPaths.of(run_dir)
    try:
        config_bytes = paths.config.read_bytes()
        cfg = load_config(paths.config)
    except (OSError, ConfigError):
        return None
    prepared = PreparedStart(config_bytes, cfg)
    prepared.seconds["config"] = round(time.time() - started, 3)
    try:
        build_units(prepared, run_dir, node, local_rank)
    except Exception as exc:  # noqa: BLE001 - built after the go instead, where an error is reported as usual
        print(f"[standby {node}/{local_rank}] the model is built after the go: {exc}", file=sys.stderr, flush=True)
        prepared.units, prepared.rank = {}, None
    started = time.time()
    try:
        prepared.datasets = map_data_index(cfg, RunPaths.of(run_dir, cfg.checkpoint.dir))
    except Exception as exc:  # noqa: BLE001 - mapped after the go instead
        print(f"[standby {node}/{local_rank}] the data index is mapped after the go: {exc}", file=sys.stderr, flush=True)
    prepared.seconds["data_index"] = round(time.time() - started, 3)
    return prepared


def build_units(prepared: PreparedStart, run_dir: str, node: str, local_rank: int) -> None:
    """Built in host memory: until the go, the accelerator's memory is the running launch's (a
    stage's fp32 units are ~15 GB at BLOOM's layout); PipelineModule moves them to the device
    after the go, a copy at the host link's bandwidth, not the build."""
    from trainer.model.pipeline import build_stage_units
    from trainer.parallel.groups import ParallelLayout

    started = time.time()
    cfg = prepared.cfg
    rank = running_slot(run_dir, cfg, node, local_rank)
    if rank is None:
        return
    layout = ParallelLayout.from_config(cfg)
    units = build_stage_units(cfg, layout, rank)
    prepared.layout, prepared.rank, prepared.units = layout, rank, units
    prepared.seconds["model"] = round(time.time() - started, 3)


def map_data_index(cfg, paths: RunPaths):
    """(train, valid) from the cached indices, or None when they are not cached (built after the go)."""
    from trainer.data.index_cache import IndexCacheMissing
    from trainer.loop import build_split

    try:
        return build_split(cfg, paths, on_this_rank=False)
    except IndexCacheMissing:
        return None
