"""BLOOM at full scale on a virtual clock: the real controller against a simulated SLURM and 384
simulated ranks that write real heartbeat files, launcher records and (sparse) checkpoints into a
real run directory, through the contract's own types and writers (orchestrator.contract), so the
simulation cannot drift from what the trainer and the launcher write.

clock.py (time), timings.py (BLOOM's durations), slurm.py (the scheduler), incarnation.py (one
launch's ranks), checkpoints.py (saves and resumes), world.py (events, faults, the time ledger),
harness.py (controller passes), scenarios.py and runner.py (named faults as policy), soak.py (a
month of faults at a published rate). For tests and benchmarks only: `pip install .` does not
ship it (setup.cfg packages orchestrator, trainer and bloom_kernels)."""

from .clock import VirtualClock
from .harness import Harness, bloom_config
from .timings import Timings

__all__ = ["Harness", "Timings", "VirtualClock", "bloom_config"]
