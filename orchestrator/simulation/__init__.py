"""BLOOM at full scale on a virtual clock: the real controller against a simulated SLURM and 384
simulated ranks that write real heartbeat files and real (sparse) checkpoints into a real run
directory. clock.py (time), timings.py (BLOOM's durations), slurm.py (the scheduler), trainer.py
(one job's ranks), world.py (events, faults, the time ledger), harness.py (controller passes),
scenarios.py (named faults as policy), soak.py (a month of faults at a published rate).
Stdlib only, beyond what orchestrator.config already imports."""

from .clock import VirtualClock
from .harness import Harness, bloom_config
from .timings import Timings

__all__ = ["Harness", "Timings", "VirtualClock", "bloom_config"]
