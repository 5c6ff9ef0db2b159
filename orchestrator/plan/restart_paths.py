"""What each restart path costs, in seconds, at the run's scale: the one table the planner's goodput
and the simulation both charge.

    paths = RestartPaths.of(cfg, checkpoint_bytes)
    paths.in_allocation_seconds()          # detection + start + load, a relaunch on a spare
    paths.job_level_seconds()              # detection + queue + cold start + shared load
    paths.start_seconds(standby=True)      # srun (or the standby's go) to the first step, no load
    paths.load_seconds(source)             # read + verify of the checkpoint from that copy

The paths:
- in the allocation, warm standby: a job with spares keeps the next launch's trainer warm
  (orchestrator/slurm/launcher, trainer/prepared_start.py: imports, config, model built, data
  index mapped); it still spends `recovery.standby_start_share` of a cold start (the rendezvous,
  the engine with its groups, the load). Measured on the local cluster (bench/results/recovery.json,
  one round): the relaunched trainer started in 1.18 s from the standby with the restore from local
  and buddy copies (0.53 s from the shared copy) against 10.62 s cold: 1.18 / 10.62 = 0.111, the
  larger of the two. Scaling rule: the standby pre-pays the same share of a start at BLOOM's scale
  as here;
- in the allocation, cold: `recovery.cold_start_minutes` (BLOOM: 45 s of imports from GPFS + 10 min
  of rendezvous of 384 ranks, 70-layer pipeline build and DeepSpeed engine: an assumption, no
  measurement at that scale exists here);
- job-level: the queue (`recovery.queue_wait_minutes`), then a cold start on new nodes, which
  have no local copy: the shared filesystem is read.
The loads (bytes / bandwidth; every node reads in parallel, so the slowest reader sets the time):
- shared: checkpoint bytes / aggregate bandwidth. Default: checkpoint bytes / checkpoint.save_seconds
  (BLOOM's operators measured ~300 s for 2.47 TB on Jean Zay's GPFS: 8.2 GB/s);
- memory: each rank reads its shard (bytes / ranks) from host memory at
  `memory_gb_per_second_per_rank` (6.6 GB/s measured from /dev/shm, bench/results/load_bandwidth.json);
- disk: each node reads its shards (bytes / nodes) from node-local NVMe at
  `disk_gb_per_second_per_node` (6.5 GB/s: a PCIe Gen4 NVMe drive's sequential read);
- peer: a replacement node fetches the lost node's shards (bytes / nodes) from its buddy at
  `network_gb_per_second_per_node` (40 GB/s: 4 x 100 Gb/s Omni-Path per node, BLOOM's paper, at 80%)
  while the other nodes read their own local copies; without a peer copy it reads them from the
  shared filesystem alone;
- then every rank hashes its shard against the manifest at `hash_gb_per_second_per_rank` (1.45 GB/s
  measured, one core), whatever the copy: a copy is trusted only once it verifies.
Detection, before any of it (the controller's bounds, configs' watchdog): a crash is seen at the
next pass (poll_seconds), a hang at floor + heartbeat + 2 polls; a host fault by the probe of the
quiet node (controller/probing.py): a lost node when its probe, asked a beat and a half-pass late
and a pass after that, times out, then a pass; a frozen one (HOST_FROZEN_SHARE) at dead_after + 2
polls; weighted by the published fault mix (Llama 3, Table 5, grouped: simulation/soak.py injects
it).
Not counted: the controller's decision and the launcher's step kill (a pass, ~1 s each).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

# Llama 3's interruptions by class (Dubey et al. 2024, Table 5, grouped), and how each is noticed.
FAULT_SHARES = {"gpu": 0.58, "software": 0.13, "network": 0.12, "host": 0.17}
# The host rows of Llama 3's Table 5: host maintenance 32, SSD 3, power supply 3, server chassis 2,
# CPU 2, system memory 2. Maintenance, power and chassis take the node away, and a failed SSD gets
# it drained: lost. A CPU or memory error may instead hang the processes while the node answers:
# frozen, at most those 4 of 44 (our reading of the table; it says nothing of how a node failed).
HOST_FROZEN_SHARE = 4 / 44
# The controller's probe of a quiet node (controller/timeouts.probe_after and probing.py use these):
# asked once a beat is half a pass later than a pass can see, bounded by this many seconds when the
# node does not answer.
PROBE_AFTER_POLLS, PROBE_TIMEOUT_SECONDS = 1.5, 10.0
IMPORT_SECONDS = 45.0  # of a cold start: srun to the first beat (python imports from GPFS)
STANDBY_GO_SECONDS = 0.2  # the warm standby polls its go file this often (trainer/standby.py)


class LoadSource(Enum):
    MEMORY = "memory"
    DISK = "disk"
    PEER = "peer"
    SHARED = "shared"


@dataclass(frozen=True)
class RestartPaths:
    checkpoint_bytes: int
    ranks: int
    nodes: int
    spares: int
    local_copy: str  # "none" | "memory" | "disk"
    peer_copy: bool
    shared_bytes_per_second: float
    memory_bytes_per_second_per_rank: float
    disk_bytes_per_second_per_node: float
    network_bytes_per_second_per_node: float
    hash_bytes_per_second_per_rank: float
    cold_start_seconds: float
    standby_start_share: float
    queue_wait_seconds: float
    detection_seconds_by_class: dict[str, float]

    @classmethod
    def of(cls, cfg: Any, checkpoint_bytes: int, spares: int | None = None) -> RestartPaths:
        r, c, w = cfg.recovery, cfg.cluster, cfg.watchdog
        shared = (
            r.shared_gb_per_second * 1e9
            if r.shared_gb_per_second
            else checkpoint_bytes / cfg.checkpoint.save_seconds
        )
        beat_and_polls = w.heartbeat_seconds + 2 * w.poll_seconds
        probe_after = w.heartbeat_seconds + PROBE_AFTER_POLLS * w.poll_seconds
        lost = probe_after + w.poll_seconds + PROBE_TIMEOUT_SECONDS + w.poll_seconds
        frozen = w.dead_after_seconds + 2 * w.poll_seconds
        return cls(
            checkpoint_bytes=int(checkpoint_bytes), ranks=c.gpus, nodes=c.nodes,
            spares=c.spare_nodes if spares is None else spares,
            local_copy=r.local_copy, peer_copy=r.peer_copy,
            shared_bytes_per_second=shared,
            memory_bytes_per_second_per_rank=r.memory_gb_per_second_per_rank * 1e9,
            disk_bytes_per_second_per_node=r.disk_gb_per_second_per_node * 1e9,
            network_bytes_per_second_per_node=r.network_gb_per_second_per_node * 1e9,
            hash_bytes_per_second_per_rank=r.hash_gb_per_second_per_rank * 1e9,
            cold_start_seconds=r.cold_start_minutes * 60, standby_start_share=r.standby_start_share,
            queue_wait_seconds=r.queue_wait_minutes * 60,
            detection_seconds_by_class={
                "gpu": w.poll_seconds, "software": w.poll_seconds,
                "network": w.progress_floor_seconds.step + beat_and_polls,
                "host": (1 - HOST_FROZEN_SHARE) * lost + HOST_FROZEN_SHARE * frozen,
            },
        )  # fmt: skip

    # -- starts ---------------------------------------------------------------------------------
    @property
    def standby(self) -> bool:
        """The launcher keeps a warm standby whenever a relaunch can follow: a job with spares."""
        return self.spares > 0

    def start_seconds(self, standby: bool) -> float:
        return self.cold_start_seconds * (self.standby_start_share if standby else 1.0)

    def import_seconds(self, standby: bool) -> float:
        """The part of a start before the first heartbeat (the simulation's launch)."""
        return STANDBY_GO_SECONDS if standby else min(IMPORT_SECONDS, self.cold_start_seconds / 2)

    # -- loads ----------------------------------------------------------------------------------
    def read_seconds(self, source: LoadSource) -> float:
        per_rank, per_node = self.checkpoint_bytes / self.ranks, self.checkpoint_bytes / self.nodes
        if source is LoadSource.MEMORY:
            return per_rank / self.memory_bytes_per_second_per_rank
        if source is LoadSource.DISK:
            return per_node / self.disk_bytes_per_second_per_node
        if source is LoadSource.PEER:
            return per_node / self.network_bytes_per_second_per_node
        return self.checkpoint_bytes / self.shared_bytes_per_second

    def verify_seconds(self) -> float:
        return self.checkpoint_bytes / self.ranks / self.hash_bytes_per_second_per_rank

    def load_seconds(self, source: LoadSource) -> float:
        return self.read_seconds(source) + self.verify_seconds()

    def in_allocation_load(self, local_copy_exists: bool = True) -> tuple[float, LoadSource]:
        """A relaunch on a spare: survivors read their local copy, the replacement node its buddy's
        replica (or, without one, its shards alone from the shared filesystem: one node's share at
        up to its own network link); the slowest reader sets the time. No local copy: shared."""
        if self.local_copy == "none" or not local_copy_exists:
            return self.load_seconds(LoadSource.SHARED), LoadSource.SHARED
        local = LoadSource.MEMORY if self.local_copy == "memory" else LoadSource.DISK
        if self.peer_copy:
            replacement = self.read_seconds(LoadSource.PEER)
        else:
            per_node = self.checkpoint_bytes / self.nodes
            replacement = per_node / min(self.shared_bytes_per_second, self.network_bytes_per_second_per_node)
        return max(self.read_seconds(local), replacement) + self.verify_seconds(), local

    # -- whole paths ----------------------------------------------------------------------------
    def detection_seconds(self) -> float:
        return sum(FAULT_SHARES[k] * s for k, s in self.detection_seconds_by_class.items())

    def in_allocation_seconds(self) -> float:
        return self.detection_seconds() + self.start_seconds(self.standby) + self.in_allocation_load()[0]

    def job_level_seconds(self) -> float:
        return (
            self.detection_seconds() + self.queue_wait_seconds + self.start_seconds(standby=False)
            + self.load_seconds(LoadSource.SHARED)
        )  # fmt: skip

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = {
            "detection_mean": self.detection_seconds(),
            "start_standby": self.start_seconds(True), "start_cold": self.start_seconds(False),
            **{f"load_{s.value}": self.load_seconds(s) for s in LoadSource},
            "verify": self.verify_seconds(),
            "in_allocation_load": self.in_allocation_load()[0],
            "in_allocation": self.in_allocation_seconds(), "job_level": self.job_level_seconds(),
        }  # fmt: skip
        return data
