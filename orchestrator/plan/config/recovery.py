"""`recovery:`: which restart paths a run has and the bandwidths that price them, for the planner
and the simulation (orchestrator/plan/restart_paths.py turns them into seconds, once).

The defaults are the figures orchestrator/plan/restart_paths.py states and sources: a measurement on
this project's machines (bench/results/load_bandwidth.json, bench/results/recovery.json) or a
published hardware figure of BLOOM's cluster. Replace them with your site's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .section import Section

GbPerSecond = Annotated[float, Field(gt=0.0, le=10_000.0)]


class RecoveryConfig(Section):
    # Where each node keeps its own shards of the newest checkpoint after a save (the trainer's
    # node-local copy): "memory" (host RAM, /dev/shm), "disk" (node-local NVMe), or "none" (every
    # restart reads the shared filesystem).
    local_copy: Literal["none", "memory", "disk"] = "none"
    # A buddy node in another failure domain holds a replica of each node's shards: a node that
    # replaces a lost one fetches them over the job's network instead of the shared filesystem.
    peer_copy: bool = False
    # Mean wait in the queue of a job-level restart (a new 48-node exclusive job). A site's figure.
    queue_wait_minutes: Annotated[float, Field(ge=0.0, le=7 * 24 * 60)] = 10.0
    # A cold start at the run's scale, srun to the first step without the checkpoint load: python
    # imports, rendezvous of every rank, model build, DeepSpeed engine. BLOOM: 45 s + 10 min.
    cold_start_minutes: Annotated[float, Field(gt=0.0, le=24 * 60)] = 10.75
    # The share of a cold start that a warm standby still spends (rendezvous and what depends on the
    # new membership); the standby pre-pays the rest. Measured on the local cluster: 1.18 s of 10.62 s.
    standby_start_share: Annotated[float, Field(gt=0.0, le=1.0)] = 0.111
    # Aggregate read bandwidth of the shared filesystem for a load; None: checkpoint bytes /
    # checkpoint.save_seconds (a load reads as fast as a save wrote).
    shared_gb_per_second: GbPerSecond | None = None
    # One rank reading its shard from host memory (measured: /dev/shm on this project's machine).
    memory_gb_per_second_per_rank: GbPerSecond = 6.6
    # One node reading its shards from node-local NVMe (a PCIe Gen4 NVMe drive's sequential read).
    disk_gb_per_second_per_node: GbPerSecond = 6.5
    # One node receiving a peer's replica over the job's network (4 x 100 Gb/s Omni-Path at 80%).
    network_gb_per_second_per_node: GbPerSecond = 40.0
    # One rank hashing its shard against the manifest before the first step (measured: sha256 on
    # one core of this project's machine).
    hash_gb_per_second_per_rank: GbPerSecond = 1.45

    @model_validator(mode="after")
    def _peer_needs_local(self) -> RecoveryConfig:
        if self.peer_copy and self.local_copy == "none":
            raise ValueError(
                "recovery.peer_copy: true needs recovery.local_copy 'memory' or 'disk': the buddy's "
                "replica is kept where its own copy is. Set local_copy, or peer_copy: false"
            )
        return self
