"""What the controller remembers between passes that state.json does not hold: what it has seen
of the ranks (liveness, on its own monotonic clock), the hang limits it learned of the running launch,
straggler scores, metrics.jsonl as far as it was read (training health), and what it has already
said (so that each thing is said once)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract.checkpoints import ManifestsSeen

from .liveness import Liveness
from .metrics_follower import MetricsFollower
from .probing import NodeProber
from .stalls import StallWatch
from .stragglers import StragglerWatch
from .timeouts import PhaseTimeouts, silent_after

NOT_ASKED = -1  # planned_bytes before the planner was asked


@dataclass
class Memory:
    liveness: Liveness
    timeouts: PhaseTimeouts
    stragglers: StragglerWatch
    timeouts_launch: tuple | None = None  # (job, incarnation) `timeouts` were learned from
    job_wide_since: float | None = None  # monotonic: when most ranks stopped beating at once
    scheduler_down_since: float | None = None  # monotonic: when slurmctld stopped answering
    missing_passes: dict[str, int] = field(
        default_factory=dict
    )  # job -> passes in a row SLURM did not list it
    missing_since: dict[str, float] = field(default_factory=dict)  # job -> monotonic: first of those passes
    stalls: StallWatch | None = None  # node stalls (stalls.py): made by the supervisor from the config
    planned_bytes: int | None = NOT_ASKED  # the planner's estimate of a checkpoint's size
    manifests_seen: ManifestsSeen = field(default_factory=dict)  # checkpoints.list_checkpoints' cache
    checkpoints_seen: set[int] | None = None  # None: not listed yet (no events for older ones)
    training_seen: set[str] = field(default_factory=set)  # "<job>/<launch>" whose job_training is written
    allocation_errors: set[str] = field(default_factory=set)  # jobs whose unreadable allocation.json was said
    node_beat_age: dict[str, float] = field(default_factory=dict)  # for controller.json (the dashboard)
    job_dirs_checked: set[str] | None = None  # jobs/<id>/ the trust check has seen (None: not listed yet)
    metrics: MetricsFollower | None = None  # made at the first look at metrics.jsonl
    prober: NodeProber = field(default_factory=NodeProber)  # silent nodes asked (probing.py)

    @classmethod
    def fresh(cls, watchdog: Any) -> Memory:
        return cls(
            Liveness(silent_after(watchdog)), PhaseTimeouts.from_watchdog(watchdog), StragglerWatch(watchdog)
        )
