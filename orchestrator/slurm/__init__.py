"""SLURM layer: the Scheduler interface (`base`), real and mocked backends, sbatch rendering.

from orchestrator.slurm import get_scheduler
scheduler = get_scheduler()        # real SLURM; the mock only with RUNCTL_SCHEDULER=mock

The mock is never chosen by accident: a login node where `sbatch` is missing (SLURM's module not
loaded) is an error, not a silent dry run.
"""

from __future__ import annotations

import os
import shutil

from orchestrator.errors import UsageError

BACKENDS = ("slurm", "mock")
SCHEDULER_ENV = "RUNCTL_SCHEDULER"


def scheduler_name(name: str | None = None, require_sbatch: bool = True) -> str:
    """The backend to use: `name` (e.g. the CLI's --mock), else env RUNCTL_SCHEDULER, else slurm.
    Choosing slurm checks that `sbatch` is on PATH (UsageError saying what to load if not), unless
    `require_sbatch` is False (a dry run, which calls no SLURM tool)."""
    chosen = (name or os.environ.get(SCHEDULER_ENV) or "slurm").strip().lower()
    if chosen not in BACKENDS:
        raise UsageError(f"{SCHEDULER_ENV}={chosen!r}: choose one of {', '.join(BACKENDS)}")
    if chosen == "slurm" and require_sbatch and not shutil.which("sbatch"):
        raise UsageError(
            "`sbatch` is not on PATH, so no job can be submitted: load SLURM (`module load slurm`, or "
            "put SLURM's bin directory on PATH; for the local cluster `eval $(runctl cluster env)`), "
            f"or set {SCHEDULER_ENV}=mock for a dry run against the mocked SLURM (nothing runs)"
        )
    return chosen


def get_scheduler(name: str | None = None, **kwargs):  # -> Scheduler
    """A Scheduler instance. kwargs go to the backend: SlurmScheduler(env=, timeout=) or
    MockScheduler(directory=, execute=) (defaults: $RUNCTL_MOCK_SLURM_DIR, its config.json)."""
    if scheduler_name(name) == "slurm":
        from .real import SlurmScheduler

        return SlurmScheduler(**kwargs)
    from .mock import MockScheduler

    return MockScheduler(**kwargs)
