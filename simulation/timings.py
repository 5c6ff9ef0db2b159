"""How long things take in the simulated run: BLOOM's timings, from the config and the planner.

Every figure is derived here, once, and written into the soak's output:
- step: `plan_run(cfg).seconds_per_iteration` (104.7 s for bloom-176b.yaml: hardware FLOPs per
  iteration / (384 GPUs x 149.8 achieved TFLOPs));
- save every `checkpoint.interval_hours` (3 h, about 103 steps), time-based as the trainer does;
- checkpoint size: the planner's `checkpoint_bytes` (bf16 weights + fp32 master + Adam: 2.47 TB);
- save time = size / filesystem bandwidth. The bandwidth is `checkpoint_bytes /
  checkpoint.save_seconds` (2.47 TB / 300 s = 8.2 GB/s aggregate over 48 nodes): the config's
  save_seconds is what BLOOM's operators measured on Jean Zay's GPFS, so the simulated save takes
  what the planner assumes;
- start and load of each restart path (`paths`): orchestrator/plan/restart_paths.py, the table the
  planner prices restarts with: a relaunch on a spare starts from the warm standby (when the
  launch before it trained: the launcher starts the standby then) and loads from the local and
  peer copies (when this job saved the checkpoint it resumes from: copies are made at a save);
  a new job starts cold and loads from the shared filesystem;
- eval every `data.eval_interval` steps, before a save due at the same step (trainer/loop.py's
  order), taking the planner's `eval_seconds`: `data.eval_iters` forward-only iterations, a
  quarter of a training step each for BLOOM (a step does forward, backward and the activation
  recompute: 4 forwards' FLOPs);
- queue wait for a 48-node exclusive job: exponential, mean `recovery.queue_wait_minutes` (10 min,
  an assumption);
- SLURM declares a silent node dead after SlurmdTimeout = 300 s (SLURM's default);
- the login node hashes a checkpoint at 1 GB/s (one thread reading GPFS and computing sha256);
- a node SLURM declared DOWN is back in service after 4 to 72 h, drawn uniformly (an admin
  reboots it, or replaces a part; an assumption);
- async saves (`checkpoint.async_save`): training stalls for the planner's `save_stall_seconds`
  (4.9 s for bloom-176b.yaml: 13.9 GB of host snapshot per rank / checkpoint.snapshot_gb_per_second
  = 5.7 GB/s, plus the probe batch's forward, 2.5 s), the write takes save_seconds in the
  background; a slow filesystem slows the write, not the stall.
Each duration gets seeded multiplicative noise (`noise(kind)`).
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.plan.config.slurm_time import slurm_time_seconds
from orchestrator.plan.planner import plan_run
from orchestrator.plan.restart_paths import LoadSource, RestartPaths


@dataclass(frozen=True)
class Timings:
    step_seconds: float
    save_interval_seconds: float
    checkpoint_bytes: int
    fs_bandwidth_bytes_per_second: float
    save_seconds: float
    load_seconds: float  # from the shared filesystem (a job-level restart)
    init_seconds: float  # of a cold start, after its imports
    launch_seconds: float  # srun to the first beat (python imports) of a cold start
    eval_every_steps: int
    eval_seconds: float
    queue_wait_mean_seconds: float
    slurmd_timeout_seconds: float
    login_hash_bytes_per_second: float
    exit_duration_seconds: float  # the trainer's own time budget per job
    time_limit_seconds: float
    pre_timeout_seconds: float
    heartbeat_seconds: float
    repair_seconds: tuple[float, float] = (4 * 3600.0, 72 * 3600.0)
    async_stall_seconds: float | None = None  # None: synchronous saves
    relative_noise: float = 0.02
    paths: RestartPaths | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> Timings:
        plan = plan_run(cfg)
        size = int(plan.checkpoint_bytes)
        save = float(cfg.checkpoint.save_seconds)
        bandwidth = size / save
        interval_hours = cfg.checkpoint.interval_hours
        if interval_hours is None:
            interval_hours = (cfg.checkpoint.interval_steps or 100) * plan.seconds_per_iteration / 3600
        step = float(plan.seconds_per_iteration)
        paths = RestartPaths.of(cfg, size)
        return cls(
            step_seconds=step,
            save_interval_seconds=interval_hours * 3600,
            checkpoint_bytes=size,
            fs_bandwidth_bytes_per_second=bandwidth,
            save_seconds=size / bandwidth,
            load_seconds=paths.load_seconds(LoadSource.SHARED),
            init_seconds=paths.start_seconds(standby=False) - paths.import_seconds(standby=False),
            launch_seconds=paths.import_seconds(standby=False),
            eval_every_steps=int(cfg.data.eval_interval),
            eval_seconds=float(plan.eval_seconds),
            queue_wait_mean_seconds=paths.queue_wait_seconds,
            slurmd_timeout_seconds=300.0,
            login_hash_bytes_per_second=1e9,
            exit_duration_seconds=float(cfg.checkpoint.exit_duration_minutes or 1e9) * 60,
            time_limit_seconds=parse_time_limit(cfg.cluster.time_limit),
            pre_timeout_seconds=float(cfg.cluster.pre_timeout_seconds or 0),
            heartbeat_seconds=float(cfg.watchdog.heartbeat_seconds),
            async_stall_seconds=float(plan.save_stall_seconds) if cfg.checkpoint.async_save else None,
            paths=paths,
        )

    def noisy(self, rng: random.Random, seconds: float, relative: float | None = None) -> float:
        """`seconds` with seeded Gaussian noise (clipped to +-3 sigma, never below 10%)."""
        sigma = self.relative_noise if relative is None else relative
        factor = 1.0 + max(-3 * sigma, min(3 * sigma, rng.gauss(0.0, sigma)))
        return max(0.1 * seconds, seconds * factor)

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["paths"] = self.paths.describe() if self.paths is not None else None
        data["fs_bandwidth_gb_per_second"] = round(self.fs_bandwidth_bytes_per_second / 1e9, 2)
        data["checkpoint_tb"] = round(self.checkpoint_bytes / 1e12, 3)
        return data


def parse_time_limit(text: str | None) -> float:
    """A SLURM time value in seconds; none: effectively forever."""
    return float(slurm_time_seconds(text)) if text else math.inf
