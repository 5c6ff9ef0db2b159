"""`checkpoint:`: where and how often the run saves, async saves, the probe check after a load and
the node-local copies."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from .section import Section
from .value_types import NodeName, PositiveFloat, PositiveInt, SafePath


class CheckpointConfig(Section):
    # Relative paths are inside the run directory; the default is the contract's checkpoints/.
    dir: SafePath = "checkpoints"
    interval_hours: PositiveFloat | None = 3.0
    interval_steps: PositiveInt | None = None
    # Re-fit interval_hours during the run to Young/Daly from the failures seen (the planner's MTBF
    # as the prior) and the measured save stall (orchestrator/controller/interval.py): "suggest"
    # records it in an event, "apply" also tells the trainer (its next save uses it). Always
    # within [min_interval_hours, max_interval_hours].
    adaptive_interval: Literal["off", "suggest", "apply"] = "off"
    min_interval_hours: PositiveFloat = 0.25
    max_interval_hours: PositiveFloat = 12.0
    keep_last: PositiveInt = 5
    # Megatron's --exit-duration-in-mins: stop and save this long after the job started.
    exit_duration_minutes: PositiveFloat | None = None
    # Expected save time, for the planner's Young/Daly interval (measured ones replace it).
    save_seconds: PositiveFloat = 300.0
    # Snapshot to host memory at the save point and write in the background (trainer.async_checkpoint):
    # training stalls for the copy, not the write. Costs host RAM (the planner checks it fits).
    async_save: bool = False
    # One GPU's device-to-host copy rate in an async save, GB/s (1e9 bytes): the planner and the
    # simulation price an async save's training stall as the biggest stage's snapshot bytes per rank
    # / this (plus the probe's forward, verify_probe). 5.7 = bench/results/async_checkpoint_gpu.json,
    # one H200, model "xl" (2175 MB checkpoint), median async stall 0.383 s: the slower of its two
    # models ("large", 382 MB: 0.014 s). It is conservative: that median includes a 0.34 s wait for
    # the previous background write, and the bare copies ran at 27-49 GB/s over the H200's PCIe
    # Gen5. An A100's PCIe Gen4 x16 (~25 GB/s each way) is not the limit at 5.7 GB/s; replace it with
    # your cluster's measured rate.
    snapshot_gb_per_second: PositiveFloat = 5.7
    # At each save, the loss and logits digest of a fixed probe batch computed by the model being
    # saved go into the checkpoint; after a load they must be computed again (trainer/probe.py), or
    # the checkpoint is damaged and the one before is used. Costs one forward micro-batch per save
    # and per load.
    verify_probe: bool = True
    # Node-local copies (trainer/local_copies.py): at each async save every node also keeps its
    # ranks' files of the newest checkpoint here (an absolute path on node-local storage: /dev/shm,
    # NVMe) and a replica of its buddy's, so that a relaunch inside the allocation loads from them
    # instead of the shared filesystem. The shared copy stays the source of truth. Costs this much
    # node-local space: about twice a node's share of a checkpoint. None: off.
    local_dir: SafePath | None = None
    # The buddy ring: the node `peer_offset` places after a node in the launch's node order keeps
    # its replica (the next one whose failure domain differs, when `failure_domains` is given).
    peer_offset: PositiveInt = 1
    # Nodes that fail together (e.g. those under one leaf switch or in one rack): a buddy is taken
    # outside a node's own group whenever the launch has a node there.
    failure_domains: list[list[NodeName]] = []

    @model_validator(mode="after")
    def _some_cadence(self) -> CheckpointConfig:
        if self.interval_hours is None and self.interval_steps is None:
            raise ValueError(
                "set interval_hours and/or interval_steps: a run without checkpoints loses everything"
            )
        if self.min_interval_hours > self.max_interval_hours:
            raise ValueError(
                f"checkpoint.min_interval_hours = {self.min_interval_hours:g} is above max_interval_hours = "
                f"{self.max_interval_hours:g}: the adaptive interval must fit between them. Swap or widen them"
            )
        if self.adaptive_interval != "off" and self.interval_hours is None:
            raise ValueError(
                f"checkpoint.adaptive_interval = {self.adaptive_interval!r} re-fits interval_hours, which is "
                "not set: set interval_hours (the starting interval), or adaptive_interval: off"
            )
        return self

    @model_validator(mode="after")
    def _local_copies_need_async_save(self) -> CheckpointConfig:
        if self.local_dir is None:
            return self
        if not self.local_dir.startswith("/"):
            raise ValueError(
                f"local_dir {self.local_dir!r} must be an absolute path on node-local storage "
                "(e.g. /dev/shm/ckpt or /nvme/ckpt): a relative one would land on the shared filesystem"
            )
        if not self.async_save:
            raise ValueError(
                "local_dir needs async_save: true (the local copies are written from the async "
                "save's host snapshot); set async_save: true, or remove local_dir"
            )
        seen: dict[str, int] = {}
        for index, group in enumerate(self.failure_domains):
            for node in group:
                if node in seen:
                    raise ValueError(
                        f"failure_domains: node {node} is in group {seen[node]} and group {index}: "
                        "give each node one group"
                    )
                seen[node] = index
        return self
